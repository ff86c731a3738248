// IEEE half-precision values as the shim's kernels read them (f16 KV caches): the bits in a
// `Half`, widened to f32 exactly, one at a time anywhere or eight at a time with F16C.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "x86.h"

namespace mlxkit {

// The 16 bits of an IEEE binary16 value (MLX's float16 layout).
struct Half {
  uint16_t bits;
};

// The exact f32 value of `h`, without F16C.
inline float widen(Half h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exponent = (h.bits >> 10) & 0x1Fu;
  const uint32_t mantissa = h.bits & 0x3FFu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa · 2^-24, exact in f32.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  const uint32_t bits = exponent == 0x1F ? sign | 0x7F800000u | (mantissa << 13)
                                         : sign | ((exponent + 112u) << 23) | (mantissa << 13);
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

inline float widen(float v) {
  return v;
}

#if defined(__x86_64__)

// Eight consecutive values from `p` as f32 lanes.
MLXKIT_AVX2 inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}

MLXKIT_AVX2 inline __m256 load8(const Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Sixteen consecutive values from `p` as f32 lanes.
MLXKIT_AVX512 inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}

MLXKIT_AVX512 inline __m512 load16(const Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

#endif  // __x86_64__

}  // namespace mlxkit
