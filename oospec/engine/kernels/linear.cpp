// The row-invariant linear layer, y[m, n] = sum_k x[m, k] w[n, k] (+ b[n]), over a weight packed once.
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

#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "lanes.h"
#include "quants.h"
#include "repack.h"
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

struct QuantRows {
  const uint8_t* raw;  // row n's blocks at raw + n * row_stride
  int64_t row_stride;
  int type;
  int64_t N, K;
  static constexpr bool prefetch = false;  // the buffer is in cache; the blocks stream in row order
  static constexpr bool tile_by_tile = false;

  // Panels p0 .. p0+nj-1 over k-steps s0 .. s1, in pack_linear's layout, rounded to T as torch rounds a float32
  // weight to T; rows past N and k past K are zeros, as in pack_linear. A panel's 16 rows are dequantized row by
  // row (each row's blocks in order) into `rows16` [16][SUB], SUB elements at a time, then written k-major: one
  // contiguous 16-wide store per k instead of 16 stores to 16 cache lines.
  static constexpr int64_t SUB = 1024;  // elements per row per pass: whole blocks (quants.h's are at most 256)
  template <class T>
  void fill(int64_t p0, int nj, int64_t s0, int64_t s1, T* out, float* rows16) const {
    constexpr int width = PStep<T>::width, step = PStep<T>::panel_step;
    const int64_t span = s1 - s0, k1 = std::min(s1 * width, K);
    for (int j = 0; j < nj; ++j) {
      T* panel = out + j * span * step;
      for (int64_t a = s0 * width; a < s0 * width + span * width; a += SUB) {
        const int64_t len = std::max<int64_t>(0, std::min(a + SUB, k1) - a);  // k past K (odd K): zeros
        const int64_t cover = std::min(SUB, s0 * width + span * width - a);
        for (int l = 0; l < 16; ++l) {
          const int64_t n = (p0 + j) * 16 + l;
          float* r = rows16 + l * SUB;
          if (n < N && len) quants::dequantize_range(type, raw + n * row_stride, a, a + len, r);
          else std::fill(r, r + len, 0.f);
          std::fill(r + len, r + cover, 0.f);
        }
        // k-step c of the panel is, for each row l, one 32-bit unit of that row: a float32, or a bfloat16 pair
        uint32_t* dst = reinterpret_cast<uint32_t*>(panel + (a - s0 * width) / width * step);
        if constexpr (width == 1) {
          transpose16(rows16, SUB, cover, dst);
        } else {
          alignas(64) uint16_t bits[16 * SUB];  // row l's bfloat16, read back as pairs
          for (int l = 0; l < 16; ++l) round_bf16(rows16 + l * SUB, cover, bits + l * SUB);
          transpose16(bits, SUB / 2, cover / 2, dst);
        }
      }
    }
  }
};

template <class T> struct QuantSource : QuantRows {
  int64_t scratch_elems(int64_t steps) const { return steps * PStep<T>::panel_step; }  // per panel
  const T* panels(int64_t p0, int nj, int64_t s0, int64_t s1, T* scratch, int64_t& stride, int64_t& first) const {
    thread_local std::vector<float> rows16(16 * SUB);
    fill<T>(p0, nj, s0, s1, scratch, rows16.data());
    stride = (s1 - s0) * PStep<T>::panel_step;
    first = 0;
    return scratch;
  }
};

// Panels made from GGUF blocks regrouped by 16 rows at load (repack.h): vector loads, no transpose.
template <class T> struct RepackedSource {
  const uint8_t* packed;  // panel p at packed + p * panel_bytes
  int64_t panel_bytes;
  int type;
  static constexpr bool prefetch = false;  // the scratch is in cache; the regrouped panels stream in order
  static constexpr bool tile_by_tile = true;
  int64_t scratch_elems(int64_t steps) const { return steps * PStep<T>::panel_step; }  // per panel
  // k-tile t (k 32t .. 32t + 31) of panel p as bfloat16 pairs: one AMX B tile
  void tile(int64_t p, int64_t t, T* out) const { repack::fill<true>(type, packed + p * panel_bytes, 32 * t, 32 * t + 32, out); }
  const T* panels(int64_t p0, int nj, int64_t s0, int64_t s1, T* scratch, int64_t& stride, int64_t& first) const {
    constexpr int width = PStep<T>::width;
    stride = (s1 - s0) * PStep<T>::panel_step;
    first = 0;
    for (int j = 0; j < nj; ++j)
      repack::fill<width == 2>(type, packed + (p0 + j) * panel_bytes, s0 * width, s1 * width, scratch + j * stride);
    return scratch;
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

}  // namespace oospec

using namespace oospec;

std::string linear_isa() {
  return bf16_on_tiles() ? "amx_bf16" : "";
}

// w [N, K] -> its panels (see the layout above), a flat tensor of w's dtype.
torch::Tensor pack_linear(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2, "pack_linear: w [N, K]");
  w = w.contiguous();
  const int64_t N = w.size(0), K = w.size(1), panels = (N + 15) / 16;
  const int width = w.scalar_type() == torch::kBFloat16 ? 2 : 1;
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 || w.scalar_type() == torch::kFloat32, "pack_linear: dtype");
  const int64_t steps = ksteps(K, width), pe = steps * 16 * width;
  auto out = torch::zeros({panels * pe}, w.options());
  const int64_t esz = w.element_size();
  const char* src = static_cast<const char*>(w.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  at::parallel_for(0, panels, 1, [&](int64_t a, int64_t b) {
    for (int64_t p = a; p < b; ++p)
      for (int64_t l = 0; l < 16 && p * 16 + l < N; ++l) {
        const char* row = src + (p * 16 + l) * K * esz;
        for (int64_t k = 0; k < K; ++k)
          std::memcpy(dst + (p * pe + (k / width) * 16 * width + l * width + k % width) * esz, row + k * esz, esz);
      }
  });
  return out;
}

// y = x w^T + b on the path this process takes for T (see the top of the file), x padded to whole k-steps.
template <class T, class Source>
void run_linear(const torch::Tensor& x, int64_t K, const Source& src, const torch::Tensor& b, torch::Tensor& y,
                int64_t N) {
  const int64_t M = x.size(0), ldx = x.size(1);
  const T* bias = b.defined() ? b.data_ptr<T>() : nullptr;
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if constexpr (std::is_same_v<T, bf16>)
    if (bf16_on_tiles()) return amx::amx_impl(x.data_ptr<bf16>(), ldx, src, bias, y.data_ptr<bf16>(), M, K, N);
#endif
  packed_impl<T>(x.data_ptr<T>(), ldx, src, bias, y.data_ptr<T>(), M, K, N);
}

// x [M, K] through panels made by pack_linear from a [N, K] weight.
torch::Tensor linear_packed(torch::Tensor x, torch::Tensor wp, c10::optional<torch::Tensor> bias, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && wp.dim() == 1, "linear_packed: x [M, K], packed weight flat");
  TORCH_CHECK(x.scalar_type() == wp.scalar_type(), "linear_packed: x and w must share a dtype");
  TORCH_CHECK(wp.is_contiguous(), "linear_packed: packed weight must be contiguous");
  const int64_t M = x.size(0), K = x.size(1);
  const bool is_bf16 = x.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(is_bf16 || x.scalar_type() == torch::kFloat32, "linear_packed: float32 or bfloat16 only");
  const int width = is_bf16 ? 2 : 1;
  TORCH_CHECK(wp.numel() == (N + 15) / 16 * ksteps(K, width) * 16 * width, "linear_packed: packed size");
  // rows are read a k-step at a time: an odd K in bfloat16 gets a zero column so the last pair is whole
  if (K % width) x = torch::constant_pad_nd(x, {0, 1}, 0);
  x = x.contiguous();
  auto y = torch::empty({M, N}, x.options());
  torch::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->to(x.scalar_type()).contiguous();
    TORCH_CHECK(b.numel() == N, "linear_packed: bias must have N elements");
  }
  const int64_t pe = ksteps(K, width) * 16 * width;
  if (!is_bf16)
    run_linear<float>(x, K, Prepacked<float>{wp.data_ptr<float>(), pe}, b, y, N);
  else
    run_linear<bf16>(x, K, Prepacked<bf16>{wp.data_ptr<bf16>(), pe}, b, y, N);
  return y;
}

// The same order for a plain [N, K] weight, packed on the fly (tests, and weights nobody packed).
torch::Tensor linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "linear: x [M, K] and w [N, K]");
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "linear: x and w must share a dtype");
  return linear_packed(x, pack_linear(w), bias, w.size(0));
}

// ---- GGUF weights, dequantized inside the product ----------------------------------------------------------
// raw [N, row bytes]: each row the blocks of one output's weights, in the GGUF's own encoding (quants.h).

namespace {
int64_t checked_row_bytes(const torch::Tensor& raw, int type, int64_t K, const char* who) {
  const quants::Layout l = quants::layout(type);
  TORCH_CHECK(l.elems > 0, who, ": GGUF type ", type, " is not one these kernels read");
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == torch::kUInt8 && raw.stride(1) == 1,
              who, ": raw [N, row bytes] uint8, rows contiguous");
  TORCH_CHECK(K % l.elems == 0 && raw.size(1) == K / l.elems * l.bytes, who, ": ", K,
              " elements per row do not fill rows of ", raw.size(1), " bytes of type ", type);
  return raw.stride(0);
}
}  // namespace

// float32 [N, K]: every element as gguf-py dequantizes it.
torch::Tensor dequantize(torch::Tensor raw, int64_t type, int64_t K) {
  const int64_t stride = checked_row_bytes(raw, static_cast<int>(type), K, "dequantize");
  auto out = torch::empty({raw.size(0), K}, torch::kFloat32);
  const uint8_t* src = raw.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, raw.size(0), 16, [&](int64_t a, int64_t b) {
    for (int64_t n = a; n < b; ++n) quants::dequantize_range(static_cast<int>(type), src + n * stride, 0, K, dst + n * K);
  });
  return out;
}

// x [M, K] times a GGUF weight [N, K] held as raw blocks: the bits linear_packed gives for the weight
// dequantized to float32 (and rounded to bfloat16 for a bfloat16 x), on the same path and in the same order.
torch::Tensor linear_quant(torch::Tensor x, torch::Tensor raw, int64_t type, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2, "linear_quant: x [M, K]");
  const int64_t M = x.size(0), K = x.size(1), N = raw.size(0);
  const int64_t stride = checked_row_bytes(raw, static_cast<int>(type), K, "linear_quant");
  const bool is_bf16 = x.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(is_bf16 || x.scalar_type() == torch::kFloat32, "linear_quant: float32 or bfloat16 only");
  const int width = is_bf16 ? 2 : 1;
  // a chunk of k-steps (KC) must hold whole blocks: quants.h's blocks are at most 256 elements
  static_assert(KC % 256 == 0, "KC k-steps must hold whole GGUF blocks");
  if (K % width) x = torch::constant_pad_nd(x, {0, 1}, 0);
  x = x.contiguous();
  auto y = torch::empty({M, N}, x.options());
  torch::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->to(x.scalar_type()).contiguous();
    TORCH_CHECK(b.numel() == N, "linear_quant: bias must have N elements");
  }
  const QuantRows rows{raw.data_ptr<uint8_t>(), stride, static_cast<int>(type), N, K};
  if (!is_bf16) run_linear<float>(x, K, QuantSource<float>{rows}, b, y, N);
  else run_linear<bf16>(x, K, QuantSource<bf16>{rows}, b, y, N);
  return y;
}

// ---- GGUF blocks regrouped by 16 rows (repack.h) -----------------------------------------------------------

namespace {
// A decode step streams every weight once: with 4 KB pages that is a TLB miss every 4 KB, and the prefetches
// ahead of the stream miss too. Ask for 2 MB pages (transparent huge pages, where the kernel offers them on
// request) before the buffer is first written.
void huge_pages(void* p, int64_t bytes) {
#if defined(__linux__)
  constexpr uintptr_t HUGE = uintptr_t(2) << 20;
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + HUGE - 1) & ~(HUGE - 1);
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes)) & ~(HUGE - 1);
  if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_HUGEPAGE);
#else
  (void)p; (void)bytes;
#endif
}

repack::Format checked_format(int64_t type, int64_t K, const char* who) {
  const repack::Format f = repack::format(static_cast<int>(type));
  TORCH_CHECK(f.group > 0, who, ": GGUF type ", type, " is not regrouped");
  TORCH_CHECK(K % f.super == 0, who, ": K = ", K, " is not a multiple of the type's block of ", f.super);
  return f;
}
}  // namespace

// raw [N, row bytes] GGUF blocks -> the regrouped panels (flat uint8). Refuses a weight with a scale that is not
// finite (its caller keeps the file's blocks and linear_quant for it).
torch::Tensor repack_quant(torch::Tensor raw, int64_t type, int64_t K) {
  const int64_t stride = checked_row_bytes(raw, static_cast<int>(type), K, "repack_quant");
  const repack::Format f = checked_format(type, K, "repack_quant");
  const int64_t N = raw.size(0), panels = (N + 15) / 16, pb = repack::panel_bytes(f, K);
  auto out = torch::empty({panels * pb}, torch::kUInt8);
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  huge_pages(dst, panels * pb);
  std::atomic<bool> finite{true};
  at::parallel_for(0, panels, 16, [&](int64_t a, int64_t b) {
    for (int64_t p = a; p < b; ++p)
      if (!repack::pack_panel(static_cast<int>(type), src, stride, N, K, p, dst + p * pb)) finite = false;
  });
  TORCH_CHECK(finite.load(), "repack_quant: a block scale is not finite");
  return out;
}

// x [M, K] times a regrouped weight [N, K]: the bits linear_quant (and linear_packed over the dequantized weight)
// gives, on the same path and in the same order.
torch::Tensor linear_repacked(torch::Tensor x, torch::Tensor packed, int64_t type, int64_t N,
                              c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 1 && packed.scalar_type() == torch::kUInt8 && packed.is_contiguous(),
              "linear_repacked: x [M, K], packed flat uint8");
  const int64_t M = x.size(0), K = x.size(1);
  const repack::Format f = checked_format(type, K, "linear_repacked");
  const int64_t pb = repack::panel_bytes(f, K);
  TORCH_CHECK(packed.numel() == (N + 15) / 16 * pb, "linear_repacked: ", packed.numel(), " bytes do not hold [", N,
              ", ", K, "] of type ", type);
  const bool is_bf16 = x.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(is_bf16 || x.scalar_type() == torch::kFloat32, "linear_repacked: float32 or bfloat16 only");
  x = x.contiguous();  // K is a multiple of the group (16 or 32): whole bfloat16 pairs
  auto y = torch::empty({M, N}, x.options());
  torch::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->to(x.scalar_type()).contiguous();
    TORCH_CHECK(b.numel() == N, "linear_repacked: bias must have N elements");
  }
  const uint8_t* p = packed.data_ptr<uint8_t>();
  if (!is_bf16) run_linear<float>(x, K, RepackedSource<float>{p, pb, static_cast<int>(type)}, b, y, N);
  else run_linear<bf16>(x, K, RepackedSource<bf16>{p, pb, static_cast<int>(type)}, b, y, N);
  return y;
}

// float32 [len(rows), K]: rows `rows` (int64) of a regrouped weight [N, K], as gguf-py dequantizes them (the
// embedding's lookups, and the tests).
torch::Tensor dequantize_repacked(torch::Tensor packed, int64_t type, int64_t N, int64_t K, torch::Tensor rows) {
  const repack::Format f = checked_format(type, K, "dequantize_repacked");
  const int64_t pb = repack::panel_bytes(f, K);
  TORCH_CHECK(packed.dim() == 1 && packed.numel() == (N + 15) / 16 * pb, "dequantize_repacked: packed size");
  rows = rows.to(torch::kInt64).contiguous();
  const int64_t R = rows.numel();
  const int64_t* ids = rows.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) TORCH_CHECK(ids[r] >= 0 && ids[r] < N, "dequantize_repacked: row ", ids[r], " of ", N);
  auto out = torch::empty({R, K}, torch::kFloat32);
  const uint8_t* p = packed.data_ptr<uint8_t>();
  float* y = out.data_ptr<float>();
  at::parallel_for(0, R, 8, [&](int64_t a, int64_t b) {
    std::vector<float> group(static_cast<size_t>(f.group) * 16);
    for (int64_t r = a; r < b; ++r) {
      const uint8_t* panel = p + ids[r] / 16 * pb;
      const int lane = static_cast<int>(ids[r] % 16);
      for (int64_t k0 = 0; k0 < K; k0 += f.group) {
        repack::fill<false>(static_cast<int>(type), panel, k0, k0 + f.group, group.data());
        for (int k = 0; k < f.group; ++k) y[r * K + k0 + k] = group[k * 16 + lane];
      }
    }
  });
  return out;
}
