// Waiting briefly without sleeping: the shim's threads hand each other work every few tens of
// microseconds, and a futex wake-up costs about as much (tens of microseconds on a VM), so an
// idle thread spins for a while before it sleeps.
#pragma once

#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mlxkit {

// How long an idle thread spins before it sleeps.
constexpr auto kSpinBeforeSleep = std::chrono::microseconds(100);

// One turn of a spin loop: tells the core this thread is waiting.
inline void relax() {
#if defined(__x86_64__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace mlxkit
