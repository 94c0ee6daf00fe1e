// Row-invariant CPU kernels for the forwards after the prefill (decode and tree verification).
//
// Why: a verification forward of k rows must give each row the very bits a 1-row decode forward gives it,
// or speculative output can differ from plain greedy decoding. Stock GEMMs choose their blocking, and so
// their summation order, from the row count (MKL float32 differs already at 2 rows). Here every output is
// reduced in one fixed order that depends on nothing but its own inputs:
//   * dot products: 16 float32 lane accumulators, lane l takes elements k = l (mod 16) in increasing k with
//     fused multiply-add, then the lanes are summed as (l, l+8), (l, l+4), (l, l+2), (0, 1). bfloat16
//     weights and rows with AVX512_BF16: lane l takes the pairs (2l+1, 2l) of each 32-element block in that
//     order (VDPBF16PS); elsewhere the same pairs in the same order with float32 FMA.
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

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

using bf16 = c10::BFloat16;

inline float to_float(float x) { return x; }
inline float to_float(bf16 x) { return static_cast<float>(x); }
template <class T> inline T from_float(float x);
template <> inline float from_float<float>(float x) { return x; }
template <> inline bf16 from_float<bf16>(float x) { return bf16(x); }  // round to nearest even, as torch

// ---- 16 float32 lanes: one zmm, two ymm, or an array, with the same arithmetic -------------------------
#if defined(__AVX512F__)
struct V16 { __m512 v; };
inline V16 zero16() { return {_mm512_setzero_ps()}; }
inline V16 load16(const float* p) { return {_mm512_loadu_ps(p)}; }
inline V16 load16(const bf16* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
}
inline V16 fma16(V16 a, V16 b, V16 acc) { return {_mm512_fmadd_ps(a.v, b.v, acc.v)}; }
inline V16 bcast16(float x) { return {_mm512_set1_ps(x)}; }
inline void store16(float* p, V16 a) { _mm512_storeu_ps(p, a.v); }
inline float hsum16(V16 a) {
  __m256 lo = _mm512_castps512_ps256(a.v);
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1));
  __m256 s8 = _mm256_add_ps(lo, hi);                                            // l + (l+8)
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));  // l + (l+4)
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                             // l + (l+2)
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));               // 0 + 1
}
#elif defined(__AVX2__) && defined(__FMA__)
struct V16 { __m256 lo, hi; };
inline V16 zero16() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V16 load16(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline __m256 widen8(const bf16* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline V16 load16(const bf16* p) { return {widen8(p), widen8(p + 8)}; }
inline V16 fma16(V16 a, V16 b, V16 acc) { return {_mm256_fmadd_ps(a.lo, b.lo, acc.lo), _mm256_fmadd_ps(a.hi, b.hi, acc.hi)}; }
inline V16 bcast16(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline void store16(float* p, V16 a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
inline float hsum16(V16 a) {
  __m256 s8 = _mm256_add_ps(a.lo, a.hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
#else
struct V16 { float v[16]; };
inline V16 zero16() { V16 a; for (int l = 0; l < 16; ++l) a.v[l] = 0.f; return a; }
template <class T> inline V16 load16(const T* p) { V16 a; for (int l = 0; l < 16; ++l) a.v[l] = to_float(p[l]); return a; }
inline V16 fma16(V16 a, V16 b, V16 acc) { for (int l = 0; l < 16; ++l) acc.v[l] = std::fma(a.v[l], b.v[l], acc.v[l]); return acc; }
inline V16 bcast16(float x) { V16 a; for (int l = 0; l < 16; ++l) a.v[l] = x; return a; }
inline void store16(float* p, V16 a) { for (int l = 0; l < 16; ++l) p[l] = a.v[l]; }
inline float hsum16(V16 a) {
  float s8[8], s4[4], s2[2];
  for (int l = 0; l < 8; ++l) s8[l] = a.v[l] + a.v[l + 8];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  for (int l = 0; l < 2; ++l) s2[l] = s4[l] + s4[l + 2];
  return s2[0] + s2[1];
}
#endif

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

// ---- the linear layer: y[m, n] = sum_k x[m, k] w[n, k] (+ b[n]) -----------------------------------------
// A tile is NB outputs x R rows: the NB weight rows are read once for all R rows, each (output, row) pair
// keeps its own accumulator, so the order of one pair's sum is the same in every tile shape.
// Shapes measured on a 2-core AMD EPYC (AVX512_BF16): one row streams 8 weight rows at a time; more rows
// share 4 weight rows among up to 6 input rows (24 accumulators), with the weights prefetched ahead.
constexpr int NB = 4;
constexpr int RMAX = 6;
constexpr int NB_ONE_ROW = 8;
constexpr int PREFETCH = 1024;  // elements ahead in each weight row

template <class T> struct Step;  // one block of the reduction: Step<T>::width elements per accumulator update

template <> struct Step<float> {
  static constexpr int width = 16;
  static inline V16 run(V16 acc, const float* w, const float* x) { return fma16(load16(w), load16(x), acc); }
};

#if defined(__AVX512BF16__)
template <> struct Step<bf16> {
  static constexpr int width = 32;
  static inline V16 run(V16 acc, const bf16* w, const bf16* x) {
    __m512bh wv = (__m512bh)_mm512_loadu_si512(w);
    __m512bh xv = (__m512bh)_mm512_loadu_si512(x);
    return {_mm512_dpbf16_ps(acc.v, xv, wv)};
  }
};
#else
template <> struct Step<bf16> {
  static constexpr int width = 32;
  // VDPBF16PS's order without the instruction: lane l adds pair element 2l+1, then 2l.
  static inline V16 run(V16 acc, const bf16* w, const bf16* x) {
    float wo[16], we[16], xo[16], xe[16];
    for (int l = 0; l < 16; ++l) {
      wo[l] = to_float(w[2 * l + 1]); we[l] = to_float(w[2 * l]);
      xo[l] = to_float(x[2 * l + 1]); xe[l] = to_float(x[2 * l]);
    }
    acc = fma16(load16(xo), load16(wo), acc);
    return fma16(load16(xe), load16(we), acc);
  }
};
#endif

template <class T, int NBc, int R>
void tile(const T* w, int64_t K, const T* x, float* out /* [R][NBc] */) {
  constexpr int W = Step<T>::width;
  V16 acc[NBc][R];
  for (int j = 0; j < NBc; ++j)
    for (int r = 0; r < R; ++r) acc[j][r] = zero16();
  int64_t k = 0;
  for (; k + W <= K; k += W) {
    if (R > 1)
      for (int j = 0; j < NBc; ++j) __builtin_prefetch(w + j * K + k + PREFETCH, 0, 3);
    for (int j = 0; j < NBc; ++j)
      for (int r = 0; r < R; ++r) acc[j][r] = Step<T>::run(acc[j][r], w + j * K + k, x + r * K + k);
  }
  if (k < K) {  // the tail, zero-padded to one whole block: the same update in the same lanes
    T wt[NBc][W], xt[R][W];
    for (int j = 0; j < NBc; ++j) for (int i = 0; i < W; ++i) wt[j][i] = k + i < K ? w[j * K + k + i] : T(0.f);
    for (int r = 0; r < R; ++r) for (int i = 0; i < W; ++i) xt[r][i] = k + i < K ? x[r * K + k + i] : T(0.f);
    for (int j = 0; j < NBc; ++j)
      for (int r = 0; r < R; ++r) acc[j][r] = Step<T>::run(acc[j][r], wt[j], xt[r]);
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NBc; ++j) out[r * NBc + j] = hsum16(acc[j][r]);
}

template <class T, int NBc>
void tile_rows(const T* w, int64_t K, const T* x, int rows, float* out) {
  switch (rows) {
    case 1: tile<T, NBc, 1>(w, K, x, out); break;
    case 2: tile<T, NBc, 2>(w, K, x, out); break;
    case 3: tile<T, NBc, 3>(w, K, x, out); break;
    case 4: tile<T, NBc, 4>(w, K, x, out); break;
    case 5: tile<T, NBc, 5>(w, K, x, out); break;
    default: tile<T, NBc, 6>(w, K, x, out); break;
  }
}

template <class T>
void linear_impl(const T* x, const T* w, const T* b, T* y, int64_t M, int64_t K, int64_t N) {
  // Every (output, row) pair has its own accumulator in every tile shape: the shape is free to follow M.
  const int nb = M == 1 ? NB_ONE_ROW : NB;
  const int64_t blocks = (N + nb - 1) / nb;
  // Threads only for at least half a megabyte of weights each: waking them costs more on small matrices.
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 19) / (nb * K * static_cast<int64_t>(sizeof(T))));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    float out[RMAX * NB_ONE_ROW];
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t n0 = blk * nb;
      const int nbc = static_cast<int>(std::min<int64_t>(nb, N - n0));
      for (int64_t m0 = 0; m0 < M; m0 += RMAX) {
        const int rows = static_cast<int>(std::min<int64_t>(RMAX, M - m0));
        const T* wp = w + n0 * K;
        const T* xp = x + m0 * K;
        switch (nbc) {
          case 1: tile_rows<T, 1>(wp, K, xp, rows, out); break;
          case 2: tile_rows<T, 2>(wp, K, xp, rows, out); break;
          case 3: tile_rows<T, 3>(wp, K, xp, rows, out); break;
          case 4: tile_rows<T, 4>(wp, K, xp, rows, out); break;
          case 8: tile<T, 8, 1>(wp, K, xp, out); break;
          default:  // the short last block of the one-row shape
            for (int j = 0; j < nbc; ++j) tile<T, 1, 1>(wp + j * K, K, xp, out + j);
        }
        for (int r = 0; r < rows; ++r)
          for (int j = 0; j < nbc; ++j) {
            float v = out[r * nbc + j];
            if (b) v += to_float(b[n0 + j]);
            y[(m0 + r) * N + n0 + j] = from_float<T>(v);
          }
      }
    }
  });
}

torch::Tensor linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "linear: x [M, K] and w [N, K]");
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "linear: x and w must share a dtype");
  x = x.contiguous();
  w = w.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({M, N}, x.options());
  torch::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->to(x.scalar_type()).contiguous();
    TORCH_CHECK(b.numel() == N, "linear: bias must have N elements");
  }
  if (x.scalar_type() == torch::kFloat32) {
    linear_impl<float>(x.data_ptr<float>(), w.data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr,
                       y.data_ptr<float>(), M, K, N);
  } else if (x.scalar_type() == torch::kBFloat16) {
    linear_impl<bf16>(x.data_ptr<bf16>(), w.data_ptr<bf16>(), b.defined() ? b.data_ptr<bf16>() : nullptr,
                      y.data_ptr<bf16>(), M, K, N);
  } else {
    TORCH_CHECK(false, "linear: float32 or bfloat16 only");
  }
  return y;
}

// ---- exp as one polynomial of IEEE basic operations --------------------------------------------------------
// Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then a degree-7 Taylor polynomial (error < 2 ulp).
// The same source line runs in the vector and the scalar code, so every element gets the same bits.
inline float exp_fixed(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.42860682030941723212e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

torch::Tensor exp_fixed_tensor(torch::Tensor x) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "exp_fixed: float32");
  x = x.contiguous();
  auto y = torch::empty_like(x);
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) yp[i] = exp_fixed(xp[i]);
  return y;
}

// ---- SiLU and RMSNorm ---------------------------------------------------------------------------------------
template <class T>
void silu_impl(const T* x, T* y, int64_t n) {
  at::parallel_for(0, n, 4096, [&](int64_t a, int64_t b) {
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

// ---- attention over the cache ----------------------------------------------------------------------------
// q [H, Q, D], k and v [Hk, L, D] (rows of one head contiguous, heads strided), valid [Q, L] (bytes; empty:
// causal, row i sees keys 0 .. L-Q+i). Output [Q, H, D], as transformers expects attention's output.
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
  at::parallel_for(0, H * Q, 1, [&](int64_t a, int64_t b) {
    std::vector<float> s(L), o(D);
    for (int64_t task = a; task < b; ++task) {
      const int64_t h = task / Q, i = task % Q, g = h / group;
      const T* qi = qp + h * qs_h + i * qs_i;
      const uint8_t* ok = valid ? valid + i * L : nullptr;
      const int64_t last = valid ? L - 1 : L - Q + i;  // causal: keys up to the row's own position
      float m = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) {
        if (ok && !ok[j]) continue;
        s[j] = dot16(qi, kp + g * ks_h + j * ks_j, D) * sc;
        m = s[j] > m ? s[j] : m;
      }
      float sum = 0.f;
      for (int64_t d = 0; d < D; ++d) o[d] = 0.f;
      for (int64_t j = 0; j <= last; ++j) {
        if (ok && !ok[j]) continue;
        const float p = exp_fixed(s[j] - m);
        sum += p;
        const T* vj = vp + g * vs_h + j * vs_j;
        // o[d] = fma(p, v[d], o[d]) for every d: 16 at a time, then one by one; the same operation per element
        const V16 pv = bcast16(p);
        int64_t d = 0;
        for (; d + 16 <= D; d += 16) store16(&o[d], fma16(pv, load16(vj + d), load16(&o[d])));
        for (; d < D; ++d) o[d] = std::fma(p, to_float(vj[d]), o[d]);
      }
      T* oi = op + (i * H + h) * D;
      const float inv = sum > 0.f ? sum : 1.f;
      for (int64_t d = 0; d < D; ++d) oi[d] = from_float<T>(o[d] / inv);
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
  m.def("linear", &linear, "row-invariant x @ w.T + b");
  m.def("attention", &attention, "row-invariant attention over a KV cache");
  m.def("rms_norm", &rms_norm, "row-wise RMSNorm");
  m.def("silu", &silu, "element-wise SiLU with exp_fixed");
  m.def("exp_fixed", &exp_fixed_tensor, "exp_fixed on a float32 tensor");
  m.def("isa", &isa, "the instruction set the kernels were compiled for");
}
