// How fast can this machine stream memory into its cores? The ceiling of a decode step.
//
//   gcc -O2 -mavx2 -pthread -o /tmp/bandwidth scripts/perf/bandwidth.c && /tmp/bandwidth [threads]
//
// A decode step reads every weight once, so tokens per second times bytes of weights per token
// can at best reach the rate at which the cores read memory. This reads a 1 GiB buffer (far
// past every cache) with AVX2 loads, split between `threads` threads (default: every core), five
// times, and prints the best pass in GB/s (10^9 bytes). `bench/RESULTS.md` divides each engine's
// weights-per-token × tok/s by it (issue 51).
//
// x86-64 with AVX2; a measurement tool, not part of the build.

#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BYTES (1ull << 30)
#define PASSES 5

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

struct slice {
  const float* start;
  size_t floats;
  float sum;
};

static void* read_slice(void* arg) {
  struct slice* s = arg;
  __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
  for (size_t i = 0; i + 32 <= s->floats; i += 32) {
    a = _mm256_add_ps(a, _mm256_load_ps(s->start + i));
    b = _mm256_add_ps(b, _mm256_load_ps(s->start + i + 8));
    c = _mm256_add_ps(c, _mm256_load_ps(s->start + i + 16));
    d = _mm256_add_ps(d, _mm256_load_ps(s->start + i + 24));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
  s->sum = 0;
  for (int i = 0; i < 8; i++) s->sum += lanes[i];
  return NULL;
}

int main(int argc, char** argv) {
  long threads = argc > 1 ? atol(argv[1]) : sysconf(_SC_NPROCESSORS_ONLN);
  if (threads < 1 || threads > 256) {
    fprintf(stderr, "threads must be 1 to 256\n");
    return 1;
  }
  float* buf = aligned_alloc(64, BYTES);
  if (!buf) {
    fprintf(stderr, "cannot allocate 1 GiB\n");
    return 1;
  }
  // Touched first, so the passes read memory rather than fault pages in.
  memset(buf, 0, BYTES);
  size_t floats = BYTES / sizeof(float);
  size_t per = floats / threads / 32 * 32;
  pthread_t ids[256];
  struct slice slices[256];
  double best = 0, check = 0;
  for (int pass = 0; pass < PASSES; pass++) {
    double t0 = now();
    for (long t = 0; t < threads; t++) {
      slices[t] = (struct slice){buf + t * per, per, 0};
      pthread_create(&ids[t], NULL, read_slice, &slices[t]);
    }
    for (long t = 0; t < threads; t++) {
      pthread_join(ids[t], NULL);
      check += slices[t].sum;
    }
    double rate = (double)(per * threads * sizeof(float)) / (now() - t0) / 1e9;
    if (rate > best) best = rate;
  }
  printf("%ld threads: best of %d passes over 1 GiB: %.1f GB/s (checksum %g)\n", threads,
         PASSES, best, check);
  free(buf);
  return 0;
}
