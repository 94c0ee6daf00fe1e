// GGUF weight blocks, dequantized to float32 exactly as gguf-py's numpy reference does (gguf.quants.dequantize,
// which transformers' GGUF loader, and so the float32 folder oospec converts a GGUF into, runs).
//
// Why these bits and no others: the quantized model must compute what the expanded model computes, bit for
// bit, so each element is gguf-py's expression in gguf-py's order, one IEEE float32 operation at a time
// (the build passes -ffp-contract=off: no multiply and add fused into one rounding). Every product here is
// exact in float32 (an 11-bit float16 scale times a 6-bit sub-scale times a 6-bit quant needs at most 24
// bits), so the one rounding of an element is its final add or subtract; the order still follows gguf-py so
// that no reasoning about exactness is needed to see the two agree.
//
// Block layouts are ggml's (ggml-common.h); a type's id is its GGMLQuantizationType value.

#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

namespace oospec::quants {

enum Type : int { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30 };

// Elements per block and bytes per block (0 elements: a type these kernels do not read).
struct Layout { int64_t elems, bytes; };
inline Layout layout(int type) {
  switch (type) {
    case F32: return {1, 4};
    case F16: return {1, 2};
    case BF16: return {1, 2};
    case Q4_0: return {32, 18};
    case Q4_1: return {32, 20};
    case Q5_0: return {32, 22};
    case Q8_0: return {32, 34};
    case Q4_K: return {256, 144};
    case Q5_K: return {256, 176};
    case Q6_K: return {256, 210};
    default: return {0, 0};
  }
}

inline float half_at(const uint8_t* p) {  // float16 -> float32 is exact
  uint16_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// ---- one block each: y[0 .. elems) ---------------------------------------------------------------------
// __restrict: y never overlaps the block; without it the compiler must assume a float store can change the
// bytes still to be read (uint8_t aliases everything) and keeps every loop scalar.
// gguf-py: d * (q - 8), q the low nibbles of 16 bytes then their high nibbles.
// (One loop per nibble: the shape the compiler vectorizes.)
inline void q4_0(const uint8_t* __restrict b, float* __restrict y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) y[j] = d * static_cast<float>((qs[j] & 15) - 8);
  for (int j = 0; j < 16; ++j) y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
}

// gguf-py: (d * q) + m.
inline void q4_1(const uint8_t* __restrict b, float* __restrict y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) y[j] = d * static_cast<float>(qs[j] & 15) + m;  // mul, then add: no FMA
  for (int j = 0; j < 16; ++j) y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
}

// gguf-py: d * (q - 16), q = a low or high nibble of 16 bytes with bit j of the 32-bit qh as its fifth bit.
inline void q5_0(const uint8_t* __restrict b, float* __restrict y) {
  const float d = half_at(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, sizeof(qh));
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) y[j] = d * static_cast<float>(static_cast<int>((qs[j] & 15) | ((qh >> j) & 1) << 4) - 16);
  for (int j = 0; j < 16; ++j) y[j + 16] = d * static_cast<float>(static_cast<int>((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
}

// gguf-py: q * d, q signed bytes.
inline void q8_0(const uint8_t* __restrict b, float* __restrict y) {
  const float d = half_at(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// The 8 six-bit scales and mins of a Q4_K / Q5_K super-block, packed in 12 bytes (gguf-py's get_scale_min).
inline void scale_min_k4(const uint8_t* s, int sub, int& sc, int& m) {
  if (sub < 4) {
    sc = s[sub] & 63;
    m = s[sub + 4] & 63;
  } else {
    sc = (s[sub + 4] & 15) | ((s[sub - 4] >> 2) & 0x30);
    m = (s[sub + 4] >> 4) | ((s[sub] >> 2) & 0x30);
  }
}

// gguf-py: (d * sc) * q - (dmin * m) per 32-element sub-block; sub-blocks 2i and 2i+1 are the low and high
// nibbles of bytes 32i .. 32i+31; Q5_K adds bit `sub` of qh[j] as the quant's fifth bit.
template <bool Five>
inline void qk_nibbles(const uint8_t* __restrict b, float* __restrict y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = Five ? b + 48 : b + 16;
  for (int sub = 0; sub < 8; ++sub) {
    int sc, m;
    scale_min_k4(scales, sub, sc, m);
    const float ds = d * static_cast<float>(sc);
    const float dm = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
    float* ys = y + 32 * sub;
    for (int j = 0; j < 32; ++j) {
      int v = (q[j] >> shift) & 15;
      if (Five) v |= ((qh[j] >> sub) & 1) << 4;
      ys[j] = ds * static_cast<float>(v) - dm;  // mul, then subtract: no FMA (-ffp-contract=off)
    }
  }
}

// gguf-py: (d * scale) * (q - 32), a signed 8-bit scale per 16 elements. Element e = 128 g + r: the low four
// bits are nibble r / 64 of ql[64 g + r % 64], the high two bits pair r / 32 of qh[32 g + r % 32].
inline void q6_k(const uint8_t* __restrict b, float* __restrict y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int e = 0; e < 256; ++e) {
    const int g = e / 128, r = e % 128;
    const int lo = (ql[64 * g + r % 64] >> (4 * (r / 64))) & 15;
    const int hi = (qh[32 * g + r % 32] >> (2 * (r / 32))) & 3;
    const float ds = d * static_cast<float>(scales[e / 16]);
    y[e] = ds * static_cast<float>((lo | (hi << 4)) - 32);
  }
}

inline void f16(const uint8_t* __restrict b, float* __restrict y) { *y = half_at(b); }
inline void bf16(const uint8_t* __restrict b, float* __restrict y) {
  uint16_t bits;
  std::memcpy(&bits, b, sizeof(bits));
  *y = static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits()));
}
inline void f32(const uint8_t* __restrict b, float* __restrict y) { std::memcpy(y, b, sizeof(float)); }

template <void (*Block)(const uint8_t*, float*), int64_t Elems, int64_t Bytes>
inline void blocks(const uint8_t* b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) Block(b + i * Bytes, y + i * Elems);
}

// Elements [k0, k1) of one row (its blocks start at `row`): k0 a multiple of the block size, k1 one too or the
// row's end. Returns false for a type these kernels do not read. (One type per call: the loop over blocks is
// compiled for that type, with nothing to decide inside it.)
inline bool dequantize_range(int type, const uint8_t* row, int64_t k0, int64_t k1, float* y) {
  const Layout l = layout(type);
  if (l.elems == 0) return false;
  const uint8_t* b = row + k0 / l.elems * l.bytes;
  const int64_t n = (k1 - k0 + l.elems - 1) / l.elems;
  switch (type) {
    case F32: blocks<f32, 1, 4>(b, n, y); break;
    case F16: blocks<f16, 1, 2>(b, n, y); break;
    case BF16: blocks<bf16, 1, 2>(b, n, y); break;
    case Q4_0: blocks<q4_0, 32, 18>(b, n, y); break;
    case Q4_1: blocks<q4_1, 32, 20>(b, n, y); break;
    case Q5_0: blocks<q5_0, 32, 22>(b, n, y); break;
    case Q8_0: blocks<q8_0, 32, 34>(b, n, y); break;
    case Q4_K: blocks<qk_nibbles<false>, 256, 144>(b, n, y); break;
    case Q5_K: blocks<qk_nibbles<true>, 256, 176>(b, n, y); break;
    case Q6_K: blocks<q6_k, 256, 210>(b, n, y); break;
  }
  return true;
}

}  // namespace oospec::quants
