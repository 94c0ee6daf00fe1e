// Moving dequantized weights into the panel layout of linear.h: bfloat16 rounding as torch's, and a 16-row
// transpose of 32-bit units. Only moves and torch's own rounding: the values are the dequantized ones.

#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace oospec {

// bfloat16 bits of src[i] rounded to nearest even, as torch rounds a float32 weight (c10::BFloat16). NaN: torch's
// scalar 0x7FC0 (its vector conversion writes 0xFFFF: no GGUF weight is NaN).
inline void round_bf16(const float* __restrict src, int64_t n, uint16_t* __restrict dst) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, src + i, sizeof(u));
    dst[i] = static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  }
}

// dst[c * 16 + l] = unit c of row l for the 16 rows l (row l's units at src + 4 * l * stride bytes) and c < cols:
// 32-bit units (a float32, or a pair of bfloat16) moved, never converted. Read through memcpy and vector loads,
// which may read any type's memory.
inline void transpose16(const void* src_, int64_t stride, int64_t cols, uint32_t* __restrict dst) {
  const char* src = static_cast<const char*>(src_);
  int64_t c = 0;
#if defined(__AVX512F__)
  for (; c + 16 <= cols; c += 16) {  // 16 x 16 in registers: 32-bit, then 64-bit unpacks, then 128-bit lanes
    __m512i r[16], t[16], u[16];
    for (int l = 0; l < 16; ++l) r[l] = _mm512_loadu_si512(src + 4 * (l * stride + c));
    for (int i = 0; i < 16; i += 4) {
      t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
      t[i + 2] = _mm512_unpacklo_epi32(r[i + 2], r[i + 3]);
      t[i + 3] = _mm512_unpackhi_epi32(r[i + 2], r[i + 3]);
      u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);      // rows i..i+3 of column 4q, in 128-bit lane q
      u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);  // column 4q + 1
      u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
      u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int m = 0; m < 4; ++m) {
      const __m512i v0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x88), v1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xDD);
      const __m512i w0 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x88);
      const __m512i w1 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xDD);
      _mm512_storeu_si512(dst + (c + m) * 16, _mm512_shuffle_i32x4(v0, w0, 0x88));
      _mm512_storeu_si512(dst + (c + 4 + m) * 16, _mm512_shuffle_i32x4(v1, w1, 0x88));
      _mm512_storeu_si512(dst + (c + 8 + m) * 16, _mm512_shuffle_i32x4(v0, w0, 0xDD));
      _mm512_storeu_si512(dst + (c + 12 + m) * 16, _mm512_shuffle_i32x4(v1, w1, 0xDD));
    }
  }
#endif
  for (; c < cols; ++c)
    for (int l = 0; l < 16; ++l) std::memcpy(dst + c * 16 + l, src + 4 * (l * stride + c), 4);
}

}  // namespace oospec
