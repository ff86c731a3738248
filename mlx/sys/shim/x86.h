// What the shim's x86-64 kernels share: the target attribute that compiles a function for
// AVX2 + FMA whatever the build machine is, the run-time check that picks those functions,
// and a horizontal sum.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

// Compiles one function for AVX2 + FMA; callers check `has_avx2()` before calling it.
#define MLXKIT_AVX2 __attribute__((target("avx2,fma")))

namespace mlxkit {

// Whether this CPU runs the AVX2 + FMA kernels.
inline bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

// The sum of the eight lanes.
MLXKIT_AVX2 inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace mlxkit
#endif  // __x86_64__
