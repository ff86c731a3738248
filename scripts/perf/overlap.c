// Does one core overlap streaming from memory with arithmetic on what it streams?
//
//   gcc -O2 -mavx512f -mfma -o /tmp/overlap scripts/perf/overlap.c && /tmp/overlap
//
// An 8-row decode step reads the same weights as a 1-row step and does eight times the
// multiply-adds on them. It costs little more than the 1-row step only if the core fetches the
// next weights while it multiplies the current ones. This program times one loop over 256 MB
// three ways, with `work` rounds of eight AVX-512 FMAs per 256 bytes read:
// - `stream`: from memory (the time a decode step's weights take);
// - `cached`: the same loop over a 64 KB buffer, as often (the arithmetic alone);
// - `prefetch 4K` / `16K`: from memory, with software prefetches that far ahead.
// Overlap means `stream` near max(memory alone, cached); no overlap means their sum. On the
// 2-core Sapphire Rapids VM of issue 16 it was more than the sum (work 16: 45-50 ms, where
// memory alone took 23 and the arithmetic 21), and prefetching 4 or 16 KB ahead got it to
// 34-40 ms: about half the memory time stays exposed however far ahead the prefetches run.
// (The packed matvec prefetches two tiles, about 2 KB, ahead.)
//
// Needs AVX-512 (x86-64); a measurement tool, not part of the build.

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BYTES (256u << 20)
#define SMALL (64u << 10)

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// `noipa` keeps GCC from folding repeated calls over the same buffer into one.
__attribute__((noipa)) static float run(const float* p, size_t floats, int work, int ahead) {
  __m512 acc[8];
  for (int i = 0; i < 8; i++) acc[i] = _mm512_setzero_ps();
  __m512 m = _mm512_set1_ps(1.0001f);
  for (size_t i = 0; i < floats; i += 64) {
    if (ahead) {
      const char* next = (const char*)(p + i) + ahead;
      for (int line = 0; line < 4; line++) _mm_prefetch(next + 64 * line, _MM_HINT_T0);
    }
    const __m512 a = _mm512_load_ps(p + i), b = _mm512_load_ps(p + i + 16);
    const __m512 c = _mm512_load_ps(p + i + 32), d = _mm512_load_ps(p + i + 48);
    for (int w = 0; w < work; ++w) {
      acc[0] = _mm512_fmadd_ps(a, m, acc[0]);
      acc[1] = _mm512_fmadd_ps(b, m, acc[1]);
      acc[2] = _mm512_fmadd_ps(c, m, acc[2]);
      acc[3] = _mm512_fmadd_ps(d, m, acc[3]);
      acc[4] = _mm512_fmadd_ps(a, m, acc[4]);
      acc[5] = _mm512_fmadd_ps(b, m, acc[5]);
      acc[6] = _mm512_fmadd_ps(c, m, acc[6]);
      acc[7] = _mm512_fmadd_ps(d, m, acc[7]);
      m = _mm512_add_ps(m, _mm512_set1_ps(1e-9f));
    }
  }
  __m512 total = acc[0];
  for (int i = 1; i < 8; i++) total = _mm512_add_ps(total, acc[i]);
  return _mm512_reduce_add_ps(total);
}

int main(void) {
  float* big = aligned_alloc(1 << 21, BYTES);
  float* small = aligned_alloc(64, SMALL);
  if (!big || !small) return 1;
  memset(big, 0, BYTES);
  memset(small, 0, SMALL);
  const size_t floats = BYTES / 4, small_floats = SMALL / 4;
  float sink = 0;
  for (int work = 0; work <= 16; work = work ? work * 2 : 1) {
    for (int round = 0; round < 2; round++) {
      double t = now();
      sink += run(big, floats, work, 0);
      const double stream = now() - t;
      t = now();
      for (size_t k = 0; k < floats; k += small_floats) sink += run(small, small_floats, work, 0);
      const double cached = now() - t;
      t = now();
      sink += run(big, floats, work, 4096);
      const double ahead4 = now() - t;
      t = now();
      sink += run(big, floats, work, 16384);
      const double ahead16 = now() - t;
      printf("work %2d: stream %3.0f ms (%4.1f GB/s), cached %3.0f ms, prefetch 4K %3.0f ms, "
             "16K %3.0f ms\n",
             work, stream * 1e3, BYTES / stream / 1e9, cached * 1e3, ahead4 * 1e3,
             ahead16 * 1e3);
    }
  }
  return sink == 12345.0f;
}
