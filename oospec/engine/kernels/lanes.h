// 16 float32 lanes with one arithmetic on every instruction set: one zmm (AVX-512), two ymm (AVX2), or an
// array (scalar). Shared by invariant.cpp and the linear kernels (linear.h); see invariant.cpp for why the order matters.
#pragma once

#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace oospec {

using bf16 = c10::BFloat16;

inline float to_float(float x) { return x; }
inline float to_float(bf16 x) { return static_cast<float>(x); }
template <class T> inline T from_float(float x);
template <> inline float from_float<float>(float x) { return x; }
template <> inline bf16 from_float<bf16>(float x) { return bf16(x); }  // round to nearest even, as torch

// ---- 16 float32 lanes: one zmm, two ymm, or an array, with the same arithmetic -------------------------
// max16(a, b) is (a > b ? a : b) and min16(a, b) is (a < b ? a : b) per lane, as MAXPS/MINPS (b when either is
// NaN); round16 rounds to nearest even (nearbyint in the default mode); pow2i16(n) is 2^n for integral n in
// [-126, 127] (the exponent field built directly).
#if defined(__AVX512F__)
struct V16 { __m512 v; };
inline V16 zero16() { return {_mm512_setzero_ps()}; }
inline V16 load16(const float* p) { return {_mm512_loadu_ps(p)}; }
inline V16 load16(const bf16* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
}
inline V16 fma16(V16 a, V16 b, V16 acc) { return {_mm512_fmadd_ps(a.v, b.v, acc.v)}; }
inline V16 bcast16(float x) { return {_mm512_set1_ps(x)}; }
inline void store16(float* p, V16 a) { _mm512_storeu_ps(p, a.v); }
inline V16 add16(V16 a, V16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V16 sub16(V16 a, V16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline V16 mul16(V16 a, V16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V16 div16(V16 a, V16 b) { return {_mm512_div_ps(a.v, b.v)}; }
inline V16 max16(V16 a, V16 b) { return {_mm512_max_ps(a.v, b.v)}; }
inline V16 min16(V16 a, V16 b) { return {_mm512_min_ps(a.v, b.v)}; }
inline V16 round16(V16 a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
inline V16 pow2i16(V16 n) {
  const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(e, 23))};
}
inline float hsum16(V16 a) {
  __m256 lo = _mm512_castps512_ps256(a.v);
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1));
  __m256 s8 = _mm256_add_ps(lo, hi);                                            // l + (l+8)
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));  // l + (l+4)
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                             // l + (l+2)
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));               // 0 + 1
}
#elif defined(__AVX2__) && defined(__FMA__)
struct V16 { __m256 lo, hi; };
inline V16 zero16() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V16 load16(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline __m256 widen8(const bf16* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline V16 load16(const bf16* p) { return {widen8(p), widen8(p + 8)}; }
inline V16 fma16(V16 a, V16 b, V16 acc) { return {_mm256_fmadd_ps(a.lo, b.lo, acc.lo), _mm256_fmadd_ps(a.hi, b.hi, acc.hi)}; }
inline V16 bcast16(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline void store16(float* p, V16 a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
inline V16 add16(V16 a, V16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V16 sub16(V16 a, V16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline V16 mul16(V16 a, V16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V16 div16(V16 a, V16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline V16 max16(V16 a, V16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline V16 min16(V16 a, V16 b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
inline V16 round16(V16 a) {
  constexpr int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(a.lo, mode), _mm256_round_ps(a.hi, mode)};
}
inline __m256 pow2i8(__m256 n) {
  const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}
inline V16 pow2i16(V16 n) { return {pow2i8(n.lo), pow2i8(n.hi)}; }
inline float hsum16(V16 a) {
  __m256 s8 = _mm256_add_ps(a.lo, a.hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
#else
struct V16 { float v[16]; };
inline V16 zero16() { V16 a; for (int l = 0; l < 16; ++l) a.v[l] = 0.f; return a; }
template <class T> inline V16 load16(const T* p) { V16 a; for (int l = 0; l < 16; ++l) a.v[l] = to_float(p[l]); return a; }
inline V16 fma16(V16 a, V16 b, V16 acc) { for (int l = 0; l < 16; ++l) acc.v[l] = std::fma(a.v[l], b.v[l], acc.v[l]); return acc; }
inline V16 bcast16(float x) { V16 a; for (int l = 0; l < 16; ++l) a.v[l] = x; return a; }
inline void store16(float* p, V16 a) { for (int l = 0; l < 16; ++l) p[l] = a.v[l]; }
#define OOSPEC_LANEWISE(name, expr) \
  inline V16 name(V16 a, V16 b) { V16 c; for (int l = 0; l < 16; ++l) { const float x = a.v[l], y = b.v[l]; c.v[l] = (expr); } return c; }
OOSPEC_LANEWISE(add16, x + y)
OOSPEC_LANEWISE(sub16, x - y)
OOSPEC_LANEWISE(mul16, x * y)
OOSPEC_LANEWISE(div16, x / y)
OOSPEC_LANEWISE(max16, x > y ? x : y)
OOSPEC_LANEWISE(min16, x < y ? x : y)
#undef OOSPEC_LANEWISE
inline V16 round16(V16 a) { for (int l = 0; l < 16; ++l) a.v[l] = std::nearbyint(a.v[l]); return a; }
inline V16 pow2i16(V16 n) {
  V16 c;
  for (int l = 0; l < 16; ++l) {
    const int32_t bits = (static_cast<int32_t>(n.v[l]) + 127) << 23;
    std::memcpy(&c.v[l], &bits, sizeof(float));
  }
  return c;
}
inline float hsum16(V16 a) {
  float s8[8], s4[4], s2[2];
  for (int l = 0; l < 8; ++l) s8[l] = a.v[l] + a.v[l + 8];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  for (int l = 0; l < 2; ++l) s2[l] = s4[l] + s4[l + 2];
  return s2[0] + s2[1];
}
#endif

// 16 pairs of bfloat16 at p, as float32: odd[l] = p[2l+1], even[l] = p[2l] (a bfloat16 is a float32's top half).
#if defined(__AVX512F__)
inline void widen_pairs(const bf16* p, V16& odd, V16& even) {
  const __m512i v = _mm512_loadu_si512(p);
  odd = {_mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int32_t(0xFFFF0000u))))};
  even = {_mm512_castsi512_ps(_mm512_slli_epi32(v, 16))};
}
#elif defined(__AVX2__) && defined(__FMA__)
inline void widen_pairs(const bf16* p, V16& odd, V16& even) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
  const __m256i top = _mm256_set1_epi32(int32_t(0xFFFF0000u));
  odd = {_mm256_castsi256_ps(_mm256_and_si256(lo, top)), _mm256_castsi256_ps(_mm256_and_si256(hi, top))};
  even = {_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16))};
}
#else
inline void widen_pairs(const bf16* p, V16& odd, V16& even) {
  for (int l = 0; l < 16; ++l) { odd.v[l] = to_float(p[2 * l + 1]); even.v[l] = to_float(p[2 * l]); }
}
#endif

}  // namespace oospec
