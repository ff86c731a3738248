// What the shim's x86-64 kernels share: the target attributes that compile a function for AVX2
// or AVX-512 whatever the build machine is, the run-time choice between those functions and
// the portable ones, and horizontal sums.
//
// The choice is the best instruction set the CPU runs, capped by `MLXKIT_CPU_KERNELS`
// (`portable`, `avx2`, `avx512`) at start or `set_kernel_level` later: tests run every path on
// one machine that way. A kernel reads the level once per call, so one call never mixes two.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace mlxkit {

// Instruction sets the kernels come in, in increasing order.
enum KernelLevel : int { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// The best level this CPU runs.
inline int supported_kernel_level() {
#if defined(__x86_64__)
  static const int level = [] {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
        !__builtin_cpu_supports("f16c")) {
      return kPortable;
    }
    return __builtin_cpu_supports("avx512f") ? kAvx512 : kAvx2;
  }();
  return level;
#else
  return kPortable;
#endif
}

inline std::atomic<int>& kernel_level_cap() {
  static std::atomic<int> cap([] {
    const char* env = std::getenv("MLXKIT_CPU_KERNELS");
    if (env == nullptr) {
      return static_cast<int>(kAvx512);
    }
    if (std::strcmp(env, "portable") == 0) {
      return static_cast<int>(kPortable);
    }
    return static_cast<int>(std::strcmp(env, "avx2") == 0 ? kAvx2 : kAvx512);
  }());
  return cap;
}

// The level kernels use now.
inline int kernel_level() {
  const int cap = kernel_level_cap().load(std::memory_order_relaxed);
  return cap < supported_kernel_level() ? cap : supported_kernel_level();
}

// Caps the level at `level`; returns the level in effect.
inline int set_kernel_level(int level) {
  kernel_level_cap().store(level < kPortable ? kPortable : level, std::memory_order_relaxed);
  return kernel_level();
}

// Whether the AVX2 + FMA kernels run now.
inline bool has_avx2() {
  return kernel_level() >= kAvx2;
}

}  // namespace mlxkit

#if defined(__x86_64__)
#include <immintrin.h>

// Compiles one function for AVX2 + FMA + F16C (every CPU with the first two has the third);
// callers check `has_avx2()` before calling it.
#define MLXKIT_AVX2 __attribute__((target("avx2,fma,f16c")))
// Compiles one function for AVX-512 (foundation) with AVX2 + FMA; callers check the level.
#define MLXKIT_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

namespace mlxkit {

// The sum of the eight lanes.
MLXKIT_AVX2 inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The sum of the sixteen lanes: the halves added, then the eight-lane sum.
MLXKIT_AVX512 inline float horizontal_sum(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 s8 = _mm256_add_ps(lo, hi);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The largest of `x[0..n)`. Any order gives the same maximum, so lanes may take it.
MLXKIT_AVX2 inline float max_avx2(const float* x, int64_t n) {
  __m256 max8 = _mm256_set1_ps(-__builtin_inff());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    max8 = _mm256_max_ps(max8, _mm256_loadu_ps(x + i));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(max8), _mm256_extractf128_ps(max8, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  float max = _mm_cvtss_f32(m);
  for (; i < n; ++i) {
    max = x[i] > max ? x[i] : max;
  }
  return max;
}

}  // namespace mlxkit
#endif  // __x86_64__
