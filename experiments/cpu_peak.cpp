// The arithmetic ceiling of one core for the invariant linear's inner instruction: how many independent
// VDPBF16PS (bfloat16 pairs into float32, 16 lanes, 32 multiply-adds) and float32 FMA (16 lanes) a core
// retires per second. With it, the floor of a k-row verification forward's linears is
// k * (weights) / 32 / (cores * rate) in bfloat16, whatever the kernel's blocking.
//
//   g++ -O2 -march=native experiments/cpu_peak.cpp -o /tmp/cpu_peak && /tmp/cpu_peak
//   (/tmp/cpu_peak & /tmp/cpu_peak; wait)   # both cores at once
//
// Needs AVX512_BF16 (checked at run time); 24 accumulators hide the instruction's latency.
#include <immintrin.h>

#include <chrono>
#include <cstdio>

__attribute__((target("avx512f,avx512bf16"))) static double rate_dpbf16(long n) {
  __m512 a[24];
  for (auto& v : a) v = _mm512_setzero_ps();
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), w = x;
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {
#pragma GCC unroll 24
    for (int j = 0; j < 24; ++j) a[j] = _mm512_dpbf16_ps(a[j], x, w);
    __asm__ volatile("" : "+v"(x));  // keeps the loop from being folded
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float sink = 0;
  for (auto& v : a) sink += _mm512_reduce_add_ps(v);
  std::printf("  (checksum %g)\n", sink);
  return n * 24.0 / s;
}

__attribute__((target("avx512f"))) static double rate_fma(long n) {
  __m512 a[24];
  for (auto& v : a) v = _mm512_setzero_ps();
  __m512 x = _mm512_set1_ps(1e-9f), w = x;
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {
#pragma GCC unroll 24
    for (int j = 0; j < 24; ++j) a[j] = _mm512_fmadd_ps(x, w, a[j]);
    __asm__ volatile("" : "+v"(x));
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float sink = 0;
  for (auto& v : a) sink += _mm512_reduce_add_ps(v);
  std::printf("  (checksum %g)\n", sink);
  return n * 24.0 / s;
}

int main() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16")) {
    std::printf("this CPU has no AVX512_BF16\n");
    return 1;
  }
  const long n = 100000000;
  std::printf("VDPBF16PS zmm: %.2f G/s per core\n", rate_dpbf16(n) / 1e9);
  std::printf("VFMADD zmm:    %.2f G/s per core\n", rate_fma(n) / 1e9);
  return 0;
}
