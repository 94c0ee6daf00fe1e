// The AMX path of linear.h (its top comment says why tiles, and why their bits are a path of their own): tile
// configuration, the B tiles made from a weight (FilledPanels, TileByTile), the blocks of TDPBF16PS over them,
// the same products with the weight as the A operand for small forwards (weights_as_a), and amx_impl.

#pragma once

#include "vector_tiles.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>

namespace oospec {
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
// GCC's _tile_loadconfig is an asm statement that tells the compiler it reads 8 bytes of the configuration, so
// once inlined the stores of the other 56 may be dropped or moved past it (a #GP at LDTILECFG). Here the asm's
// operand is the whole configuration.
inline void load_config(const TileConfig& c) { asm volatile("ldtilecfg %0" : : "m"(c)); }
inline void configure(int rows) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) { c.colsb[t] = 64; c.rows[t] = t < 6 ? rows : 16; }
  load_config(c);
}
// weights_as_a's tiles: C (0-3) 16 outputs x `cols` rows of x, A (4-5) 16 outputs x 32 k, B (6-7) 16 k-pairs x `cols`.
inline void configure_weights_as_a(int cols) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) { c.colsb[t] = t == 4 || t == 5 ? 64 : 4 * cols; c.rows[t] = 16; }
  load_config(c);
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

// weights_as_a's A tiles made beforehand over the whole of K: panel j's k-tile t at a + (j tiles + t) TILE_ELEMS.
struct FilledRows {
  const bf16* a;
  int64_t tiles;
  const bf16* get(int64_t t, int j) const { return a + (j * tiles + t) * TILE_ELEMS; }
};

// A ring of RING k-tiles: the tiles made for k-tile t are not overwritten until t + RING, so making the next ones
// never waits for the tile loads of this one to finish reading (a single buffer serializes the two).
constexpr int RING = 8;

// Tiles are made AHEAD k-tiles before they are loaded: a tile load right after the stores that wrote its bytes
// waits for them to reach the cache.
constexpr int AHEAD = 4;
static_assert(AHEAD < RING, "a tile is made before the one RING k-tiles earlier is loaded");

template <class Source, bool Rows = false>  // Rows: the source's rows_tile (weights_as_a), else its tile
struct TileByTile {
  const Source& src;
  int64_t p0;
  int64_t tiles;
  bf16* buf;  // RING x 2 tiles
  bf16* slot(int64_t t, int j) const { return buf + (t % RING * 2 + j) * TILE_ELEMS; }
  void make(int64_t t, int j) const {
    if constexpr (Rows) src.rows_tile(p0 + j, t, slot(t, j));
    else src.tile(p0 + j, t, slot(t, j));
  }
  const bf16* get(int64_t t, int j) const {
    if (t == 0)
      for (int64_t u = 0; u < std::min<int64_t>(AHEAD, tiles); ++u) make(u, j);
    if (t + AHEAD < tiles) make(t + AHEAD, j);
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

// The same products with the operands' roles swapped, for a weight whose k-tiles its source makes as rows
// (RepackedSource::rows_tile: by lookup, half the instructions of a B tile): W's 16
// outputs x 32 k are the A tile, x's k-pairs x `cols` rows (1 for a decode step, else 16, zeros past M) the B tile,
// C holds outputs x rows. Each output still takes the same products, pair by pair, k-tile after k-tile (a
// bfloat16 product is exact, whichever operand holds which factor), so the bits are block()'s
// (tests/test_gguf_weights.py compares them with the packed expanded weight on every row count).
// xt: x's B tiles, rows block r's k-tile t at xt + r * blk_stride + t * 32 * cols. C tile 2r + j (rows block r,
// panel j) goes to c + (2r + j) * 16 * cols.
template <int RB, int NB, class Tiles>
void block_weights_as_a(const bf16* xt, int64_t blk_stride, int cols, const Tiles& w, int64_t tiles, float* c) {
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int64_t t = 0; t < tiles; ++t) {
    _tile_loadd(4, w.get(t, 0), 64);
    if constexpr (NB == 2) _tile_loadd(5, w.get(t, 1), 64);
    const bf16* b = xt + t * 32 * cols;
    _tile_loadd(6, b, 4 * cols);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NB == 2) _tile_dpbf16ps(1, 5, 6);
    if constexpr (RB == 2) {
      _tile_loadd(7, b + blk_stride, 4 * cols);
      _tile_dpbf16ps(2, 4, 7);
      if constexpr (NB == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, 4 * cols);
  if constexpr (NB == 2) _tile_stored(1, c + 16 * cols, 4 * cols);
  if constexpr (RB == 2) {
    _tile_stored(2, c + 32 * cols, 4 * cols);
    if constexpr (NB == 2) _tile_stored(3, c + 48 * cols, 4 * cols);
  }
}

template <class Tiles>
void block_weights_as_a_any(int rb, int nb, const bf16* xt, int64_t blk_stride, int cols, const Tiles& w,
                            int64_t tiles, float* c) {
  if (rb == 2 && nb == 2) block_weights_as_a<2, 2>(xt, blk_stride, cols, w, tiles, c);
  else if (rb == 2) block_weights_as_a<2, 1>(xt, blk_stride, cols, w, tiles, c);
  else if (nb == 2) block_weights_as_a<1, 2>(xt, blk_stride, cols, w, tiles, c);
  else block_weights_as_a<1, 1>(xt, blk_stride, cols, w, tiles, c);
}

// x's rows [M, K] (row stride lda, K a multiple of 32) as weights_as_a's B tiles: for rows block r (16 rows,
// zeros past M), its k-pairs x 16 rows, 32-bit units moved (transpose16); one row is its own B tiles (cols 1).
inline const bf16* x_as_b_tiles(const bf16* a, int64_t lda, int64_t M, int64_t K, int& cols, int64_t& blk_stride) {
  cols = M == 1 ? 1 : 16;
  blk_stride = K * cols;
  if (M == 1) return a;
  thread_local std::vector<uint32_t> xt, rows16;
  const int64_t pairs = K / 2, blocks = (M + 15) / 16;
  if (xt.size() < static_cast<size_t>(blocks * pairs * 16)) xt.resize(static_cast<size_t>(blocks * pairs * 16));
  for (int64_t r = 0; r < blocks; ++r) {
    const int64_t real = std::min<int64_t>(16, M - 16 * r);
    const void* src = a + 16 * r * lda;
    int64_t stride = lda / 2;
    if (real < 16) {  // a whole 16-row block: zeros past M
      rows16.assign(static_cast<size_t>(16 * pairs), 0u);
      for (int64_t m = 0; m < real; ++m) std::memcpy(rows16.data() + m * pairs, a + (16 * r + m) * lda, K * sizeof(bf16));
      src = rows16.data();
      stride = pairs;
    }
    transpose16(src, stride, pairs, xt.data() + r * pairs * 16);
  }
  return reinterpret_cast<const bf16*>(xt.data());
}

// One weight of a product over a shared x: y [M, N] = x w^T + bias (none: nullptr).
template <class Source> struct Job {
  Source src;
  const bf16* bias;
  bf16* y;
  int64_t N;
};

// x [M, K] (row stride ldx) through bfloat16 panels: rows padded with zeros to whole tiles, k to whole k-tiles.
// Several weights that read the same x (q, k and v; gate and up) go in one call: their panel pairs are one pool
// that the threads claim from, so a small weight (k, v) no longer runs on one thread while the other waits, and
// the threads wake once for all of them. Each output's products and order are its weight's alone: the same bits.
template <class Source>
void amx_impl_jobs(const bf16* x, int64_t ldx, const Job<Source>* jobs, int njobs, int64_t M, int64_t K) {
  const int64_t steps = ksteps(K, 2), pe = steps * 32;
  const int64_t tiles = (steps + TILE_PAIRS - 1) / TILE_PAIRS, kp = tiles * 32;
  // Rows per A tile: as few blocks as 16-row tiles allow, balanced (17 rows: two of 9, not 16 and 1). A tile's
  // TDPBF16PS takes time by its rows, and each output row's products are the same in any block: the same bits.
  const int64_t blocks = (M + TILE_ROWS - 1) / TILE_ROWS;
  const int rows = static_cast<int>((M + blocks - 1) / blocks);
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
  // job j's panel pairs are groups first[j] .. first[j + 1] - 1 of the pool
  int64_t first[8];
  TORCH_CHECK(njobs >= 1 && njobs < 8, "amx_impl_jobs: 1 to 7 weights");
  first[0] = 0;
  for (int j = 0; j < njobs; ++j) first[j + 1] = first[j] + ((jobs[j].N + 15) / 16 + 1) / 2;
  const int64_t groups = first[njobs];
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 19) / (2 * pe * static_cast<int64_t>(sizeof(bf16))));
  const int64_t tail_pairs = steps % TILE_PAIRS;
  const bool one_pass = mp <= 2 * rows;  // one row-block pair: each weight is read once
  // which weights take weights_as_a: the tile configuration differs, so a thread loads it again on a change
  bool as_a[8] = {}, any_as_a = false;
  if constexpr (Source::tile_by_tile)
    for (int j = 0; j < njobs; ++j) any_as_a |= as_a[j] = !tail_pairs && jobs[j].src.rows_tiles();
  int xcols = 0;
  int64_t blk_stride = 0;
  const bf16* xt = any_as_a ? x_as_b_tiles(a, lda, M, K, xcols, blk_stride) : nullptr;
  const int64_t xblocks = M == 1 ? 1 : (M + 15) / 16;
  struct Buffers {  // per thread, with the tile configuration it loaded (configure_for, before its first tiles)
    alignas(64) float c[2 * TILE_ROWS * 32];
    alignas(64) float rows[16 * 16];  // a C tile of weights_as_a turned to rows x outputs
    alignas(64) bf16 tail[2 * TILE_ELEMS];
    alignas(64) bf16 tiles[RING * 2 * TILE_ELEMS];  // TileByTile's ring
    std::vector<bf16> scratch;  // a quantized weight's two panels over the whole of K: C stays in its tiles
    int as_a = -1;  // the tile configuration loaded: weights_as_a's (1), block()'s (0), none yet (-1)
    void configure_for(bool weights_as_a, int xcols, int tile_rows) {
      if (as_a == int(weights_as_a)) return;
      if (weights_as_a) configure_weights_as_a(xcols);
      else configure(tile_rows);
      as_a = weights_as_a;
    }
    ~Buffers() { if (as_a >= 0) _tile_release(); }
  };
  const auto buffers = [&] { return std::make_unique<Buffers>(); };  // scratch sized when a group needs it
  // weights_as_a, one panel pair (p0, nb panels): every pair of rows blocks through its A tiles, into y. A forward of
  // more than 32 rows makes the pair's A tiles once, over the whole of K; a smaller one makes them as it goes.
  const auto weights_as_a_pair = [&](Buffers& buf, const Source& src, const bf16* bias, bf16* y, int64_t N,
                                     int64_t p0, int nb) {
    if constexpr (Source::tile_by_tile) {
      if (!one_pass) {
        buf.scratch.resize(static_cast<size_t>(2 * src.scratch_elems(steps)));  // once per thread and product
        for (int j = 0; j < nb; ++j)
          for (int64_t t = 0; t < tiles; ++t) src.rows_tile(p0 + j, t, buf.scratch.data() + (j * tiles + t) * TILE_ELEMS);
      }
      const int64_t n0 = p0 * 16, nn = std::min<int64_t>(nb * 16, N - n0);
      for (int64_t r0 = 0; r0 < xblocks; r0 += 2) {
        const int rb = xblocks - r0 > 1 ? 2 : 1;
        const bf16* xr = xt + r0 * blk_stride;
        if (one_pass)
          block_weights_as_a_any(rb, nb, xr, blk_stride, xcols, TileByTile<Source, true>{src, p0, tiles, buf.tiles},
                                 tiles, buf.c);
        else
          block_weights_as_a_any(rb, nb, xr, blk_stride, xcols, FilledRows{buf.scratch.data(), tiles}, tiles, buf.c);
        for (int r = 0; r < rb; ++r)
          for (int j = 0; j < nb; ++j) {
            // C tile 2r + j is outputs x rows; as rows x outputs (moved, not converted) for y's rows
            const float* tile = buf.c + (2 * r + j) * 16 * xcols;
            if (xcols > 1) {
              transpose16(tile, 16, 16, reinterpret_cast<uint32_t*>(buf.rows));
              tile = buf.rows;
            }
            const int64_t nj = std::min<int64_t>(16, nn - 16 * j), m0 = 16 * (r0 + r);
            for (int64_t m = m0; m < std::min<int64_t>(M, m0 + 16); ++m)
              for (int64_t f = 0; f < nj; ++f) {
                float v = tile[(m - m0) * 16 + f];
                if (bias) v += static_cast<float>(bias[n0 + 16 * j + f]);
                y[m * N + n0 + 16 * j + f] = bf16(v);
              }
          }
      }
    }
  };
  claim_parallel(groups, grain, buffers, [&](std::unique_ptr<Buffers>& buf, int64_t g0, int64_t g1) {
    float* c = buf->c;
    bf16* tail = buf->tail;
    std::vector<bf16>& scratch = buf->scratch;
    int j = 0;
    for (int64_t g = g0; g < g1; ++g) {
      while (g >= first[j + 1]) ++j;
      const Source& src = jobs[j].src;
      const bf16* bias = jobs[j].bias;
      bf16* y = jobs[j].y;
      const int64_t N = jobs[j].N, panels = (N + 15) / 16, p0 = 2 * (g - first[j]);
      const int nb = static_cast<int>(std::min<int64_t>(2, panels - p0));
      const int64_t n0 = p0 * 16, nn = std::min<int64_t>(nb * 16, N - n0);
      buf->configure_for(as_a[j], xcols, rows);
      if (as_a[j]) {
        weights_as_a_pair(*buf, src, bias, y, N, p0, nb);
        continue;
      }
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

template <class Source>
void amx_impl(const bf16* x, int64_t ldx, const Source& src, const bf16* bias, bf16* y, int64_t M, int64_t K,
              int64_t N) {
  const Job<Source> job{src, bias, y, N};
  amx_impl_jobs(x, ldx, &job, 1, M, K);
}

}  // namespace amx

}  // namespace oospec
#endif
