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

#include "amx.h"

namespace oospec {

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
