// The row-invariant linear layer over dense weights: pack_linear makes a weight's panels once, linear_packed
// multiplies through them (linear.h: the layout, the tiles, and why their order is fixed).

#include "linear.h"

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

// x [M, K] through panels made by pack_linear from a [N, K] weight.
torch::Tensor linear_packed(torch::Tensor x, torch::Tensor wp, c10::optional<torch::Tensor> bias, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && wp.dim() == 1, "linear_packed: x [M, K], packed weight flat");
  TORCH_CHECK(x.scalar_type() == wp.scalar_type(), "linear_packed: x and w must share a dtype");
  TORCH_CHECK(wp.is_contiguous(), "linear_packed: packed weight must be contiguous");
  const LinearIO io = linear_io(x, bias, N, "linear_packed");
  const int64_t K = io.K;
  const int width = io.bf16 ? 2 : 1;
  TORCH_CHECK(wp.numel() == (N + 15) / 16 * ksteps(K, width) * 16 * width, "linear_packed: packed size");
  const int64_t pe = ksteps(K, width) * 16 * width;
  if (!io.bf16) run_linear<float>(io, Prepacked<float>{wp.data_ptr<float>(), pe}, N);
  else run_linear<bf16>(io, Prepacked<bf16>{wp.data_ptr<bf16>(), pe}, N);
  return io.y;
}

// The same order for a plain [N, K] weight, packed on the fly (tests, and weights nobody packed).
torch::Tensor linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "linear: x [M, K] and w [N, K]");
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "linear: x and w must share a dtype");
  return linear_packed(x, pack_linear(w), bias, w.size(0));
}
