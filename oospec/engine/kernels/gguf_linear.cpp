// The row-invariant linear layer over GGUF weights, dequantized inside the product: from the file's own blocks
// (linear_quant, QuantRows) or from blocks regrouped by 16 rows at load (repack_quant, linear_repacked,
// RepackedSource; repack.h). Both make the panels linear.h's tiles read: the expanded weight's bits.

#include "linear.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "quants.h"
#include "repack.h"
#include "transpose.h"

namespace oospec {

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
#if defined(__AVX512BF16__)
  // the same k-tile as the A operand's rows (linear.h, weights_as_a), for the types that make it by lookup
  bool rows_tiles() const { return repack::rows_by_lookup(type); }
  void rows_tile(int64_t p, int64_t t, T* out) const {
    repack::fill_rows(type, packed + p * panel_bytes, 32 * t, reinterpret_cast<uint16_t*>(out));
  }
#else
  bool rows_tiles() const { return false; }
  void rows_tile(int64_t, int64_t, T*) const {}
#endif
  const T* panels(int64_t p0, int nj, int64_t s0, int64_t s1, T* scratch, int64_t& stride, int64_t& first) const {
    constexpr int width = PStep<T>::width;
    stride = (s1 - s0) * PStep<T>::panel_step;
    first = 0;
    for (int j = 0; j < nj; ++j)
      repack::fill<width == 2>(type, packed + (p0 + j) * panel_bytes, s0 * width, s1 * width, scratch + j * stride);
    return scratch;
  }
};

}  // namespace oospec

using namespace oospec;

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
  const int64_t K = x.size(1), N = raw.size(0);
  const int64_t stride = checked_row_bytes(raw, static_cast<int>(type), K, "linear_quant");
  // a chunk of k-steps (KC) must hold whole blocks: quants.h's blocks are at most 256 elements
  static_assert(KC % 256 == 0 && KC1 % 256 == 0, "KC and KC1 k-steps must hold whole GGUF blocks");
  const LinearIO io = linear_io(x, bias, N, "linear_quant");
  const QuantRows rows{raw.data_ptr<uint8_t>(), stride, static_cast<int>(type), N, K};
  if (!io.bf16) run_linear<float>(io, QuantSource<float>{rows}, N);
  else run_linear<bf16>(io, QuantSource<bf16>{rows}, N);
  return io.y;
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
  const int64_t K = x.size(1);
  const repack::Format f = checked_format(type, K, "linear_repacked");
  const int64_t pb = repack::panel_bytes(f, K);
  TORCH_CHECK(packed.numel() == (N + 15) / 16 * pb, "linear_repacked: ", packed.numel(), " bytes do not hold [", N,
              ", ", K, "] of type ", type);
  const LinearIO io = linear_io(x, bias, N, "linear_repacked");  // K: whole groups, so whole bfloat16 pairs
  const uint8_t* p = packed.data_ptr<uint8_t>();
  if (!io.bf16) run_linear<float>(io, RepackedSource<float>{p, pb, static_cast<int>(type)}, N);
  else run_linear<bf16>(io, RepackedSource<bf16>{p, pb, static_cast<int>(type)}, N);
  return io.y;
}

// x [M, K] times several regrouped weights [N_j, K] (q, k and v; gate and up): for each, what linear_repacked gives.
// On AMX one pool of work for all (amx.h amx_impl_jobs), elsewhere one product after another.
std::vector<torch::Tensor> linear_repacked_many(torch::Tensor x, std::vector<torch::Tensor> packed, std::vector<int64_t> types,
                                                std::vector<int64_t> Ns, std::vector<c10::optional<torch::Tensor>> biases) {
  const size_t n = packed.size();
  TORCH_CHECK(n >= 1 && n < 8 && types.size() == n && Ns.size() == n && biases.size() == n,
              "linear_repacked_many: 1 to 7 weights, a type, N and bias (or None) for each");
  TORCH_CHECK(x.dim() == 2, "linear_repacked_many: x [M, K]");
  const int64_t K = x.size(1);
  std::vector<int64_t> pb(n);
  for (size_t j = 0; j < n; ++j) {
    pb[j] = repack::panel_bytes(checked_format(types[j], K, "linear_repacked_many"), K);
    TORCH_CHECK(packed[j].dim() == 1 && packed[j].scalar_type() == torch::kUInt8 && packed[j].is_contiguous() &&
                packed[j].numel() == (Ns[j] + 15) / 16 * pb[j], "linear_repacked_many: weight ", j, " is not [", Ns[j],
                ", ", K, "] of type ", types[j]);
  }
  std::vector<torch::Tensor> ys;
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if (x.scalar_type() == torch::kBFloat16 && bf16_on_tiles()) {
    std::vector<LinearIO> io;
    std::vector<amx::Job<RepackedSource<bf16>>> jobs;
    for (size_t j = 0; j < n; ++j) {
      io.push_back(linear_io(x, biases[j], Ns[j], "linear_repacked_many"));
      const LinearIO& o = io.back();
      jobs.push_back({RepackedSource<bf16>{packed[j].data_ptr<uint8_t>(), pb[j], static_cast<int>(types[j])},
                      o.b.defined() ? o.b.data_ptr<bf16>() : nullptr, o.y.data_ptr<bf16>(), Ns[j]});
    }
    const LinearIO& o = io.front();  // the same x for all
    amx::amx_impl_jobs(o.x.data_ptr<bf16>(), o.x.size(1), jobs.data(), static_cast<int>(n), o.x.size(0), o.K);
    for (const LinearIO& each : io) ys.push_back(each.y);
    return ys;
  }
#endif
  for (size_t j = 0; j < n; ++j) ys.push_back(linear_repacked(x, packed[j], types[j], Ns[j], biases[j]));
  return ys;
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
