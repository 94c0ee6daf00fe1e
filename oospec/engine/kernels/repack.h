// GGUF blocks regrouped by 16 rows, so that a weight panel (linear.h's layout: 16 output columns at each k) is
// made with vector loads and no transpose.
//
// Why: dequantizing a panel from the file's own blocks means 16 rows read one by one and transposed, about 0.7 ns
// per weight on two cores, 5-20x what a decode step can afford. llama.cpp regroups its blocks the same way at load
// ("repack", Q4_0x8). The regrouped tensor holds the same information in about the same bytes.
//
// Every weight of the supported types is gguf-py's own expression over a float32 scale `a` (and offset `b`) shared
// by a group of G elements of one row, and a small integer q, with the same operations in the same order:
//   Q4_K, Q5_K: a * q - b,          a = d * sc, b = dmin * m   (gguf-py: (d * sc) * q - (dmin * m))
//   Q4_1:       a * q - b,          a = d, b = -m              (gguf-py: (d * q) + m; x - (-m) is x + m in IEEE)
//   Q6_K:       a * (q - 32),       a = d * sc                 (gguf-py: (d * sc) * (q - 32); held as q - 32, exact)
//   Q4_0, Q5_0: a * (q - 8 or 16),  a = d                      (gguf-py: d * (q - 8), d * (q - 16))
//   Q8_0:       a * q, q signed,    a = d                      (gguf-py: q * d)
// a = d * sc and b = dmin * m are exact (an 11-bit float16 times a sub-scale of at most 8 bits); they are made per
// group from the stored scales, as gguf-py makes them. The tests compare every element with gguf-py, signed zeros
// included.
//
// Layout: panel p (rows 16p .. 16p+15; rows past N are zeros, so w = 0 as pack_linear pads), made of super-blocks
// of S k (the type's block: 256 for the K-quants, 32 otherwise), k-major. A super-block starts with its header,
// the 16 rows' float16 block scales (d, then dmin, or -m for Q4_1: 32 or 64 bytes), then holds S / G groups:
// the 16 rows' sub-scales (K-quants: sc then m, a byte each per row; Q6_K: a signed sc), then the quants of the
// group's k-pairs. Within a pair (k = 2i, 2i + 1) the 32 quants are ordered as a bfloat16 panel holds them, rows
// 0-7 then 8-15, each row's k then k + 1: unit u = 2 (row % 8) + (k % 2) of half h = row / 8, so that one vector
// of 16 units, widened, is the pair's weights for 8 rows, and two of them are a panel's k-pair as it is stored:
//   4-bit: 8 x G bytes, byte k of row rr = the quant of row rr at k | of row rr + 8 at k << 4 (rr = 0..7): the
//          rows in k order, as the lookup below reads them (its 4-bit types are most of a Q4_K_M model's weights);
//          a pair's 16 units are 16-bit words i of rows rr = 0..7 (`units16` moves them for the panels)
//   5-bit: then G/8 x 16 bytes, bit 4h + i % 4 of byte u of octet i / 4 = bit 4 of unit u, half h of pair i
//   8-bit: G x 16 signed bytes, pair i: half 0's 16 units, then half 1's
// The bytes are the file's, moved (a regrouped weight is the GGUF's size; Q4_K: 4.625 bits a weight, 4.5 in the
// file), but for Q6_K: its 6-bit quants are held as signed bytes, q - 32 (8.5 bits a weight, 6.56 in the file).
// Why: putting 6 bits back together took 8 of the ~16 vector instructions that made each pair of Q6_K weights, and
// a decode step is bound by those instructions, not by the bytes it reads (Q6_K is a quarter of a Q4_K_M model's
// weights: its ffn_down of every other layer and the output head).

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "quants.h"

namespace oospec::repack {

struct Format {
  int group = 0;       // G: elements of one row that share a and b (0: a type not regrouped)
  int super = 0;       // S: elements of one row per header (the type's block)
  int bits = 0;        // bits a quant is held in: 4, 5 or 8 (8: signed)
  int b_mode = 0;      // 0: a * q - b; 1: a * (q - offset); 2: a * q, q signed
  int offset = 0;      // b_mode 1: subtracted when a weight is made; 8 bits: subtracted once, when held
  int header = 0;      // float16 scales per row in a header: 1 (d) or 2 (d and dmin, or d and -m)
  int subscales = 0;   // bytes per row in a group: 0 (a = d, b = the header's second), 1 (a = d * sc, sc signed),
                       // 2 (a = d * sc, b = dmin * m)
  constexpr int64_t group_bytes() const {
    const int64_t planes = bits == 8 ? group * 16 : group * 8 + (bits == 5 ? group * 2 : 0);
    return 16 * subscales + planes;
  }
  constexpr int64_t super_bytes() const { return 32 * header + super / group * group_bytes(); }
};

constexpr Format format(int type) {
  switch (type) {
    case quants::Q4_K: return {32, 256, 4, 0, 0, 2, 2};
    case quants::Q5_K: return {32, 256, 5, 0, 0, 2, 2};
    case quants::Q6_K: return {16, 256, 8, 2, 32, 1, 1};
    case quants::Q4_0: return {32, 32, 4, 1, 8, 1, 0};
    case quants::Q5_0: return {32, 32, 5, 1, 16, 1, 0};
    case quants::Q4_1: return {32, 32, 4, 0, 0, 2, 0};
    case quants::Q8_0: return {32, 32, 8, 2, 0, 1, 0};
    default: return {};
  }
}

constexpr int64_t panel_bytes(const Format& f, int64_t K) { return K / f.super * f.super_bytes(); }

// The float16 bits of a block's header scales (h[1]: dmin, or -m for Q4_1, whose m is added).
inline void decode_header(int type, const uint8_t* blk, uint16_t* h) {
  using namespace quants;
  const uint8_t* at = type == Q6_K ? blk + 208 : blk;
  std::memcpy(&h[0], at, 2);
  if (type == Q4_K || type == Q5_K) std::memcpy(&h[1], blk + 2, 2);
  if (type == Q4_1) { std::memcpy(&h[1], blk + 2, 2); h[1] ^= 0x8000; }  // -m: exact
}

inline bool finite_half(uint16_t h) { return (h & 0x7C00) != 0x7C00; }

// One group of one row from its GGUF block: its sub-scales (sc, m; K-quants only) and its G quants (signed for
// Q8_0). `g` is the group's index inside the block.
inline void decode_group(int type, const uint8_t* blk, int g, int& sc, int& m, int* q) {
  using namespace quants;
  switch (type) {
    case Q4_K:
    case Q5_K: {
      scale_min_k4(blk + 4, g, sc, m);
      const uint8_t* qs = type == Q5_K ? blk + 48 : blk + 16;
      for (int j = 0; j < 32; ++j) {
        q[j] = (qs[32 * (g / 2) + j] >> (4 * (g % 2))) & 15;
        if (type == Q5_K) q[j] |= ((blk[16 + j] >> g) & 1) << 4;
      }
      break;
    }
    case Q6_K: {
      sc = reinterpret_cast<const int8_t*>(blk + 192)[g];
      for (int j = 0; j < 16; ++j) {
        const int e = 16 * g + j, h = e / 128, r = e % 128;
        const int lo = (blk[64 * h + r % 64] >> (4 * (r / 64))) & 15;
        const int hi = (blk[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
        q[j] = lo | (hi << 4);
      }
      break;
    }
    case Q4_0:
    case Q4_1: {
      const uint8_t* qs = blk + (type == Q4_1 ? 4 : 2);
      for (int j = 0; j < 16; ++j) { q[j] = qs[j] & 15; q[j + 16] = qs[j] >> 4; }
      break;
    }
    case Q5_0: {
      uint32_t qh;
      std::memcpy(&qh, blk + 2, sizeof(qh));
      for (int j = 0; j < 16; ++j) {
        q[j] = (blk[6 + j] & 15) | ((qh >> j) & 1) << 4;
        q[j + 16] = (blk[6 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
      }
      break;
    }
    case Q8_0: {
      for (int j = 0; j < 32; ++j) q[j] = reinterpret_cast<const int8_t*>(blk + 2)[j];
      break;
    }
  }
}

// Panel p of a weight [N, K] whose row n's blocks start at raw + n * row_stride, into `out` (panel_bytes).
// Returns false if a block scale is not finite (such a weight stays on the file's blocks: no fast path assumes it).
inline bool pack_panel(int type, const uint8_t* raw, int64_t row_stride, int64_t N, int64_t K, int64_t p,
                       uint8_t* out) {
  const Format f = format(type);
  const quants::Layout l = quants::layout(type);
  const int G = f.group;
  const int64_t gb = f.group_bytes(), sbb = f.super_bytes(), supers = K / f.super;
  std::memset(out, 0, static_cast<size_t>(supers * sbb));
  int q[32];
  bool finite = true;
  for (int lane = 0; lane < 16; ++lane) {
    const int64_t n = p * 16 + lane;
    if (n >= N) break;
    const uint8_t* row = raw + n * row_stride;
    for (int64_t s = 0; s < supers; ++s) {
      const uint8_t* blk = row + s * f.super / l.elems * l.bytes;  // a super-block is one of the file's blocks
      uint8_t* sb = out + s * sbb;
      uint16_t h[2] = {0, 0};
      decode_header(type, blk, h);
      for (int i = 0; i < f.header; ++i) {
        finite = finite && finite_half(h[i]);
        std::memcpy(sb + 32 * i + 2 * lane, &h[i], 2);
      }
      for (int g = 0; g < f.super / G; ++g) {
        int sc = 0, m = 0;
        decode_group(type, blk, g, sc, m, q);
        uint8_t* grp = sb + 32 * f.header + g * gb;
        if (f.subscales >= 1) grp[lane] = static_cast<uint8_t>(sc);
        if (f.subscales == 2) grp[16 + lane] = static_cast<uint8_t>(m);
        uint8_t* plane = grp + 16 * f.subscales;
        uint8_t* high = plane + G * 8;
        for (int k = 0; k < G; ++k) {
          const int i = k / 2, u = 2 * (lane % 8) + k % 2, h = lane / 8;
          if (f.bits == 8) {
            plane[32 * i + 16 * h + u] = static_cast<uint8_t>(static_cast<int8_t>(q[k] - f.offset));
            continue;
          }
          plane[G * (lane % 8) + k] |= static_cast<uint8_t>((q[k] & 15) << (4 * h));
          if (f.bits == 5) high[16 * (i / 4) + u] |= static_cast<uint8_t>(((q[k] >> 4) & 1) << (4 * h + i % 4));
        }
      }
    }
  }
  return finite;
}

// ---- making weights from the regrouped panels -------------------------------------------------------------
// The 16 lanes of one k: w = a * q - b (or a * (q - offset), or a * q), a and b made per group as gguf-py makes
// them (a = d * sc, b = dmin * m: exact products). Plain loops over the 16 lanes: the compiler makes each a few
// vector instructions on every instruction set (-ffp-contract=off keeps the multiply and subtract apart).

struct Group {
  float a[16], b[16];
  const uint8_t* plane;  // the 4- or 8-bit quants
  const uint8_t* high;   // the 5th bits
};

// Group `gi` of the super-block at `sb`.
template <int Type>
inline Group open_group(const uint8_t* sb, int64_t gi) {
  constexpr Format f = format(Type);
  Group g;
  const uint8_t* grp = sb + 32 * f.header + gi * f.group_bytes();
  for (int l = 0; l < 16; ++l) {
    const float d = quants::half_at(sb + 2 * l);
    const float h1 = f.header == 2 ? quants::half_at(sb + 32 + 2 * l) : 0.f;
    if constexpr (f.subscales == 0) { g.a[l] = d; g.b[l] = h1; }
    if constexpr (f.subscales == 1) g.a[l] = d * static_cast<float>(static_cast<int8_t>(grp[l]));
    if constexpr (f.subscales == 2) {
      g.a[l] = d * static_cast<float>(grp[l]);
      g.b[l] = h1 * static_cast<float>(grp[16 + l]);
    }
  }
  g.plane = grp + 16 * f.subscales;
  g.high = g.plane + f.group * 8;
  return g;
}

template <int BMode>
inline void weights(const Group& g, const int* __restrict q, int offset, float* __restrict w) {
  if constexpr (BMode == 0) for (int l = 0; l < 16; ++l) w[l] = g.a[l] * static_cast<float>(q[l]) - g.b[l];
  else if constexpr (BMode == 1) for (int l = 0; l < 16; ++l) w[l] = g.a[l] * static_cast<float>(q[l] - offset);
  else for (int l = 0; l < 16; ++l) w[l] = g.a[l] * static_cast<float>(q[l]);
}

// w[r] for k = 2i (w0) and 2i + 1 (w1) of the group, rows r = 0 .. 15 (i: the pair; the layout above).
template <int Bits, int BMode>
inline void pair(const Group& g, int i, int offset, float* __restrict w0, float* __restrict w1) {
  int q0[16], q1[16];
  for (int r = 0; r < 16; ++r) {
    const int u = 2 * (r % 8), h = r / 8;
    if constexpr (Bits == 8) {
      const int8_t* s = reinterpret_cast<const int8_t*>(g.plane) + 32 * i + 16 * h;
      q0[r] = s[u];
      q1[r] = s[u + 1];
    } else {
      const uint8_t* p = g.plane + 32 * (r % 8) + 2 * i;  // G = 32 for every 4- and 5-bit type
      q0[r] = (p[0] >> (4 * h)) & 15;
      q1[r] = (p[1] >> (4 * h)) & 15;
    }
    if constexpr (Bits == 5) {
      const uint8_t* hb = g.high + 16 * (i / 4);
      q0[r] |= ((hb[u] >> (4 * h + i % 4)) & 1) << 4;
      q1[r] |= ((hb[u + 1] >> (4 * h + i % 4)) & 1) << 4;
    }
  }
  weights<BMode>(g, q0, offset, w0);
  weights<BMode>(g, q1, offset, w1);
}

inline uint32_t bf16_bits(float x) {  // round to nearest even, as torch (weights here are finite)
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

// Panel k range [k0, k1) (whole groups) of the regrouped panel at `panel`, in linear.h's layout: float32 [k][16]
// (Pairs = false) or bfloat16 pairs [k/2][16][2] (Pairs = true, as 32-bit units) at out.
template <int Type, bool Pairs>
inline void fill_panel(const uint8_t* panel, int64_t k0, int64_t k1, void* out) {
  constexpr Format f = format(Type);
  float w0[16], w1[16];
  for (int64_t g0 = k0; g0 < k1; g0 += f.group) {
    const Group g = open_group<Type>(panel + g0 / f.super * f.super_bytes(), g0 % f.super / f.group);
    for (int i = 0; i < f.group / 2; ++i) {
      pair<f.bits, f.b_mode>(g, i, f.offset, w0, w1);
      const int64_t k = g0 - k0 + 2 * i;
      if constexpr (Pairs) {
        uint32_t* o = static_cast<uint32_t*>(out) + (k / 2) * 16;
        for (int l = 0; l < 16; ++l) o[l] = bf16_bits(w0[l]) | (bf16_bits(w1[l]) << 16);
      } else {
        float* o = static_cast<float*>(out) + k * 16;
        std::memcpy(o, w0, 64);
        std::memcpy(o + 16, w1, 64);
      }
    }
  }
}

// How far ahead a fill asks for the regrouped weights it streams through.
constexpr int64_t PREFETCH_BYTES = 4096;

#if defined(__AVX512F__) && defined(__AVX512BW__)
// The same weights and bits with AVX-512 spelled out (the plain loops above vectorize, but poorly: 3-4x slower).
// bfloat16 pairs: VCVTNE2PS2BF16 rounds to nearest even as torch does for every finite weight that is not a
// float32 subnormal, and none is (each is 0 or at least the smallest float16 subnormal scale, 2^-24, in size);
// without the instruction the rounding is torch's integer form.
// The quants of pair i as two vectors of 16 units (the layout above): half 0 (rows 0-7) and half 1 (rows 8-15).
// The 4-bit plane's rows (8 x 32 bytes, as 16-bit words [rr][i]) as the pairs' units (words [i][rr]: pair i's 16
// bytes at 16 i), two rounds of VPERMT2W: rows 0-3 and 4-7 of pairs 0-7 and 8-15, then pairs four at a time.
struct UnitsOrder {
  __m512i first[2], second[2];
  UnitsOrder() {
    alignas(64) uint16_t a[2][32], b[2][32];
    for (int half = 0; half < 2; ++half)  // first: rows 0-3 (z0 = rows 0-1, z1 = rows 2-3) of pairs 8 half ..
      for (int i = 0; i < 8; ++i)
        for (int r = 0; r < 4; ++r) a[half][i * 4 + r] = static_cast<uint16_t>((r / 2) * 32 + (r % 2) * 16 + 8 * half + i);
    for (int p = 0; p < 2; ++p)  // second: pairs 4p .. 4p + 3 of (rows 0-3, rows 4-7)
      for (int i = 0; i < 4; ++i)
        for (int r = 0; r < 8; ++r) b[p][i * 8 + r] = static_cast<uint16_t>((r / 4) * 32 + (4 * p + i) * 4 + r % 4);
    for (int j = 0; j < 2; ++j) { first[j] = _mm512_load_si512(a[j]); second[j] = _mm512_load_si512(b[j]); }
  }
};

inline void units16(const uint8_t* plane, uint8_t* units) {
  static const UnitsOrder order;
  const __m512i z0 = _mm512_loadu_si512(plane), z1 = _mm512_loadu_si512(plane + 64);
  const __m512i z2 = _mm512_loadu_si512(plane + 128), z3 = _mm512_loadu_si512(plane + 192);
  for (int half = 0; half < 2; ++half) {  // pairs 8 half .. 8 half + 7
    const __m512i low = _mm512_permutex2var_epi16(z0, order.first[half], z1);   // rows 0-3
    const __m512i high = _mm512_permutex2var_epi16(z2, order.first[half], z3);  // rows 4-7
    for (int p = 0; p < 2; ++p)
      _mm512_store_si512(units + 128 * half + 64 * p, _mm512_permutex2var_epi16(low, order.second[p], high));
  }
}

template <int Bits>
inline void quants16(const Group& g, int i, __m512i& h0, __m512i& h1) {
  if constexpr (Bits == 8) {
    const uint8_t* s = g.plane + 32 * i;
    h0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
    h1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16)));
    return;
  }
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g.plane + 16 * i)));
  h0 = _mm512_and_si512(v, _mm512_set1_epi32(15));
  h1 = _mm512_srli_epi32(v, 4);
  if constexpr (Bits == 5) {
    const __m512i hb = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g.high + (i / 4) * 16)));
    const int s = i % 4;  // half 0's bit is bit s, half 1's four higher
    const __m512i mask = _mm512_set1_epi32(0x10);
    const __m512i a0 = _mm512_slli_epi32(hb, 4 - s);  // to bit 4
    const __m512i a1 = _mm512_srli_epi32(hb, s);
    h0 = _mm512_ternarylogic_epi32(h0, a0, mask, 0xF8);  // h0 | (a0 & mask)
    h1 = _mm512_ternarylogic_epi32(h1, a1, mask, 0xF8);
  }
}

inline __m512 halves16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <int Type, bool Pairs>
inline void fill_panel_avx512(const uint8_t* panel, int64_t k0, int64_t k1, void* out) {
  constexpr Format f = format(Type);
  constexpr int G = f.group;
  const __m512i off = _mm512_set1_epi32(f.offset);
  // a row's scale to the units of its half: unit u of half h is row 8h + u / 2
  const __m512i rows0 = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i rows1 = _mm512_add_epi32(rows0, _mm512_set1_epi32(8));
  // float32 panels: k's 16 rows are the even units of both halves, k + 1's the odd ones
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  __m512 d = _mm512_setzero_ps(), hd = _mm512_setzero_ps();
  for (int64_t g0 = k0; g0 < k1; g0 += G) {
    const uint8_t* sb = panel + g0 / f.super * f.super_bytes();
    const int64_t gi = g0 % f.super / G;
    if (gi == 0 || g0 == k0) {
      d = halves16(sb);
      if constexpr (f.header == 2) hd = halves16(sb + 32);
    }
    const uint8_t* grp = sb + 32 * f.header + gi * f.group_bytes();
    // the regrouped weights stream from memory in order: ask for the bytes PREFETCH_BYTES ahead (past this
    // panel's end they are the next panel's, which the caller reads next; past the weight's end, dropped)
    for (int64_t line = 0; line < f.group_bytes(); line += 64) __builtin_prefetch(grp + PREFETCH_BYTES + line, 0, 2);
    Group g;
    g.plane = grp + 16 * f.subscales;
    g.high = g.plane + G * 8;
    alignas(64) uint8_t units[256];
    if constexpr (f.bits == 4 || f.bits == 5) {
      units16(g.plane, units);
      g.plane = units;
    }
    __m512 a = d, b = hd;
    if constexpr (f.subscales == 1) {
      a = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grp)))));
    } else if constexpr (f.subscales == 2) {
      a = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grp)))));
      b = _mm512_mul_ps(hd, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + 16)))));
    }
    const __m512 a0 = _mm512_permutexvar_ps(rows0, a), a1 = _mm512_permutexvar_ps(rows1, a);
    const __m512 b0 = _mm512_permutexvar_ps(rows0, b), b1 = _mm512_permutexvar_ps(rows1, b);
    for (int i = 0; i < G / 2; ++i) {
      __m512i q0, q1;
      quants16<f.bits>(g, i, q0, q1);
      __m512 w0, w1;  // the pair's weights of rows 0-7 and of rows 8-15
      if constexpr (f.b_mode == 0) {
        // a * q is exact for these types (a's 17 significant bits at most, q's 5), so one fused rounding of
        // a * q - b is the separate subtract's rounding: the same bits with one instruction fewer
        w0 = _mm512_fmsub_ps(a0, _mm512_cvtepi32_ps(q0), b0);
        w1 = _mm512_fmsub_ps(a1, _mm512_cvtepi32_ps(q1), b1);
      } else {
        if constexpr (f.b_mode == 1) { q0 = _mm512_sub_epi32(q0, off); q1 = _mm512_sub_epi32(q1, off); }
        w0 = _mm512_mul_ps(a0, _mm512_cvtepi32_ps(q0));
        w1 = _mm512_mul_ps(a1, _mm512_cvtepi32_ps(q1));
      }
      const int64_t k = g0 - k0 + 2 * i;
      if constexpr (Pairs) {
#if defined(__AVX512BF16__)
        const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(w1, w0);  // rows 0-7's pairs, then rows 8-15's
#else
        const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7FFF);
        const __m512i u0 = _mm512_castps_si512(w0), u1 = _mm512_castps_si512(w1);
        const __m512i r0 = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u0, bias),
                                                              _mm512_and_si512(_mm512_srli_epi32(u0, 16), one)), 16);
        const __m512i r1 = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u1, bias),
                                                              _mm512_and_si512(_mm512_srli_epi32(u1, 16), one)), 16);
        const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(r0)),
                                                _mm512_cvtepi32_epi16(r1), 1);
#endif
        _mm512_storeu_si512(static_cast<uint32_t*>(out) + (k / 2) * 16, both);
      } else {
        float* o = static_cast<float*>(out) + k * 16;
        _mm512_storeu_ps(o, _mm512_permutex2var_ps(w0, even, w1));
        _mm512_storeu_ps(o + 16, _mm512_permutex2var_ps(w0, odd, w1));
      }
    }
  }
}

#if defined(__AVX512BF16__)
// ---- a k-tile of a 4-bit weight as rows, by table lookup ---------------------------------------------------
// The AMX path of a small forward (linear.h, weights_as_a) holds the weight as TDPBF16PS's A operand: 16 rows x
// 32 k, each row its k in order, the layout a row of W has. Within a group a 4-bit weight takes one of 16 values
// per row, so each row's 16 values are made once (the same expression, a * q - b or a * (q - offset), on q =
// 0..15, rounded to bfloat16 by the same instruction) and its 32 weights are looked up by their quants
// (VPERMW): about half the instructions of making each weight. The bits are fill()'s.
constexpr bool rows_by_lookup(int type) {
  return type == quants::Q4_K || type == quants::Q4_1 || type == quants::Q4_0;
}

template <int Type>
inline void fill_rows_lookup(const uint8_t* panel, int64_t k0, uint16_t* out) {
  constexpr Format f = format(Type);
  static_assert(f.bits == 4 && f.group == 32, "one group is one k-tile of 4-bit quants");
  const uint8_t* sb = panel + k0 / f.super * f.super_bytes();
  const uint8_t* grp = sb + 32 * f.header + k0 % f.super / f.group * f.group_bytes();
  for (int64_t line = 0; line < f.group_bytes(); line += 64) __builtin_prefetch(grp + PREFETCH_BYTES + line, 0, 2);
  alignas(64) float a[16], b[16];
  const __m512 d = halves16(sb);
  __m512 av = d, bv = f.header == 2 ? halves16(sb + 32) : _mm512_setzero_ps();
  if constexpr (f.subscales == 2) {
    av = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grp)))));
    bv = _mm512_mul_ps(bv, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + 16)))));
  }
  _mm512_store_ps(a, av);
  _mm512_store_ps(b, bv);
  const uint8_t* plane = grp + 16 * f.subscales;
  const __m512 iota = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 q = f.b_mode == 1 ? _mm512_sub_ps(iota, _mm512_set1_ps(static_cast<float>(f.offset))) : iota;
  const __m512i low = _mm512_set1_epi16(15), upper = _mm512_set1_epi16(16);
  for (int rr = 0; rr < 8; ++rr) {
    // row rr + 8's values in words 0..15, row rr's in 16..31; gguf-py's expression, fill()'s instructions
    __m512 row, row8;
    if constexpr (f.b_mode == 0) {
      row = _mm512_fmsub_ps(_mm512_set1_ps(a[rr]), q, _mm512_set1_ps(b[rr]));
      row8 = _mm512_fmsub_ps(_mm512_set1_ps(a[rr + 8]), q, _mm512_set1_ps(b[rr + 8]));
    } else {
      row = _mm512_mul_ps(_mm512_set1_ps(a[rr]), q);
      row8 = _mm512_mul_ps(_mm512_set1_ps(a[rr + 8]), q);
    }
    const __m512i table = (__m512i)_mm512_cvtne2ps_pbh(row, row8);
    const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(plane + 32 * rr)));
    const __m512i of_row = _mm512_ternarylogic_epi32(v, low, upper, 0xEA);  // (v & 15) | 16
    _mm512_storeu_si512(out + 32 * rr, _mm512_permutexvar_epi16(of_row, table));
    _mm512_storeu_si512(out + 32 * (rr + 8), _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), table));
  }
}

// k-tile k0 .. k0 + 31 of a regrouped panel as rows [16][32] bfloat16 (rows_by_lookup types only).
inline void fill_rows(int type, const uint8_t* panel, int64_t k0, uint16_t* out) {
  switch (type) {
    case quants::Q4_K: return fill_rows_lookup<quants::Q4_K>(panel, k0, out);
    case quants::Q4_1: return fill_rows_lookup<quants::Q4_1>(panel, k0, out);
    case quants::Q4_0: return fill_rows_lookup<quants::Q4_0>(panel, k0, out);
  }
}
#endif
#endif

}  // namespace oospec::repack

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !(defined(__AVX512F__) && defined(__AVX512BW__))
#include "repack_avx2.h"
#endif

namespace oospec::repack {

// The dispatch over types, each compiled with its format as constants.
template <bool Pairs>
inline void fill(int type, const uint8_t* panel, int64_t k0, int64_t k1, void* out) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define OOSPEC_FILL_TYPE(T) case quants::T: return fill_panel_avx512<quants::T, Pairs>(panel, k0, k1, out);
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define OOSPEC_FILL_TYPE(T) case quants::T: return fill_panel_avx2<quants::T, Pairs>(panel, k0, k1, out);
#else
#define OOSPEC_FILL_TYPE(T) case quants::T: return fill_panel<quants::T, Pairs>(panel, k0, k1, out);
#endif
  switch (type) {
    OOSPEC_FILL_TYPE(Q4_0) OOSPEC_FILL_TYPE(Q4_1) OOSPEC_FILL_TYPE(Q5_0) OOSPEC_FILL_TYPE(Q8_0)
    OOSPEC_FILL_TYPE(Q4_K) OOSPEC_FILL_TYPE(Q5_K) OOSPEC_FILL_TYPE(Q6_K)
  }
#undef OOSPEC_FILL_TYPE
}

}  // namespace oospec::repack
