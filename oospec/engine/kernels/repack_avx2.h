// repack.h's fill_panel with AVX2 spelled out, for the processors whose best kernels are AVX2 (AMD EPYC without
// AVX-512): the same weights and bits for the 4- and 8-bit types (Q4_0, Q4_1, Q4_K, Q8_0, Q6_K); the 5-bit types
// keep the plain loops.
//
// Why: the plain loops vectorize poorly (a 4-bit quant's row is a byte of another row's k), and on AVX2 making a
// panel cost ~6x the product over it: a 1.5B Q4_K_M decode step took ~450 ms on two cores where llama.cpp's takes
// ~65. Here the 8 rows of a 4-bit plane (32 k each) are transposed to k-major bytes with 24 unpacks, and each k's
// 16 weights are two 8-lane vectors: the expression of repack.h's top comment, in its order (a * q is exact for
// these types, so a * q - b in one fused rounding is the separate subtract's bits, as the AVX-512 fill argues).
// bfloat16 pairs are rounded as torch rounds (the integer form: every weight is finite).
// Included by repack.h after its formats and plain loops (which it uses), before the dispatch (which uses it).
#pragma once

#include <immintrin.h>

namespace oospec::repack {

inline __m256 halves8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

inline __m256i bytes8(const uint8_t* p, bool is_signed) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return is_signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
}

// The 4-bit plane (8 rows rr x 32 k bytes) as k-major bytes: byte rr of k at t + offset4(k).
inline void transpose_plane4(const uint8_t* plane, uint8_t* t) {
  __m256i r[8], a[8], b[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(plane + 32 * i));
  for (int i = 0; i < 4; ++i) {  // words (rr, rr + 1) of k 0-7 | 16-23, then of k 8-15 | 24-31
    a[2 * i] = _mm256_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm256_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h)  // 32-bit (rr .. rr + 3) of k in fours; h: rows 0-3 or 4-7
    for (int s = 0; s < 2; ++s) {
      b[4 * h + 2 * s] = _mm256_unpacklo_epi16(a[4 * h + s], a[4 * h + 2 + s]);
      b[4 * h + 2 * s + 1] = _mm256_unpackhi_epi16(a[4 * h + s], a[4 * h + 2 + s]);
    }
  for (int j = 0; j < 4; ++j) {  // 64-bit rows 0-7 of k in pairs
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(t + 64 * j), _mm256_unpacklo_epi32(b[j], b[4 + j]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(t + 64 * j + 32), _mm256_unpackhi_epi32(b[j], b[4 + j]));
  }
}

// Where transpose_plane4 put k: vector k % 16 / 2 (lane k / 16), element k % 2.
constexpr int offset4(int k) { return 32 * (k % 16 / 2) + 16 * (k / 16) + 8 * (k % 2); }

inline __m256i bf16_round8(__m256 w) {  // the bfloat16 bits in the low half of each lane
  const __m256i u = _mm256_castps_si256(w);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd), 16);
}

template <int Type, bool Pairs>
inline void fill_panel_avx2(const uint8_t* panel, int64_t k0, int64_t k1, void* out) {
  constexpr Format f = format(Type);
  if constexpr (f.bits == 5) {
    fill_panel<Type, Pairs>(panel, k0, k1, out);
    return;
  }
  constexpr int G = f.group;
  const auto weight = [](__m256 a, __m256i q, __m256 b) {
    constexpr Format f = format(Type);
    if constexpr (f.b_mode == 0) return _mm256_fmsub_ps(a, _mm256_cvtepi32_ps(q), b);
    else if constexpr (f.b_mode == 1) return _mm256_mul_ps(a, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(f.offset))));
    else return _mm256_mul_ps(a, _mm256_cvtepi32_ps(q));
  };
  // k (relative to k0) and k + 1: rows 0-7 (w[0]) and 8-15 (w[1]) of each
  const auto emit = [out](int64_t k, const __m256* w, const __m256* w1) {
    if constexpr (Pairs) {
      uint32_t* o = static_cast<uint32_t*>(out) + (k / 2) * 16;
      for (int h = 0; h < 2; ++h)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 8 * h),
                            _mm256_or_si256(bf16_round8(w[h]), _mm256_slli_epi32(bf16_round8(w1[h]), 16)));
    } else {
      float* o = static_cast<float*>(out) + k * 16;
      for (int h = 0; h < 2; ++h) {
        _mm256_storeu_ps(o + 8 * h, w[h]);
        _mm256_storeu_ps(o + 16 + 8 * h, w1[h]);
      }
    }
  };
  __m256 d[2] = {}, hd[2] = {};
  alignas(32) uint8_t t[256];
  for (int64_t g0 = k0; g0 < k1; g0 += G) {
    const uint8_t* sb = panel + g0 / f.super * f.super_bytes();
    const int64_t gi = g0 % f.super / G;
    if (gi == 0 || g0 == k0)
      for (int h = 0; h < 2; ++h) {
        d[h] = halves8(sb + 16 * h);
        if constexpr (f.header == 2) hd[h] = halves8(sb + 32 + 16 * h);
      }
    const uint8_t* grp = sb + 32 * f.header + gi * f.group_bytes();
    for (int64_t line = 0; line < f.group_bytes(); line += 64) __builtin_prefetch(grp + PREFETCH_BYTES + line, 0, 2);
    __m256 a[2] = {d[0], d[1]}, b[2] = {hd[0], hd[1]};
    for (int h = 0; h < 2; ++h) {
      if constexpr (f.subscales >= 1) a[h] = _mm256_mul_ps(d[h], _mm256_cvtepi32_ps(bytes8(grp + 8 * h, f.subscales == 1)));
      if constexpr (f.subscales == 2) b[h] = _mm256_mul_ps(hd[h], _mm256_cvtepi32_ps(bytes8(grp + 16 + 8 * h, false)));
    }
    const uint8_t* plane = grp + 16 * f.subscales;
    if constexpr (f.bits == 4) {
      transpose_plane4(plane, t);
      for (int k = 0; k < G; k += 2) {
        __m256 w[2][2];
        for (int e = 0; e < 2; ++e) {
          const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(t + offset4(k + e))));
          w[e][0] = weight(a[0], _mm256_and_si256(v, _mm256_set1_epi32(15)), b[0]);
          w[e][1] = weight(a[1], _mm256_srli_epi32(v, 4), b[1]);
        }
        emit(g0 - k0 + k, w[0], w[1]);
      }
    } else {  // 8 bits, signed: pair i's 16 bytes per half are (row, k) then (row, k + 1), rows in order
      for (int i = 0; i < G / 2; ++i) {
        __m256 w[2][2];
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(plane + 32 * i + 16 * h)));
          w[0][h] = weight(a[h], _mm256_srai_epi32(_mm256_slli_epi32(v, 16), 16), b[h]);
          w[1][h] = weight(a[h], _mm256_srai_epi32(v, 16), b[h]);
        }
        emit(g0 - k0 + 2 * i, w[0], w[1]);
      }
    }
  }
}

}  // namespace oospec::repack
