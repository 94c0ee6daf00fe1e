// Row-invariant CPU kernels for the forwards after the prefill (decode and tree verification).
//
// Why: a verification forward of k rows must give each row the very bits a 1-row decode forward gives it,
// or speculative output can differ from plain greedy decoding. Stock GEMMs choose their blocking, and so
// their summation order, from the row count (MKL float32 differs already at 2 rows). Here every output is
// reduced in one fixed order that depends on nothing but its own inputs:
//   * linear layers (linear.cpp): the 16 lanes of a vector are 16 outputs; each output's lane takes its
//     products in increasing k, one fused multiply-add per k (float32) or one VDPBF16PS per pair of k
//     (bfloat16; pair element 2i+1 then 2i with float32 FMA where the instruction is missing).
//   * other dot products (norms, attention scores): 16 float32 lane accumulators, lane l takes elements
//     k = l (mod 16) in increasing k with fused multiply-add, then the lanes are summed as (l, l+8),
//     (l, l+4), (l, l+2), (0, 1).
//   * attention: keys a row may see are visited in slot order, masked slots skipped (never added as zeros),
//     so a tree node and the same token decoded alone sum the same keys in the same order; exp is one
//     polynomial of IEEE basic operations (exp_fixed), identical in vector and scalar code.
//   * norms and activations: row-wise, element-wise, the same formulas.
// Rows and outputs are split over threads, a reduction never is: results do not depend on the thread count.
// Compiled with -ffp-contract=off so the compiler fuses nothing the source does not.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lanes.h"

// linear.cpp
torch::Tensor pack_linear(torch::Tensor w);
torch::Tensor linear_packed(torch::Tensor x, torch::Tensor wp, c10::optional<torch::Tensor> bias, int64_t N);
std::string linear_isa();
torch::Tensor linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias);
torch::Tensor dequantize(torch::Tensor raw, int64_t type, int64_t K);
torch::Tensor linear_quant(torch::Tensor x, torch::Tensor raw, int64_t type, c10::optional<torch::Tensor> bias);
torch::Tensor repack_quant(torch::Tensor raw, int64_t type, int64_t K);
torch::Tensor linear_repacked(torch::Tensor x, torch::Tensor packed, int64_t type, int64_t N,
                              c10::optional<torch::Tensor> bias);
std::vector<torch::Tensor> linear_repacked_many(torch::Tensor x, std::vector<torch::Tensor> packed, std::vector<int64_t> types,
                                                std::vector<int64_t> Ns, std::vector<c10::optional<torch::Tensor>> biases);
torch::Tensor dequantize_repacked(torch::Tensor packed, int64_t type, int64_t N, int64_t K, torch::Tensor rows);

namespace {

using namespace oospec;

// 16 elements from p, zeros past n (the tail of a row), in the same lanes as a full load.
template <class T> inline V16 load16_tail(const T* p, int64_t n) {
  T buf[16];
  for (int l = 0; l < 16; ++l) buf[l] = l < n ? p[l] : T(0.f);
  return load16(buf);
}

// Fixed-order dot product of a and b (k elements): the lane order of the file's header.
template <class T> inline float dot16(const T* a, const T* b, int64_t k) {
  V16 acc = zero16();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) acc = fma16(load16(a + i), load16(b + i), acc);
  if (i < k) acc = fma16(load16_tail(a + i, k - i), load16_tail(b + i, k - i), acc);
  return hsum16(acc);
}

// ---- exp as one polynomial of IEEE basic operations --------------------------------------------------------
// Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then a degree-7 Taylor polynomial (error < 2 ulp).
// exp_fixed (one element) and exp16 (16 lanes) run the same operations in the same order, so an element gets
// the same bits whichever computes it (tests/test_invariant.py checks them against each other).
constexpr float kExpLo = -87.0f, kExpHi = 88.0f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.42860682030941723212e-6f;
constexpr float kExpPoly[8] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f,
                               1.0f, 1.0f};

inline float exp_fixed(float x) {
  x = x < kExpLo ? kExpLo : (x > kExpHi ? kExpHi : x);
  const float n = std::nearbyint(x * kLog2e);
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = kExpPoly[0];
  for (int i = 1; i < 8; ++i) p = p * r + kExpPoly[i];
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

inline V16 exp16(V16 x) {
  x = max16(bcast16(kExpLo), min16(bcast16(kExpHi), x));  // exp_fixed's clamp, NaN kept as there
  const V16 n = round16(mul16(x, bcast16(kLog2e)));
  V16 r = sub16(x, mul16(n, bcast16(kLn2Hi)));
  r = sub16(r, mul16(n, bcast16(kLn2Lo)));
  V16 p = bcast16(kExpPoly[0]);
  for (int i = 1; i < 8; ++i) p = add16(mul16(p, r), bcast16(kExpPoly[i]));
  return mul16(p, pow2i16(n));
}

// y[i] = exp_fixed(x[i] - shift) for i < n (in place allowed): 16 at a time, the tail one by one.
inline void exp_shifted(const float* x, float* y, int64_t n, float shift, bool vector = true) {
  int64_t i = 0;
  if (vector)
    for (; i + 16 <= n; i += 16) store16(y + i, exp16(sub16(load16(x + i), bcast16(shift))));
  for (; i < n; ++i) y[i] = exp_fixed(x[i] - shift);
}

torch::Tensor exp_fixed_tensor(torch::Tensor x, bool vector) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "exp_fixed: float32");
  x = x.contiguous();
  auto y = torch::empty_like(x);
  exp_shifted(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), 0.0f, vector);
  return y;
}

// ---- SiLU and RMSNorm ---------------------------------------------------------------------------------------
// Element by element: the compiler vectorizes this loop itself (exp_fixed's operations have exact vector
// forms), conversions to bfloat16 included, which a hand-written exp16 with scalar stores was 4x slower than.
// A decode step's row (8960 for a 1.5B model, a few microseconds) stays on the calling thread: one wake-up of the
// other thread fewer per layer (no difference out of noise on the AMX Xeon's decode step either way).
template <class T>
void silu_impl(const T* x, T* y, int64_t n) {
  at::parallel_for(0, n, 32768, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) {
      const float v = to_float(x[i]);
      y[i] = from_float<T>(v / (1.0f + exp_fixed(-v)));
    }
  });
}

torch::Tensor silu(torch::Tensor x) {
  x = x.contiguous();
  auto y = torch::empty_like(x);
  if (x.scalar_type() == torch::kFloat32) silu_impl<float>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  else if (x.scalar_type() == torch::kBFloat16) silu_impl<bf16>(x.data_ptr<bf16>(), y.data_ptr<bf16>(), x.numel());
  else TORCH_CHECK(false, "silu: float32 or bfloat16 only");
  return y;
}

// As transformers' LlamaRMSNorm / Qwen2RMSNorm: weight * (x * rsqrt(mean(x^2) + eps)).to(dtype), in float32.
template <class T>
void rms_norm_impl(const T* x, const T* w, T* y, int64_t rows, int64_t h, float eps) {
  at::parallel_for(0, rows, 1, [&](int64_t a, int64_t b) {
    for (int64_t r = a; r < b; ++r) {
      const T* xr = x + r * h;
      const float inv = 1.0f / std::sqrt(dot16(xr, xr, h) / static_cast<float>(h) + eps);
      for (int64_t i = 0; i < h; ++i) {
        const T normed = from_float<T>(to_float(xr[i]) * inv);
        y[r * h + i] = from_float<T>(to_float(w[i]) * to_float(normed));
      }
    }
  });
}

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "rms_norm: x and weight must share a dtype");
  x = x.contiguous();
  w = w.contiguous();
  const int64_t h = x.size(-1);
  TORCH_CHECK(w.numel() == h, "rms_norm: weight must have x.size(-1) elements");
  auto y = torch::empty_like(x);
  if (x.scalar_type() == torch::kFloat32)
    rms_norm_impl<float>(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), x.numel() / h, h, (float)eps);
  else if (x.scalar_type() == torch::kBFloat16)
    rms_norm_impl<bf16>(x.data_ptr<bf16>(), w.data_ptr<bf16>(), y.data_ptr<bf16>(), x.numel() / h, h, (float)eps);
  else TORCH_CHECK(false, "rms_norm: float32 or bfloat16 only");
  return y;
}

// ---- rotary embedding ---------------------------------------------------------------------------------------
// transformers' apply_rotary_pos_emb for one of q, k: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1),
// each of the three operations rounded to T as torch rounds it (a product or sum in float32, then to T; the
// negation is exact). One call instead of the seven tensor operations a layer makes for it, on the calling thread
// (a decode row is 3K elements). x [B, H, S, D] with unit stride in D; cos, sin [B, S, D] in T. Returns [B, H, S, D].
template <class T>
void rope_impl(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& y) {
  const int64_t B = x.size(0), H = x.size(1), S = x.size(2), D = x.size(3), half = D / 2;
  const T* xp = x.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  T* yp = y.data_ptr<T>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s) {
        const T* xr = xp + b * x.stride(0) + h * x.stride(1) + s * x.stride(2);
        const T* cr = cp + b * cos.stride(0) + s * cos.stride(1);
        const T* sr = sp + b * sin.stride(0) + s * sin.stride(1);
        T* yr = yp + ((b * H + h) * S + s) * D;
        for (int64_t d = 0; d < D; ++d) {
          const float rotated = d < half ? -to_float(xr[d + half]) : to_float(xr[d - half]);
          const float a = to_float(from_float<T>(to_float(xr[d]) * to_float(cr[d])));
          const float c = to_float(from_float<T>(rotated * to_float(sr[d])));
          yr[d] = from_float<T>(a + c);
        }
      }
}

torch::Tensor rope(torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
  TORCH_CHECK(x.dim() == 4 && cos.dim() == 3 && sin.dim() == 3, "rope: x [B, H, S, D], cos and sin [B, S, D]");
  TORCH_CHECK(x.scalar_type() == cos.scalar_type() && x.scalar_type() == sin.scalar_type(), "rope: one dtype");
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.size(1) == x.size(2) && cos.size(2) == x.size(3) &&
              (cos.size(0) == x.size(0) || cos.size(0) == 1) && x.size(3) % 2 == 0, "rope: shapes do not match");
  if (x.stride(3) != 1) x = x.contiguous();
  if (cos.stride(2) != 1) cos = cos.contiguous();
  if (sin.stride(2) != 1) sin = sin.contiguous();
  if (cos.size(0) != x.size(0)) { cos = cos.expand({x.size(0), -1, -1}); sin = sin.expand({x.size(0), -1, -1}); }
  auto y = torch::empty(x.sizes(), x.options());
  if (x.scalar_type() == torch::kFloat32) rope_impl<float>(x, cos, sin, y);
  else if (x.scalar_type() == torch::kBFloat16) rope_impl<bf16>(x, cos, sin, y);
  else TORCH_CHECK(false, "rope: float32 or bfloat16 only");
  return y;
}

// ---- attention over the cache ----------------------------------------------------------------------------
// q [H, Q, D], k and v [Hk, L, D] (rows of one head contiguous, heads strided), valid [Q, L] (bytes; empty:
// causal, row i sees keys 0 .. L-Q+i). Output [Q, H, D], as transformers expects attention's output.
// U dot16's sharing one operand: U independent chains (one would wait on each fused multiply-add's latency),
// each in dot16's order, so each result has dot16's bits (a product's operands commute inside an FMA).
template <class T, class B, int U> inline void dot16xU(const T* a, const B* const* b, int64_t k, float* out) {
  V16 c[U];
  for (int u = 0; u < U; ++u) c[u] = zero16();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    const V16 av = load16(a + i);
    for (int u = 0; u < U; ++u) c[u] = fma16(av, load16(b[u] + i), c[u]);
  }
  if (i < k) {
    const V16 av = load16_tail(a + i, k - i);
    for (int u = 0; u < U; ++u) c[u] = fma16(av, load16_tail(b[u] + i, k - i), c[u]);
  }
  for (int u = 0; u < U; ++u) out[u] = hsum16(c[u]);
}

// dot(a, b[u]) for u < n, up to DOTS_PER_PASS at a time (each key row read once for a whole head group).
#if defined(__AVX512F__)
constexpr int DOTS_PER_PASS = 8;  // 8 accumulators + a: 9 of 32 zmm
#else
constexpr int DOTS_PER_PASS = 4;  // a V16 is two ymm: 8 accumulators + a, 10 of 16
#endif

template <class T, class B, int U = DOTS_PER_PASS>
inline void dots_tail(const T* a, const B* const* b, int64_t n, int64_t k, float* out) {
  if (n == U) return dot16xU<T, B, U>(a, b, k, out);
  if constexpr (U > 1) dots_tail<T, B, U - 1>(a, b, n, k, out);
}

template <class T, class B> inline void dots(const T* a, const B* const* b, int64_t n, int64_t k, float* out) {
  int64_t u = 0;
  for (; u + DOTS_PER_PASS <= n; u += DOTS_PER_PASS) dot16xU<T, B, DOTS_PER_PASS>(a, b + u, k, out + u);
  if (u < n) dots_tail<T, B>(a, b + u, n - u, k, out + u);
}

// For each of HP heads h: o_h[d] = sum over the n keys, in order, of fma(p_h[t], v_t[d], o_h[d]), and
// sum_h = p_h[0] + p_h[1] + ... in order. The heads share each value row, read (and widened) once for all of
// them; each head's sums keep their order, so the bits are those of one head at a time.
// NV > 0: D = 16 NV, o held in registers; NV = 0: any D, o in memory. The same operations per element.
#if defined(__AVX512F__)
constexpr int HEADS_PER_PASS = 2;  // 2 x 8 accumulators + 8 value vectors + a broadcast: 25 of 32 zmm
#else
constexpr int HEADS_PER_PASS = 1;  // a V16 is two ymm (or memory): one head's 8 already fill the registers
#endif

template <class T, int NV, int HP>
void weigh_values(const float* const* ps, const int64_t* idx, int64_t n, const T* vb, int64_t vs_j, int64_t D,
                  float* const* o, float* sums) {
  float sum[HP];
  for (int h = 0; h < HP; ++h) sum[h] = 0.f;
  if constexpr (NV > 0) {
    V16 acc[HP][NV];
    for (int h = 0; h < HP; ++h)
      for (int u = 0; u < NV; ++u) acc[h][u] = zero16();
    for (int64_t t = 0; t < n; ++t) {
      const T* vj = vb + idx[t] * vs_j;
      V16 vv[NV];
      for (int u = 0; u < NV; ++u) vv[u] = load16(vj + 16 * u);
      for (int h = 0; h < HP; ++h) {
        const float p = ps[h][t];
        sum[h] += p;
        const V16 pv = bcast16(p);
        for (int u = 0; u < NV; ++u) acc[h][u] = fma16(pv, vv[u], acc[h][u]);
      }
    }
    for (int h = 0; h < HP; ++h)
      for (int u = 0; u < NV; ++u) store16(o[h] + 16 * u, acc[h][u]);
  } else {
    for (int h = 0; h < HP; ++h)
      for (int64_t d = 0; d < D; ++d) o[h][d] = 0.f;
    for (int64_t t = 0; t < n; ++t) {
      const T* vj = vb + idx[t] * vs_j;
      for (int h = 0; h < HP; ++h) {
        const float p = ps[h][t];
        sum[h] += p;
        const V16 pv = bcast16(p);
        float* oh = o[h];
        int64_t d = 0;
        for (; d + 16 <= D; d += 16) store16(&oh[d], fma16(pv, load16(vj + d), load16(&oh[d])));
        for (; d < D; ++d) oh[d] = std::fma(p, to_float(vj[d]), oh[d]);
      }
    }
  }
  for (int h = 0; h < HP; ++h) sums[h] = sum[h];
}

template <class T, int HP>
void weigh_heads(const float* const* ps, const int64_t* idx, int64_t n, const T* vb, int64_t vs_j, int64_t D,
                 float* const* o, float* sums) {
  if (D == 128) weigh_values<T, 8, HP>(ps, idx, n, vb, vs_j, D, o, sums);
  else if (D == 64) weigh_values<T, 4, HP>(ps, idx, n, vb, vs_j, D, o, sums);
  else weigh_values<T, 0, HP>(ps, idx, n, vb, vs_j, D, o, sums);
}

template <class T>
void attention_impl(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                    const uint8_t* valid, double scale, torch::Tensor& out) {
  const int64_t H = q.size(0), Q = q.size(1), D = q.size(2), Hk = k.size(0), L = k.size(1);
  const int64_t group = H / Hk;
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  const int64_t qs_h = q.stride(0), qs_i = q.stride(1);
  const int64_t ks_h = k.stride(0), ks_j = k.stride(1), vs_h = v.stride(0), vs_j = v.stride(1);
  T* op = out.data_ptr<T>();
  const float sc = static_cast<float>(scale);
  // A task is one query row and one kv head with the `group` query heads that share it, so a key row is read
  // (and widened) once for all of them. Every head's every sum keeps its order (dot16's, then slot order).
  at::parallel_for(0, Hk * Q, 1, [&](int64_t a, int64_t b) {
    std::vector<float> s(group * L), o(group * D), sums(group), row(group);
    std::vector<const float*> pptrs(group);
    std::vector<float*> optrs(group);
    std::vector<int64_t> idx(L);
    std::vector<const T*> ptrs(L);
    std::vector<float> qf(group * D);
    std::vector<const float*> qptrs(group);
    for (int64_t task = a; task < b; ++task) {
      const int64_t g = task / Q, i = task % Q;
      const T* kb = kp + g * ks_h;
      const uint8_t* ok = valid ? valid + i * L : nullptr;
      const int64_t last = valid ? L - 1 : L - Q + i;  // causal: keys up to the row's own position
      int64_t n = 0;  // the keys the row sees, in slot order
      for (int64_t j = 0; j <= last; ++j)
        if (!ok || ok[j]) idx[n++] = j;
      if (group > 1) {  // each key against the group's heads, their queries widened to float32 once (exact)
        for (int64_t u = 0; u < group; ++u) {
          const T* qu = qp + (g * group + u) * qs_h + i * qs_i;
          for (int64_t d = 0; d < D; ++d) qf[u * D + d] = to_float(qu[d]);
          qptrs[u] = qf.data() + u * D;
        }
        for (int64_t t = 0; t < n; ++t) {
          dots(kb + idx[t] * ks_j, qptrs.data(), group, D, row.data());
          for (int64_t u = 0; u < group; ++u) s[u * L + t] = row[u];
        }
      } else {  // one head: its query against the keys
        for (int64_t t = 0; t < n; ++t) ptrs[t] = kb + idx[t] * ks_j;
        dots(qp + g * qs_h + i * qs_i, ptrs.data(), n, D, s.data());
      }
      const T* vb = vp + g * vs_h;
      for (int64_t u = 0; u < group; ++u) {  // scores -> exp_fixed(s_t - max), head by head
        float* sh = s.data() + u * L;
        float m = -INFINITY;
        for (int64_t t = 0; t < n; ++t) {
          sh[t] = sh[t] * sc;
          m = sh[t] > m ? sh[t] : m;
        }
        exp_shifted(sh, sh, n, m);
        pptrs[u] = sh;
        optrs[u] = o.data() + u * D;
      }
      int64_t u = 0;
      for (; u + HEADS_PER_PASS <= group; u += HEADS_PER_PASS)
        weigh_heads<T, HEADS_PER_PASS>(pptrs.data() + u, idx.data(), n, vb, vs_j, D, optrs.data() + u, sums.data() + u);
      for (; u < group; ++u) weigh_heads<T, 1>(pptrs.data() + u, idx.data(), n, vb, vs_j, D, optrs.data() + u, sums.data() + u);
      for (int64_t h = 0; h < group; ++h) {
        T* oi = op + (i * H + g * group + h) * D;
        const float inv = sums[h] > 0.f ? sums[h] : 1.f;
        for (int64_t d = 0; d < D; ++d) oi[d] = from_float<T>(o[h * D + d] / inv);
      }
    }
  });
}

torch::Tensor attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor valid, double scale) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "attention: q [H, Q, D], k and v [Hk, L, D]");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(), "attention: one dtype");
  TORCH_CHECK(q.size(0) % k.size(0) == 0, "attention: heads must be a multiple of kv heads");
  TORCH_CHECK(q.size(2) == k.size(2) && k.size(1) == v.size(1), "attention: shapes");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1, "attention: the last dim must be contiguous");
  const int64_t Q = q.size(1), L = k.size(1);
  TORCH_CHECK(L >= Q, "attention: fewer keys than queries");
  const uint8_t* vp = nullptr;
  if (valid.defined() && valid.numel() > 0) {
    TORCH_CHECK(valid.scalar_type() == torch::kUInt8 || valid.scalar_type() == torch::kBool, "attention: valid is bytes");
    TORCH_CHECK(valid.size(0) == Q && valid.size(1) == L && valid.is_contiguous(), "attention: valid [Q, L]");
    vp = reinterpret_cast<const uint8_t*>(valid.data_ptr());
  }
  auto out = torch::empty({Q, q.size(0), v.size(2)}, q.options());
  if (q.scalar_type() == torch::kFloat32) attention_impl<float>(q, k, v, vp, scale, out);
  else if (q.scalar_type() == torch::kBFloat16) attention_impl<bf16>(q, k, v, vp, scale, out);
  else TORCH_CHECK(false, "attention: float32 or bfloat16 only");
  return out;
}

std::string isa() {
  const std::string tiles = linear_isa();  // AMX, where this build has it and the kernel granted it
  if (!tiles.empty()) return tiles;
#if defined(__AVX512BF16__)
  return "avx512_bf16";
#elif defined(__AVX512F__)
  return "avx512f";
#elif defined(__AVX2__) && defined(__FMA__)
  return "avx2";
#else
  return "scalar";
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear", &linear, "row-invariant x @ w.T + b (w [N, K], packed on the fly)");
  m.def("pack_linear", &pack_linear, "w [N, K] in the panels linear_packed reads");
  m.def("linear_packed", &linear_packed, "row-invariant x @ w.T + b over pack_linear's panels");
  m.def("dequantize", &dequantize, "GGUF blocks [N, row bytes] of a type -> float32 [N, K], as gguf-py");
  m.def("linear_quant", &linear_quant, "row-invariant x @ w.T + b, w in GGUF blocks dequantized per tile");
  m.def("repack_quant", &repack_quant, "GGUF blocks [N, row bytes] regrouped by 16 rows (repack.h)");
  m.def("linear_repacked", &linear_repacked, "row-invariant x @ w.T + b, w regrouped GGUF blocks");
  m.def("linear_repacked_many", &linear_repacked_many, "linear_repacked for several weights over one x, in one pool of work");
  m.def("dequantize_repacked", &dequantize_repacked, "rows of a regrouped weight -> float32, as gguf-py");
  m.def("attention", &attention, "row-invariant attention over a KV cache");
  m.def("rms_norm", &rms_norm, "row-wise RMSNorm");
  m.def("rope", &rope, "transformers' rotary embedding of q or k, each operation rounded as torch rounds it");
  m.def("silu", &silu, "element-wise SiLU with exp_fixed");
  m.def("exp_fixed", &exp_fixed_tensor, "exp_fixed on a float32 tensor (vector: 16 lanes at a time, else one by one)",
        py::arg("x"), py::arg("vector") = true);
  m.def("isa", &isa, "the instruction set the kernels were compiled for");
}
