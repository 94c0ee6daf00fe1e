// The row-invariant linear layer, y[m, n] = sum_k x[m, k] w[n, k] (+ b[n]), over a weight packed once: the tiles
// and their fixed order, shared by linear.cpp (dense weights) and gguf_linear.cpp (GGUF weights).
//
// Why a packed layout: reducing each output inside one vector (16 lanes over k, then a horizontal sum) makes
// every extra row cost a full pass of multiply-adds plus a horizontal sum per output, so 16 rows cost ~2.5x
// one row. Here the 16 lanes of a vector are 16 *outputs* instead: the weight is stored in panels of 16
// output columns, k-major inside the panel, so one vector load gives 16 columns at one k (float32) or at one
// pair of k (bfloat16), and a row's x[k] (or its pair) is broadcast against it. Each output then has one
// accumulator lane that takes its products in increasing k, one update per k (float32: fused multiply-add)
// or per pair (bfloat16: VDPBF16PS, or its order, pair element 2i+1 then 2i, with float32 FMA elsewhere).
// There are no horizontal sums, and that order depends on nothing but k: not on the row count, the tile
// shape, the thread count or the k-chunking below (partial sums are parked in float32 memory exactly).
//
// Layout (pack_linear): panel p holds columns 16p .. 16p+15; float32: [panels][K][16]; bfloat16:
// [panels][ceil(K/2)][16][2]. Columns past N and the k past K are zeros.
//
// On a CPU with AMX (Intel Xeon, Sapphire Rapids on) bfloat16 runs on tiles instead (amx_impl below): a
// bfloat16 panel is already the B operand TDPBF16PS reads (16 k-pairs x 16 columns x 2 = one 1 KB tile), and
// the instruction reduces each output of a tile row from that row and the B tile alone, in an order fixed by
// the hardware. Every forward (1 row or 650) goes through the same tiles, k-tile after k-tile, so a row's bits
// again depend on nothing but the row; 16 rows cost one TDPBF16PS, as one row does, which makes verifying a
// tree cost what a decode step costs. Its bits are not the VDPBF16PS path's (AMX treats bf16 denormals as
// zero, and sums inside a tile in its own order): a process uses one path for every forward, chosen once.

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

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "lanes.h"

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

template <class T, int NJc = NJ>
void tile(const T* w, int64_t pe, int nj, const T* x, int64_t ldx, int rows, int64_t s0, int64_t s1, float* acc,
          bool prefetch) {
  if (nj == NJc) return micro_rows<T, NJc>(w, pe, x, ldx, rows, s0, s1, acc, prefetch);
  if constexpr (NJc > 1) tile<T, NJc - 1>(w, pe, nj, x, ldx, rows, s0, s1, acc, prefetch);
}

inline int64_t ksteps(int64_t K, int width) { return (K + width - 1) / width; }

// Units [0, n) shared by the threads, claimed a chunk at a time from a counter rather than split in equal parts
// up front: a thread the system pauses (another program wants its core) then holds back one chunk, not half the
// product, and the threads still running take the rest. Each unit is computed the same way whoever claims it,
// so the bits do not depend on the thread count or on who ran what. `grain`: the fewest units worth a thread.
// setup() makes a thread's private state once; body(state, u0, u1) computes units u0 .. u1.
template <class Setup, class Body>
void claim_parallel(int64_t n, int64_t grain, Setup setup, Body body) {
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n / std::max<int64_t>(1, grain)));
  if (threads == 1) {
    auto state = setup();
    body(state, 0, n);
    return;
  }
  const int64_t chunk = std::max<int64_t>(1, n / (threads * 8));
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    auto state = setup();
    for (int64_t u0 = next.fetch_add(chunk); u0 < n; u0 = next.fetch_add(chunk)) body(state, u0, std::min(n, u0 + chunk));
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
  const int64_t groups = (panels + NJ - 1) / NJ;
  const int64_t row_blocks = (M + RMAX - 1) / RMAX;
  // Threads only for at least half a megabyte of weights each: waking them costs more on small matrices.
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 19) / (NJ * pe * static_cast<int64_t>(sizeof(T))));
  struct Buffers { std::vector<float> acc; std::vector<T> scratch; };
  const auto buffers = [&] {
    return Buffers{std::vector<float>(static_cast<size_t>(M) * NJ * 16),
                   std::vector<T>(static_cast<size_t>(NJ * src.scratch_elems(std::min(steps, KC))))};
  };
  claim_parallel(groups, grain, buffers, [&](Buffers& buf, int64_t g0, int64_t g1) {
    std::vector<float>& acc = buf.acc;
    std::vector<T>& scratch = buf.scratch;
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t p0 = g * NJ;
      const int nj = static_cast<int>(std::min<int64_t>(NJ, panels - p0));
      const int64_t cols = nj * 16;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t s0 = 0; s0 < steps; s0 += KC) {
        const int64_t s1 = std::min(steps, s0 + KC);
        int64_t stride, first;
        const T* w = src.panels(p0, nj, s0, s1, scratch.data(), stride, first);
        const T* xs = x + (s0 - first) * S::width;  // step `first` of w is step s0 of x
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

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
namespace amx {

// Linux hands a process the 8 KB tile state only when asked (arch/x86 xstate: ARCH_REQ_XCOMP_PERM); the
// answer holds for every thread of the process. Asked once: a refusal (an old kernel, a hypervisor that
// hides the state) or OOSPEC_NO_AMX leaves this process on the VDPBF16PS path for every forward, so its bits
// stay one path's.
inline bool permitted() {
  static const bool ok = [] {
    if (std::getenv("OOSPEC_NO_AMX")) return false;  // the VDPBF16PS path on an AMX CPU (tests, comparisons)
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return ok;
}

// Every tile row is 64 bytes: C rows x 16 float32, A rows x 32 bf16 (16 k-pairs), B 16 k-pairs x 16 columns x 2.
// `rows` (A and C) is 16, or M for a forward of M < 16 rows (a decode step reads one row of x per k-tile, not
// sixteen); each thread loads the configuration before its tiles.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
inline void configure(int rows) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) { c.colsb[t] = 64; c.rows[t] = t < 6 ? rows : 16; }
  _tile_loadconfig(&c);
}

constexpr int TILE_ROWS = 16, TILE_PAIRS = 16, TILE_ELEMS = TILE_PAIRS * 32;  // a B tile: 512 bf16
constexpr int PREFETCH_TILES = 8;

// Where block() reads its B tiles. Both give the same tiles, so the same instructions on the same values:
// `FilledPanels` reads panels made over the whole of K beforehand (a zero-padded copy of the last k-tile in `tail`
// where K is not a multiple of 32), `TileByTile` makes each k-tile of a regrouped weight just before it is used,
// into a ring of buffers that stays in L1, while the tiles of the last ones still run (a forward of at most 32
// rows reads each weight once: there is nothing to keep).
struct FilledPanels {
  const bf16* b[2];
  int64_t tiles;
  const bf16* tail;
  const bf16* get(int64_t t, int j) const { return tail && t == tiles - 1 ? tail + j * TILE_ELEMS : b[j] + t * TILE_ELEMS; }
  // the weights PREFETCH_TILES k-tiles ahead, a cache line at a time (a decode step waits on memory)
  void prefetch(int64_t t, int nb) const {
    for (int j = 0; j < nb; ++j)
      for (int l = 0; l < TILE_ELEMS; l += 32) __builtin_prefetch(b[j] + (t + PREFETCH_TILES) * TILE_ELEMS + l, 0, 2);
  }
};

// A ring of RING k-tiles: the tiles made for k-tile t are not overwritten until t + RING, so making the next ones
// never waits for the tile loads of this one to finish reading (a single buffer serializes the two).
constexpr int RING = 8;

// Tiles are made AHEAD k-tiles before they are loaded: a tile load right after the stores that wrote its bytes
// waits for them to reach the cache.
constexpr int AHEAD = 4;
static_assert(AHEAD < RING, "a tile is made before the one RING k-tiles earlier is loaded");

template <class Source>
struct TileByTile {
  const Source& src;
  int64_t p0;
  int64_t tiles;
  bf16* buf;  // RING x 2 tiles
  bf16* slot(int64_t t, int j) const { return buf + (t % RING * 2 + j) * TILE_ELEMS; }
  const bf16* get(int64_t t, int j) const {
    if (t == 0)
      for (int64_t u = 0; u < std::min<int64_t>(AHEAD, tiles); ++u) src.tile(p0 + j, u, slot(u, j));
    if (t + AHEAD < tiles) src.tile(p0 + j, t + AHEAD, slot(t + AHEAD, j));
    return slot(t, j);
  }
  void prefetch(int64_t, int) const {}  // the source prefetches its own stream
};

// Registers: C 0-3 (row block r, panel j: tmm 2r + j), A 4-5, B 6-7. RB row blocks x NB panels per k-tile,
// each A and B loaded once per k-tile and used NB / RB times.
template <int RB, int NB, class Tiles>
void block(const bf16* a, int64_t lda, int rows, const Tiles& b, int64_t tiles, float* c, int64_t ldc) {
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int64_t t = 0; t < tiles; ++t) {
    b.prefetch(t, NB);
    _tile_loadd(6, b.get(t, 0), 64);
    if constexpr (NB == 2) _tile_loadd(7, b.get(t, 1), 64);
    _tile_loadd(4, a + t * 32, lda * 2);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NB == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (RB == 2) {
      _tile_loadd(5, a + rows * lda + t * 32, lda * 2);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (NB == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, ldc * 4);
  if constexpr (NB == 2) _tile_stored(1, c + 16, ldc * 4);
  if constexpr (RB == 2) {
    _tile_stored(2, c + rows * ldc, ldc * 4);
    if constexpr (NB == 2) _tile_stored(3, c + rows * ldc + 16, ldc * 4);
  }
}

template <class Tiles>
void block_any(int rb, int nb, const bf16* a, int64_t lda, int rows, const Tiles& b, int64_t tiles, float* c) {
  if (rb == 2 && nb == 2) block<2, 2>(a, lda, rows, b, tiles, c, 32);
  else if (rb == 2) block<2, 1>(a, lda, rows, b, tiles, c, 32);
  else if (nb == 2) block<1, 2>(a, lda, rows, b, tiles, c, 32);
  else block<1, 1>(a, lda, rows, b, tiles, c, 32);
}

// x [M, K] (row stride ldx) through bfloat16 panels: rows padded with zeros to whole tiles, k to whole k-tiles.
template <class Source>
void amx_impl(const bf16* x, int64_t ldx, const Source& src, const bf16* bias, bf16* y, int64_t M, int64_t K,
              int64_t N) {
  const int64_t steps = ksteps(K, 2), pe = steps * 32, panels = (N + 15) / 16;
  const int64_t tiles = (steps + TILE_PAIRS - 1) / TILE_PAIRS, kp = tiles * 32;
  const int rows = static_cast<int>(std::min<int64_t>(M, TILE_ROWS));
  const int64_t mp = (M + rows - 1) / rows * rows;
  const bf16* a = x;
  int64_t lda = ldx;
  // Whole tiles: x's rows with zeros past K (they meet the panels' zero k-pairs). Rows past M are left as
  // earlier calls wrote them: a tile row's outputs read only that row, and those outputs are dropped.
  thread_local std::vector<bf16> padded;
  if (mp != M || kp != ldx) {
    if (padded.size() < static_cast<size_t>(mp * kp)) padded.resize(static_cast<size_t>(mp * kp));
    for (int64_t m = 0; m < M; ++m) {
      std::memcpy(padded.data() + m * kp, x + m * ldx, K * sizeof(bf16));
      std::memset(static_cast<void*>(padded.data() + m * kp + K), 0, (kp - K) * sizeof(bf16));
    }
    a = padded.data();
    lda = kp;
  }
  const int64_t groups = (panels + 1) / 2;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 19) / (2 * pe * static_cast<int64_t>(sizeof(bf16))));
  const int64_t tail_pairs = steps % TILE_PAIRS;
  struct Buffers {  // per thread: its tile configuration is loaded with them
    alignas(64) float c[2 * TILE_ROWS * 32];
    alignas(64) bf16 tail[2 * TILE_ELEMS];
    alignas(64) bf16 tiles[RING * 2 * TILE_ELEMS];  // TileByTile's ring
    std::vector<bf16> scratch;  // a quantized weight's two panels over the whole of K: C stays in its tiles
    ~Buffers() { _tile_release(); }  // the thread's tiles, configured when these were made
  };
  const auto buffers = [&] {
    configure(rows);
    return std::make_unique<Buffers>();  // scratch sized when a group needs it (not for TileByTile)
  };
  claim_parallel(groups, grain, buffers, [&](std::unique_ptr<Buffers>& buf, int64_t g0, int64_t g1) {
    float* c = buf->c;
    bf16* tail = buf->tail;
    std::vector<bf16>& scratch = buf->scratch;
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t p0 = 2 * g;
      const int nb = static_cast<int>(std::min<int64_t>(2, panels - p0));
      const bool one_pass = mp <= 2 * rows;  // one row-block pair: each weight is read once
      FilledPanels filled{};
      if (!(Source::tile_by_tile && one_pass)) {
        int64_t stride, first;
        scratch.resize(static_cast<size_t>(2 * src.scratch_elems(steps)));  // once per thread and product
        const bf16* base = src.panels(p0, nb, 0, steps, scratch.data(), stride, first);
        filled = {{base, base + (nb - 1) * stride}, tiles, tail_pairs ? tail : nullptr};
        if (tail_pairs) {
          std::memset(tail, 0, sizeof(buf->tail));
          for (int j = 0; j < nb; ++j)
            std::memcpy(tail + j * TILE_ELEMS, filled.b[j] + (tiles - 1) * TILE_ELEMS, tail_pairs * 32 * sizeof(bf16));
        }
      }
      for (int64_t m0 = 0; m0 < mp; m0 += 2 * rows) {
        const int rb = mp - m0 > rows ? 2 : 1;
        const bf16* am = a + m0 * lda;
        if constexpr (Source::tile_by_tile) {
          if (one_pass) block_any(rb, nb, am, lda, rows, TileByTile<Source>{src, p0, tiles, buf->tiles}, tiles, c);
          else block_any(rb, nb, am, lda, rows, filled, tiles, c);
        } else {
          block_any(rb, nb, am, lda, rows, filled, tiles, c);
        }
        const int64_t n0 = p0 * 16, nn = std::min<int64_t>(nb * 16, N - n0);
        for (int64_t m = m0; m < std::min(M, m0 + rb * rows); ++m)
          for (int64_t j = 0; j < nn; ++j) {
            float v = c[(m - m0) * 32 + j];
            if (bias) v += static_cast<float>(bias[n0 + j]);
            y[m * N + n0 + j] = bf16(v);
          }
      }
    }
  });
}

}  // namespace amx
#endif

// The path a bfloat16 forward takes in this process (one for all, see the top of this file).
inline bool bf16_on_tiles() {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  return amx::permitted();
#else
  return false;
#endif
}


// The operands of y = x w^T + b as run_linear takes them: x contiguous with whole k-steps (an odd K in bfloat16 gets
// a zero column, so the last pair is whole), the bias in x's dtype (undefined: none), y [M, N] to write.
struct LinearIO {
  torch::Tensor x, b, y;
  bool bf16;
  int64_t K;  // x's columns before the padding
};

inline LinearIO linear_io(torch::Tensor x, const c10::optional<torch::Tensor>& bias, int64_t N, const char* who) {
  TORCH_CHECK(x.dim() == 2, who, ": x [M, K]");
  const bool is_bf16 = x.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(is_bf16 || x.scalar_type() == torch::kFloat32, who, ": float32 or bfloat16 only");
  const int64_t K = x.size(1);
  if (is_bf16 && K % 2) x = torch::constant_pad_nd(x, {0, 1}, 0);
  x = x.contiguous();
  torch::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->to(x.scalar_type()).contiguous();
    TORCH_CHECK(b.numel() == N, who, ": bias must have N elements");
  }
  return {x, b, torch::empty({x.size(0), N}, x.options()), is_bf16, K};
}

// y = x w^T + b on the path this process takes for T (see the top of the file), operands from linear_io.
template <class T, class Source>
void run_linear(const LinearIO& io, const Source& src, int64_t N) {
  const int64_t M = io.x.size(0), ldx = io.x.size(1);
  const T* bias = io.b.defined() ? io.b.data_ptr<T>() : nullptr;
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if constexpr (std::is_same_v<T, bf16>)
    if (bf16_on_tiles())
      return amx::amx_impl(io.x.data_ptr<bf16>(), ldx, src, bias, io.y.data_ptr<bf16>(), M, io.K, N);
#endif
  packed_impl<T>(io.x.data_ptr<T>(), ldx, src, bias, io.y.data_ptr<T>(), M, io.K, N);
}

}  // namespace oospec
