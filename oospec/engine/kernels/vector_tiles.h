// The vector path of linear.h (its top comment has the layout and the fixed order): one k-step per instruction
// set (PStep), the register tiles over row blocks and panel groups (micro, tile), the threads that claim
// column groups (claim_parallel), and the product over packed or made panels (packed_impl).
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "lanes.h"
#include "transpose.h"

namespace oospec {

// One k-step of the reduction for T: `width` k per update, `panel_step` elements of a panel per k-step.
template <class T> struct PStep;

template <> struct PStep<float> {
  static constexpr int width = 1;
  static constexpr int panel_step = 16;
  using W = V16;
  using X = V16;
  static inline W wload(const float* p) { return load16(p); }
  static inline X xload(const float* x) { return bcast16(*x); }
  static inline V16 run(V16 acc, const W& w, const X& x) { return fma16(x, w, acc); }
};

#if defined(__AVX512BF16__)
template <> struct PStep<bf16> {
  static constexpr int width = 2;
  static constexpr int panel_step = 32;
  using W = __m512bh;
  using X = __m512bh;
  static inline W wload(const bf16* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static inline X xload(const bf16* x) {
    int32_t pair;
    std::memcpy(&pair, x, sizeof(pair));
    return (__m512bh)_mm512_set1_epi32(pair);
  }
  static inline V16 run(V16 acc, const W& w, const X& x) { return {_mm512_dpbf16_ps(acc.v, x, w)}; }
};
#else
template <> struct PStep<bf16> {
  static constexpr int width = 2;
  static constexpr int panel_step = 32;
  struct W { V16 odd, even; };
  struct X { V16 odd, even; };
  static inline W wload(const bf16* p) { W w; widen_pairs(p, w.odd, w.even); return w; }
  static inline X xload(const bf16* x) { return {bcast16(static_cast<float>(x[1])), bcast16(static_cast<float>(x[0]))}; }
  // VDPBF16PS's order without the instruction: pair element 2i+1, then 2i (bf16 products are exact in float32).
  static inline V16 run(V16 acc, const W& w, const X& x) { return fma16(x.even, w.even, fma16(x.odd, w.odd, acc)); }
};
#endif

// Tile shapes: NJ panels (16 NJ columns) x R rows of accumulators; KC k-steps per chunk, so that a chunk of
// NJ panels (NJ * KC * 64 bytes) stays in L2 while the row blocks of a forward pass over it.
#if defined(__AVX512F__)
constexpr int NJ = 4, RMAX = 6;   // 24 zmm accumulators + 4 weights + a broadcast
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int NJ = 1, RMAX = 5;   // a V16 is two ymm: 10 accumulators
#else
constexpr int NJ = 1, RMAX = 4;
#endif
constexpr int64_t KC = 512;
// A decode step's one row takes more panels at once: each output's sum is a chain over k, one FMA latency per
// k-step, so one row of NJ panels keeps only NJ (AVX2: 2 NJ) sums in flight where the FMA ports want ~8; and
// chunks of KC1 k-steps (whole GGUF blocks, as KC), so that the panels made from the blocks stay in L2.
constexpr int NJ1 = NJ < 4 ? 4 : NJ;
constexpr int64_t KC1 = 256;

// acc [R][16 NJc] float32 partial sums in memory (exact), updated over k-steps s0 .. s1 of the panels at w.
template <class T, int NJc, int R>
void micro(const T* w, int64_t panel_elems, const T* x, int64_t ldx, int64_t s0, int64_t s1, float* acc,
           bool prefetch) {
  using S = PStep<T>;
  const int64_t steps = panel_elems / S::panel_step;
  V16 a[NJc][R];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NJc; ++j) a[j][r] = load16(acc + (r * NJc + j) * 16);
  // The weights KC k-steps ahead (the next chunk, or the next panels' start) are fetched into L2 while these
  // are multiplied: the first row block of a chunk would otherwise wait on memory. One cache line per panel
  // and k-step, so one prefetch each; a prefetch past the weight's end is dropped by the processor.
  for (int64_t s = s0; s < s1; ++s) {
    if (prefetch) {
      const int64_t far = s + KC < steps ? s + KC : s + KC - steps + NJc * steps;
      for (int j = 0; j < NJc; ++j) __builtin_prefetch(w + j * panel_elems + far * S::panel_step, 0, 2);
    }
    typename S::W wv[NJc];
    for (int j = 0; j < NJc; ++j) wv[j] = S::wload(w + j * panel_elems + s * S::panel_step);
    for (int r = 0; r < R; ++r) {
      const typename S::X xv = S::xload(x + r * ldx + s * S::width);
      for (int j = 0; j < NJc; ++j) a[j][r] = S::run(a[j][r], wv[j], xv);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NJc; ++j) store16(acc + (r * NJc + j) * 16, a[j][r]);
}

// Run-time row and panel counts to the compiled tile shapes (R <= RMAX rows, NJc <= NJ panels).
template <class T, int NJc, int R = RMAX>
void micro_rows(const T* w, int64_t pe, const T* x, int64_t ldx, int rows, int64_t s0, int64_t s1, float* acc,
                bool prefetch) {
  if (rows == R) return micro<T, NJc, R>(w, pe, x, ldx, s0, s1, acc, prefetch);
  if constexpr (R > 1) micro_rows<T, NJc, R - 1>(w, pe, x, ldx, rows, s0, s1, acc, prefetch);
}

// nj <= NJc panels x rows <= R rows (R = 1: a decode step's row, NJ1 panels wide).
template <class T, int NJc = NJ, int R = RMAX>
void tile(const T* w, int64_t pe, int nj, const T* x, int64_t ldx, int rows, int64_t s0, int64_t s1, float* acc,
          bool prefetch) {
  if (nj == NJc) return micro_rows<T, NJc, R>(w, pe, x, ldx, rows, s0, s1, acc, prefetch);
  if constexpr (NJc > 1) tile<T, NJc - 1, R>(w, pe, nj, x, ldx, rows, s0, s1, acc, prefetch);
}

inline int64_t ksteps(int64_t K, int width) { return (K + width - 1) / width; }

// Units [0, n) shared by the threads, claimed a chunk at a time from a counter rather than split in equal parts
// up front: a thread the system pauses (another program wants its core) then holds back one chunk, not half the
// product, and the threads still running take the rest. Each unit is computed the same way whoever claims it,
// so the bits do not depend on the thread count or on who ran what. `grain`: the fewest units worth a thread.
// A chunk is a share of what is left (1/(8 threads) of it, at least 1/(64 threads) of n): the first are long
// runs through memory, the last small, so a thread that is done waits at the end for a small chunk of its
// partner's, not for up to 1/(8 threads) of the product (a decode step's products each end that way).
// setup() makes a thread's private state once; body(state, u0, u1) computes units u0 .. u1.
template <class Setup, class Body>
void claim_parallel(int64_t n, int64_t grain, Setup setup, Body body) {
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n / std::max<int64_t>(1, grain)));
  if (threads == 1) {
    auto state = setup();
    body(state, 0, n);
    return;
  }
  const int64_t smallest = std::max<int64_t>(1, n / (threads * 64));
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    auto state = setup();
    int64_t u0 = next.load(std::memory_order_relaxed);
    while (u0 < n) {
      const int64_t chunk = std::max(smallest, (n - u0) / (threads * 8));
      if (!next.compare_exchange_weak(u0, u0 + chunk, std::memory_order_relaxed)) continue;  // u0: the new next
      body(state, u0, std::min(n, u0 + chunk));
      u0 = next.load(std::memory_order_relaxed);
    }
  });
}

// Where a tile reads its weights. Both give the same panels (pack_linear's layout), so the same products in the
// same order: `Prepacked` points into panels packed once at load; `QuantRows` dequantizes them from GGUF blocks
// per chunk into a small buffer (`scratch`) that every row block of the forward then reads.
// panels(p0, nj, s0, s1, scratch, stride, first): panel p0 + j's k-steps s0 .. s1 start at
// result + j * stride + first * panel_step.
template <class T> struct Prepacked {
  const T* wp;
  int64_t pe;
  static constexpr bool prefetch = true;  // the next chunk's weights come from memory
  static constexpr bool tile_by_tile = false;
  int64_t scratch_elems(int64_t) const { return 0; }
  const T* panels(int64_t p0, int, int64_t s0, int64_t, T*, int64_t& stride, int64_t& first) const {
    stride = pe;
    first = s0;
    return wp + p0 * pe;
  }
};

template <class T, class Source>
void packed_impl(const T* x, int64_t ldx, const Source& src, const T* b, T* y, int64_t M, int64_t K, int64_t N) {
  using S = PStep<T>;
  const int64_t steps = ksteps(K, S::width);
  const int64_t pe = steps * S::panel_step;  // elements per panel
  const int64_t panels = (N + 15) / 16;
  // Each output's sum runs over k in order whatever the panels beside it and the chunks: the same bits for any
  // row count (one row takes NJ1 panels and KC1-step chunks, above).
  const int group_panels = M == 1 ? NJ1 : NJ;
  const int64_t kc = M == 1 ? KC1 : KC;
  const int64_t groups = (panels + group_panels - 1) / group_panels;
  const int64_t row_blocks = (M + RMAX - 1) / RMAX;
  // Threads only for at least half a megabyte of weights each: waking them costs more on small matrices.
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 19) / (group_panels * pe * static_cast<int64_t>(sizeof(T))));
  struct Buffers { std::vector<float> acc; std::vector<T> scratch; };
  const auto buffers = [&] {
    return Buffers{std::vector<float>(static_cast<size_t>(M) * group_panels * 16),
                   std::vector<T>(static_cast<size_t>(group_panels * src.scratch_elems(std::min(steps, kc))))};
  };
  claim_parallel(groups, grain, buffers, [&](Buffers& buf, int64_t g0, int64_t g1) {
    std::vector<float>& acc = buf.acc;
    std::vector<T>& scratch = buf.scratch;
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t p0 = g * group_panels;
      const int nj = static_cast<int>(std::min<int64_t>(group_panels, panels - p0));
      const int64_t cols = nj * 16;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t s0 = 0; s0 < steps; s0 += kc) {
        const int64_t s1 = std::min(steps, s0 + kc);
        int64_t stride, first;
        const T* w = src.panels(p0, nj, s0, s1, scratch.data(), stride, first);
        const T* xs = x + (s0 - first) * S::width;  // step `first` of w is step s0 of x
        if (M == 1) {
          tile<T, NJ1, 1>(w, stride, nj, xs, ldx, 1, first, first + (s1 - s0), acc.data(), Source::prefetch);
          continue;
        }
        // row blocks as even as RMAX allows (16 rows: 6, 5, 5, not 6, 6, 4): the smallest tile loads the most
        for (int64_t blk = 0, m0 = 0; blk < row_blocks; ++blk) {
          const int rows = static_cast<int>(M / row_blocks + (blk < M % row_blocks ? 1 : 0));
          tile<T>(w, stride, nj, xs + m0 * ldx, ldx, rows, first, first + (s1 - s0), acc.data() + m0 * cols,
                  Source::prefetch);
          m0 += rows;
        }
      }
      const int64_t n0 = p0 * 16, nn = std::min<int64_t>(cols, N - n0);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < nn; ++j) {
          float v = acc[m * cols + j];
          if (b) v += to_float(b[n0 + j]);
          y[m * N + n0 + j] = from_float<T>(v);
        }
    }
  });
}


}  // namespace oospec
