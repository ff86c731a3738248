// Attention of each row's queries over the row's own history, for batched decode steps and
// prompt chunks.
//
// A decode step over B sequences has B histories of different lengths. Attending them with
// MLX's `scaled_dot_product_attention` takes one call per row, and on the CPU each call is a
// handful of small ops (slices, the GQA reshape, two matmuls, a softmax): on SmolLM2 with 8
// rows that was about a fifth of the step. This primitive takes every row's keys and values
// as they lie in the caches (strided views, nothing copied) and attends them all in one op.
// For a prompt chunk it attends tiles of queries against blocks of keys, so a long prompt's
// keys and values are read once per tile rather than once per query, and keeps only the
// tile's scores (never the whole score matrix), with a vectorized `exp` where MLX's CPU softmax
// evaluates `exp` one lane at a time. With AVX-512, scores are taken sixteen keys at a time and
// the weighted sum carries four queries per pass over the values: a 512-token chunk at 12k
// tokens of history attends 1.6x faster than with the AVX2 kernels (`mlx/benches`).
//
// Keys and values are f32, or f16 from a half-precision cache (`--kv-cache f16`), widened
// exactly as they are read: half the bytes a long history costs per step. From an 8-bit cache
// (`--kv-cache q8`) they are byte rows of codes, scales and biases, dequantized a block of
// tokens at a time into a scratch the block's queries share: 1.25 bytes an element from
// memory, where dequantizing the whole history first wrote and read it again as f32.
//
// A row may bring a boolean mask `[queries, keys]` (a sliding window over a ring of slots, a
// chunked layer, a prompt chunk over a window): its scores are computed as for every column
// and the masked ones dropped before the softmax, as MLX's attention does with the same mask.
//
// Each (row, head, query) runs the same operations in the same order whatever the other rows
// are, so a row's result does not depend on the batch it is in.

#include "attend.h"
#include "primitives.h"

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "half.h"
#include "pool.h"
#include "vexp.h"

#include "x86.h"

namespace mlxkit {

namespace mx = mlx::core;

namespace {

// Multiply-adds (query · key and weight · value, per head dimension) below which handing part
// of the attention to another thread costs more than it saves.
constexpr int64_t kMinWorkPerPart = 1 << 16;

// One kv head's keys or values of a `[1, heads, tokens, head_dim]` view, head_dim contiguous,
// as the kernels read them: `run(t0, t1, scratch)` points at token t0 of the run `[t0, t1)`,
// whose tokens then lie `stride()` elements apart.
//
// `Direct`: the cache's own f32 or (an f16 cache) `Half` elements, read where they lie and
// widened to f32 by the kernels.
template <typename T>
struct Direct {
  using Element = T;
  const T* head;
  int64_t token;

  static Direct of(const mx::array& a, int kv_head) {
    const auto& s = a.strides();
    return Direct{a.data<T>() + kv_head * s[1], s[2]};
  }
  const T* run(int t0, int, std::vector<float>&) const {
    return head + t0 * token;
  }
  int64_t stride() const {
    return token;
  }
};

// Elements per scale and bias in an 8-bit cache's rows, and bytes of each scale or bias.
constexpr int kQ8Group = 32;

// `codes[d] · scale + bias` for the `n` elements of one 8-bit row, `n` a multiple of 32.
void dequantize_row_portable(const uint8_t* row, int n, float* out) {
  const int groups = n / kQ8Group;
  for (int g = 0; g < groups; ++g) {
    float scale, bias;
    std::memcpy(&scale, row + n + 4 * g, sizeof scale);
    std::memcpy(&bias, row + n + 4 * (groups + g), sizeof bias);
    for (int d = g * kQ8Group; d < (g + 1) * kQ8Group; ++d) {
      out[d] = static_cast<float>(row[d]) * scale + bias;
    }
  }
}

#if defined(__x86_64__)
MLXKIT_AVX2 void dequantize_row_avx2(const uint8_t* row, int n, float* out) {
  const int groups = n / kQ8Group;
  for (int g = 0; g < groups; ++g) {
    float scale, bias;
    std::memcpy(&scale, row + n + 4 * g, sizeof scale);
    std::memcpy(&bias, row + n + 4 * (groups + g), sizeof bias);
    const __m256 scale8 = _mm256_set1_ps(scale);
    const __m256 bias8 = _mm256_set1_ps(bias);
    const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * g));
    const __m128i lo = _mm256_castsi256_si128(codes);
    const __m128i hi = _mm256_extracti128_si256(codes, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[j]));
      _mm256_storeu_ps(out + 32 * g + 8 * j, _mm256_fmadd_ps(x, scale8, bias8));
    }
  }
}
#endif  // __x86_64__

// An 8-bit cache's rows (kvcache's `KvStorage::Q8`): per token, `head_dim` codes, then an f32
// scale per 32 codes, then an f32 bias per 32, as bytes. A run is dequantized into `scratch`.
struct Dequantized {
  using Element = float;
  const uint8_t* head;
  int64_t token;
  int head_dim;
  void (*dequantize_row)(const uint8_t*, int, float*);

  static Dequantized of(const mx::array& a, int kv_head) {
    const auto& s = a.strides();
    const int head_dim = a.shape(3) * 4 / 5;
#if defined(__x86_64__)
    auto row = has_avx2() ? dequantize_row_avx2 : dequantize_row_portable;
#else
    auto row = dequantize_row_portable;
#endif
    return Dequantized{a.data<uint8_t>() + kv_head * s[1], s[2], head_dim, row};
  }
  const float* run(int t0, int t1, std::vector<float>& scratch) const {
    const size_t need = static_cast<size_t>(t1 - t0) * head_dim;
    if (scratch.size() < need) {
      scratch.resize(need);
    }
    for (int t = t0; t < t1; ++t) {
      dequantize_row(head + t * token, head_dim, scratch.data() + (t - t0) * head_dim);
    }
    return scratch.data();
  }
  int64_t stride() const {
    return head_dim;
  }
};

template <typename T>
float dot_portable(const float* a, const T* b, int n) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    sum += a[i] * widen(b[i]);
  }
  return sum;
}

// `out += Σ_t p[t] · v_t` over tokens `[t0, t1)` of one head's values.
template <typename T>
void weighted_sum_portable(const float* p, const T* vh, int64_t token, int t0, int t1,
                           int head_dim, float* out) {
  for (int t = t0; t < t1; ++t) {
    for (int d = 0; d < head_dim; ++d) {
      out[d] += p[t] * widen(vh[t * token + d]);
    }
  }
}

// `scores[t] = scale · q·k_t` for `t` in `[t0, t1)`.
template <typename T>
void scores_portable(const float* q, int64_t token, const T* kh, int t0, int t1, int head_dim,
                     float scale, float* scores) {
  for (int t = t0; t < t1; ++t) {
    scores[t] = dot_portable(q, kh + t * token, head_dim) * scale;
  }
}

// `scores[t] = exp(scores[t] - max)` for `t < len`; returns their sum.
float exp_portable(float* scores, int len, float max) {
  float total = 0.0f;
  for (int t = 0; t < len; ++t) {
    scores[t] = std::exp(scores[t] - max);
    total += scores[t];
  }
  return total;
}

#if defined(__x86_64__)

// `n` a multiple of 8.
template <typename T>
MLXKIT_AVX2 float dot_avx2(const float* a, const T* b, int n) {
  __m256 s0 = _mm256_setzero_ps();
  __m256 s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load8(b + i + 8), s1);
  }
  if (i < n) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), s0);
  }
  return horizontal_sum(_mm256_add_ps(s0, s1));
}

// `out += Σ_t p[t] · v_t` over tokens `[t0, t1)`, `head_dim` a multiple of 8. Sixty-four
// dimensions at a time stay in registers across the range's tokens, instead of `out` being
// loaded and stored once per token.
template <typename T>
MLXKIT_AVX2 void weighted_sum_avx2(const float* p, const T* vh, int64_t token, int t0, int t1,
                                   int head_dim, float* out) {
  int d0 = 0;
  for (; d0 + 64 <= head_dim; d0 += 64) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      acc[j] = _mm256_loadu_ps(out + d0 + 8 * j);
    }
    for (int t = t0; t < t1; ++t) {
      const __m256 pt = _mm256_set1_ps(p[t]);
      const T* v = vh + t * token + d0;
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        acc[j] = _mm256_fmadd_ps(pt, load8(v + 8 * j), acc[j]);
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      _mm256_storeu_ps(out + d0 + 8 * j, acc[j]);
    }
  }
  for (; d0 < head_dim; d0 += 8) {
    __m256 acc = _mm256_loadu_ps(out + d0);
    for (int t = t0; t < t1; ++t) {
      acc = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), load8(vh + t * token + d0), acc);
    }
    _mm256_storeu_ps(out + d0, acc);
  }
}

// Eight keys at a time: eight dot products in eight accumulators, reduced together, so no
// key pays a horizontal sum of its own. `head_dim` a multiple of 8; `t0` a multiple of 8, so a
// range's blocks of eight are the same whatever ranges a query's keys are cut into.
template <typename T>
MLXKIT_AVX2 void scores_avx2(const float* q, int64_t token, const T* kh, int t0, int t1,
                             int head_dim, float scale, float* scores) {
  const __m256 scale8 = _mm256_set1_ps(scale);
  int t = t0;
  for (; t + 8 <= t1; t += 8) {
    __m256 acc[8];
    for (int j = 0; j < 8; ++j) {
      acc[j] = _mm256_setzero_ps();
    }
    for (int d = 0; d < head_dim; d += 8) {
      const __m256 qd = _mm256_loadu_ps(q + d);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        acc[j] = _mm256_fmadd_ps(qd, load8(kh + (t + j) * token + d), acc[j]);
      }
    }
    // hadd pairs within each 128-bit half; the halves then add into the eight sums.
    const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]),
                                        _mm256_hadd_ps(acc[2], acc[3]));
    const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]),
                                        _mm256_hadd_ps(acc[6], acc[7]));
    const __m128 lo = _mm_add_ps(_mm256_castps256_ps128(s0123), _mm256_extractf128_ps(s0123, 1));
    const __m128 hi = _mm_add_ps(_mm256_castps256_ps128(s4567), _mm256_extractf128_ps(s4567, 1));
    _mm256_storeu_ps(scores + t, _mm256_mul_ps(_mm256_set_m128(hi, lo), scale8));
  }
  for (; t < t1; ++t) {
    scores[t] = dot_avx2(q, kh + t * token, head_dim) * scale;
  }
}

MLXKIT_AVX2 float exp_avx2_sum(float* scores, int len, float max) {
  const __m256 max8 = _mm256_set1_ps(max);
  __m256 total8 = _mm256_setzero_ps();
  int t = 0;
  for (; t + 8 <= len; t += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(scores + t), max8));
    _mm256_storeu_ps(scores + t, e);
    total8 = _mm256_add_ps(total8, e);
  }
  return horizontal_sum(total8) + exp_portable(scores + t, len - t, max);
}

// AVX-512 (`head_dim` a multiple of 16). The sixteen-lane kernels keep the AVX2 ones' shape
// but do twice the work per instruction, and the weighted sum carries up to four queries of a
// tile through one pass over the values, so each value is loaded once for all of them.

// `q · k` with sixteen partial sums.
template <typename T>
MLXKIT_AVX512 float dot_avx512(const float* a, const T* b, int n) {
  __m512 s = _mm512_setzero_ps();
  for (int i = 0; i < n; i += 16) {
    s = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load16(b + i), s);
  }
  return _mm512_reduce_add_ps(s);
}

// Sixteen keys at a time, each with its own sixteen partial sums, then the sixteen sums
// reduced together by a transposing tree (31 shuffles and 15 additions for sixteen keys,
// where a horizontal sum per key takes 16 instructions). `Chunks` is `head_dim / 16` when the
// query fits in registers (up to 128 dimensions), so the accumulators stay in registers too;
// 0 reads the query from memory for any multiple of 16. A key's score is the same bits
// wherever it falls: groups of sixteen start at `t0`, a multiple of 16 (the kernel's blocks
// start at multiples of 128), and only a range's last few keys take `dot_avx512`.
template <typename T, int Chunks>
MLXKIT_AVX512 void scores_avx512(const float* q, int64_t token, const T* kh, int t0, int t1,
                                 int head_dim, float scale, float* scores) {
  // The tree below leaves the sum of input slot s in lane kLane[s]; slot s is fed key kLane[s],
  // so lane j ends up holding key j.
  static constexpr int kLane[16] = {0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15};
  const __m512 scale16 = _mm512_set1_ps(scale);
  __m512 qd[Chunks > 0 ? Chunks : 1];
#pragma GCC unroll 8
  for (int c = 0; c < Chunks; ++c) {
    qd[c] = _mm512_loadu_ps(q + 16 * c);
  }
  int t = t0;
  for (; t + 16 <= t1; t += 16) {
    __m512 acc[16];
    const T* key = kh + t * token;
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j, key += token) {
      __m512 sum = _mm512_setzero_ps();
      if constexpr (Chunks > 0) {
#pragma GCC unroll 8
        for (int c = 0; c < Chunks; ++c) {
          sum = _mm512_fmadd_ps(qd[c], load16(key + 16 * c), sum);
        }
      } else {
        for (int d = 0; d < head_dim; d += 16) {
          sum = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), load16(key + d), sum);
        }
      }
      acc[j] = sum;
    }
    // 16 -> 8: each pair's four 128-bit quarters added in halves, [a | b] per vector.
    __m512 half[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512 a = acc[kLane[2 * j]];
      const __m512 b = acc[kLane[2 * j + 1]];
      half[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    // 8 -> 4: one quarter per key, four partial sums each.
    __m512 quarter[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512 a = half[2 * j];
      const __m512 b = half[2 * j + 1];
      quarter[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    }
    // 4 -> 2 -> 1: within each quarter, pairs of partial sums, then the last pair.
    const __m512 pair0 = _mm512_add_ps(_mm512_unpacklo_ps(quarter[0], quarter[1]),
                                       _mm512_unpackhi_ps(quarter[0], quarter[1]));
    const __m512 pair1 = _mm512_add_ps(_mm512_unpacklo_ps(quarter[2], quarter[3]),
                                       _mm512_unpackhi_ps(quarter[2], quarter[3]));
    const __m512 sums = _mm512_add_ps(_mm512_unpacklo_ps(pair0, pair1),
                                      _mm512_unpackhi_ps(pair0, pair1));
    _mm512_storeu_ps(scores + t, _mm512_mul_ps(sums, scale16));
  }
  for (; t < t1; ++t) {
    scores[t] = dot_avx512(q, kh + t * token, head_dim) * scale;
  }
}

// `exp_avx2_sum` sixteen lanes at a time.
MLXKIT_AVX512 float exp_avx512_sum(float* scores, int len, float max) {
  const __m512 max16 = _mm512_set1_ps(max);
  __m512 total16 = _mm512_setzero_ps();
  int t = 0;
  for (; t + 16 <= len; t += 16) {
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(scores + t), max16));
    _mm512_storeu_ps(scores + t, e);
    total16 = _mm512_add_ps(total16, e);
  }
  return _mm512_reduce_add_ps(total16) + exp_avx2_sum(scores + t, len - t, max);
}

// `scores_avx512` for this `head_dim` (a multiple of 16).
template <typename T>
auto scores_avx512_for(int head_dim) {
  using Scores = void (*)(const float*, int64_t, const T*, int, int, int, float, float*);
  static constexpr Scores by_chunks[9] = {
      scores_avx512<T, 0>, scores_avx512<T, 1>, scores_avx512<T, 2>,
      scores_avx512<T, 3>, scores_avx512<T, 4>, scores_avx512<T, 5>,
      scores_avx512<T, 6>, scores_avx512<T, 7>, scores_avx512<T, 8>};
  return head_dim / 16 <= 8 ? by_chunks[head_dim / 16] : by_chunks[0];
}

// `out[i] += Σ_t p[i][t] · v_t` over tokens `[0, n)` for `G` queries at once; each lane of
// each query runs the same fused multiply-adds in the same order as `weighted_sum_avx2` (one
// per token, in token order), so grouping never changes a query's bits.
template <typename T, int G>
MLXKIT_AVX512 void weighted_sums_avx512(const float* const* p, const T* vh, int64_t token, int n,
                                        int head_dim, float* const* out) {
  int d0 = 0;
  for (; d0 + 64 <= head_dim; d0 += 64) {
    __m512 acc[G][4];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        acc[g][j] = _mm512_loadu_ps(out[g] + d0 + 16 * j);
      }
    }
    for (int t = 0; t < n; ++t) {
      const T* v = vh + t * token + d0;
      const __m512 v0 = load16(v);
      const __m512 v1 = load16(v + 16);
      const __m512 v2 = load16(v + 32);
      const __m512 v3 = load16(v + 48);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        const __m512 pt = _mm512_set1_ps(p[g][t]);
        acc[g][0] = _mm512_fmadd_ps(pt, v0, acc[g][0]);
        acc[g][1] = _mm512_fmadd_ps(pt, v1, acc[g][1]);
        acc[g][2] = _mm512_fmadd_ps(pt, v2, acc[g][2]);
        acc[g][3] = _mm512_fmadd_ps(pt, v3, acc[g][3]);
      }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        _mm512_storeu_ps(out[g] + d0 + 16 * j, acc[g][j]);
      }
    }
  }
  for (; d0 < head_dim; d0 += 16) {
    __m512 acc[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      acc[g] = _mm512_loadu_ps(out[g] + d0);
    }
    for (int t = 0; t < n; ++t) {
      const __m512 v = load16(vh + t * token + d0);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(p[g][t]), v, acc[g]);
      }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      _mm512_storeu_ps(out[g] + d0, acc[g]);
    }
  }
}

template <typename T>
MLXKIT_AVX512 void weighted_sums_avx512(const float* const* p, int count, const T* vh,
                                        int64_t token, int n, int head_dim, float* const* out) {
  for (int g = 0; g < count; g += 4) {
    switch (std::min(4, count - g)) {
      case 1:
        weighted_sums_avx512<T, 1>(p + g, vh, token, n, head_dim, out + g);
        break;
      case 2:
        weighted_sums_avx512<T, 2>(p + g, vh, token, n, head_dim, out + g);
        break;
      case 3:
        weighted_sums_avx512<T, 3>(p + g, vh, token, n, head_dim, out + g);
        break;
      default:
        weighted_sums_avx512<T, 4>(p + g, vh, token, n, head_dim, out + g);
    }
  }
}

#endif  // __x86_64__

// The largest of `scores[0..len)`.
float max_portable(const float* scores, int64_t len) {
  float max = -INFINITY;
  for (int64_t t = 0; t < len; ++t) {
    max = std::max(max, scores[t]);
  }
  return max;
}

// `weighted_sum` for `count` queries over the same tokens `[0, n)`, one query after another.
template <typename T, void (*weighted_sum)(const float*, const T*, int64_t, int, int, int, float*)>
void weighted_sums_each(const float* const* p, int count, const T* vh, int64_t token, int n,
                        int head_dim, float* const* out) {
  for (int i = 0; i < count; ++i) {
    weighted_sum(p[i], vh, token, 0, n, head_dim, out[i]);
  }
}

template <typename T>
struct Kernels {
  void (*scores)(const float*, int64_t, const T*, int, int, int, float, float*);
  float (*max)(const float*, int64_t);
  float (*exp_sum)(float*, int, float);
  void (*weighted_sum)(const float*, const T*, int64_t, int, int, int, float*);
  // `weighted_sum` of several queries over one run of tokens, with the same bits per query.
  void (*weighted_sums)(const float* const*, int, const T*, int64_t, int, int, float* const*);
};

template <typename T>
Kernels<T> kernels_for(int head_dim) {
#if defined(__x86_64__)
  if (kernel_level() >= kAvx512 && head_dim % 16 == 0) {
    return {scores_avx512_for<T>(head_dim), max_avx2, exp_avx512_sum, weighted_sum_avx2<T>,
            weighted_sums_avx512<T>};
  }
  if (has_avx2() && head_dim % 8 == 0) {
    return {scores_avx2<T>, max_avx2, exp_avx2_sum, weighted_sum_avx2<T>,
            weighted_sums_each<T, weighted_sum_avx2<T>>};
  }
#endif
  return {scores_portable<T>, max_portable, exp_portable, weighted_sum_portable<T>,
          weighted_sums_each<T, weighted_sum_portable<T>>};
}

// Queries attended together, and keys per pass over them (a multiple of 8): a block of 128
// keys (32 KB at head_dim 64) is read from memory once for the whole tile and from L1 for the
// rest, where one query at a time read a long prompt's keys and values from L3 per query.
constexpr int kQueryTile = 8;
constexpr int kKeyBlock = 128;

// Queries `q[i]` of one head, `i < count <= kQueryTile`: `out[i] = softmax(scale · K q[i]) V`
// over the first `visible[i]` tokens. Keys and values are walked in blocks shared by the
// tile, but each query's sums run in the same order as when it is attended alone (blocks of
// eight keys, or sixteen with AVX-512, from each block's start; values accumulated token after
// token), so its result is the same bits.
template <typename Source>
void attend_tile(const Kernels<typename Source::Element>& k, const float* const* q,
                 const int* visible, int count, const Source& keys, const Source& values,
                 const bool* const* allowed, int64_t allowed_step, int head_dim, float scale,
                 std::optional<float> softcap, std::vector<float>& scores,
                 std::vector<float>& scratch, float* const* out) {
  const int longest = *std::max_element(visible, visible + count);
  const size_t stride = static_cast<size_t>(longest);
  scores.resize(std::max(scores.size(), stride * count));
  for (int t0 = 0; t0 < longest; t0 += kKeyBlock) {
    const int end = std::min(t0 + kKeyBlock, longest);
    const auto* block = keys.run(t0, end, scratch);
    for (int i = 0; i < count; ++i) {
      const int t1 = std::min(end, visible[i]);
      if (t0 < t1) {
        k.scores(q[i], keys.stride(), block, 0, t1 - t0, head_dim, scale,
                 scores.data() + i * stride + t0);
      }
    }
  }
  // On the stack: a decode step calls this once per row, head and layer.
  float inverse[kQueryTile];
  for (int i = 0; i < count; ++i) {
    float* s = scores.data() + i * stride;
    if (softcap) {
      for (int t = 0; t < visible[i]; ++t) {
        s[t] = *softcap * std::tanh(s[t] / *softcap);
      }
    }
    // After the soft cap, which would turn -inf into -cap.
    if (allowed[i] != nullptr) {
      for (int t = 0; t < visible[i]; ++t) {
        if (!allowed[i][t * allowed_step]) {
          s[t] = -INFINITY;
        }
      }
    }
    const float max = k.max(s, visible[i]);
    if (max == -INFINITY) {
      // A query that sees nothing: zero weights and zeros out, not NaN.
      std::fill(s, s + visible[i], 0.0f);
      inverse[i] = 0.0f;
    } else {
      inverse[i] = 1.0f / k.exp_sum(s, visible[i], max);
    }
    std::fill(out[i], out[i] + head_dim, 0.0f);
  }
  // Every query of the tile through the tokens all of them see in this block, together; then
  // each query alone through the rest of what it sees.
  const float* weights[kQueryTile];
  for (int t0 = 0; t0 < longest; t0 += kKeyBlock) {
    const int end = std::min(t0 + kKeyBlock, longest);
    const auto* block = values.run(t0, end, scratch);
    int shared = end - t0;
    for (int i = 0; i < count; ++i) {
      weights[i] = scores.data() + i * stride + t0;
      shared = std::max(0, std::min(shared, visible[i] - t0));
    }
    if (shared > 0) {
      k.weighted_sums(weights, count, block, values.stride(), shared, head_dim, out);
    }
    for (int i = 0; i < count; ++i) {
      const int t1 = std::min(end, visible[i]);
      if (t0 + shared < t1) {
        k.weighted_sum(weights[i], block, values.stride(), shared, t1 - t0, head_dim, out[i]);
      }
    }
  }
  for (int i = 0; i < count; ++i) {
    for (int d = 0; d < head_dim; ++d) {
      out[i][d] *= inverse[i];
    }
  }
}

// Every (row, head) pair's queries over the row's keys and values, read through `Source`.
template <typename Source>
void attend_rows(const std::vector<mx::array>& held, mx::array& y, int rows, int heads,
                 int length, int head_dim, float scale, std::optional<float> softcap,
                 const std::vector<bool>& causal, const std::vector<bool>& masked) {
  using T = typename Source::Element;
  const Kernels<T> k = kernels_for<T>(head_dim);
  const auto& queries = held[0];
  float* out = y.data<float>();
  const auto& qs = queries.strides();
  const int kv_heads = held[1].shape(1);
  const int group = heads / kv_heads;
  // Each masked row's mask follows the keys and values, in row order.
  std::vector<const mx::array*> masks(rows, nullptr);
  for (int r = 0, next = 1 + 2 * rows; r < rows; ++r) {
    if (masked[r]) {
      masks[r] = &held[next++];
    }
  }
  // One unit: a row's key/value head and the queries of every head that shares it, in tiles,
  // so a decode step reads a long history once for the whole group of query heads rather than
  // once per head (three times on SmolLM2, four on Gemma 3). Queries go in order of position,
  // then head, so a prompt chunk's tiles see nearly the same keys.
  // One item of work: a tile of a unit's queries. Tiles of one unit are consecutive items, so a
  // thread's range of items reads one history while it can; a prompt chunk of a model with a
  // single kv head (Gemma 3) still spreads over every thread.
  const int tiles = (group * length + kQueryTile - 1) / kQueryTile;
  auto attend_item = [&](int item, std::vector<float>& scores, std::vector<float>& scratch) {
    const int unit = item / tiles;
    const int r = unit / kv_heads;
    const int kv = unit % kv_heads;
    const auto& keys = held[1 + 2 * r];
    const auto& values = held[2 + 2 * r];
    const int history = keys.shape(2);
    const Source key_source = Source::of(keys, kv);
    const Source value_source = Source::of(values, kv);
    const int j0 = item % tiles * kQueryTile;
    const int count = std::min(kQueryTile, group * length - j0);
    const float* q[kQueryTile];
    float* o[kQueryTile];
    int visible[kQueryTile];
    const bool* allowed[kQueryTile];
    for (int j = 0; j < count; ++j) {
      const int i = (j0 + j) / group;
      const int h = kv * group + (j0 + j) % group;
      // Causal: query i of `length` sits at position history - length + i.
      visible[j] = causal[r] ? history - length + i + 1 : history;
      q[j] = queries.data<float>() + r * qs[0] + h * qs[1] + i * qs[2];
      o[j] = out + ((static_cast<size_t>(r) * heads + h) * length + i) * head_dim;
      allowed[j] = masks[r] == nullptr ? nullptr
                                       : masks[r]->data<bool>() + i * masks[r]->strides()[0];
    }
    const int64_t allowed_step = masks[r] == nullptr ? 0 : masks[r]->strides()[1];
    attend_tile(k, q, visible, count, key_source, value_source, allowed, allowed_step, head_dim,
                scale, softcap, scores, scratch, o);
  };
  // Items split over the pool's threads when there is enough work to pay for it.
  int64_t work = 0;
  for (int r = 0; r < rows; ++r) {
    work += static_cast<int64_t>(heads) * length * held[1 + 2 * r].shape(2) * head_dim;
  }
  const int items = rows * kv_heads * tiles;
  const int parts = static_cast<int>(
      std::min<int64_t>({pool_threads() * 4LL, work / kMinWorkPerPart, items}));
  if (parts <= 1) {
    std::vector<float> scores, scratch;
    for (int item = 0; item < items; ++item) {
      attend_item(item, scores, scratch);
    }
    return;
  }
  parallel_for(parts, [&](int p) {
    std::vector<float> scores, scratch;
    for (int item = items * p / parts; item < items * (p + 1) / parts; ++item) {
      attend_item(item, scores, scratch);
    }
  });
}

class RowsAttention : public mx::UnaryPrimitive {
 public:
  RowsAttention(mx::Stream stream, float scale, std::optional<float> softcap,
                std::vector<bool> causal, std::vector<bool> masked)
      : mx::UnaryPrimitive(stream),
        scale_(scale),
        softcap_(softcap),
        causal_(std::move(causal)),
        masked_(std::move(masked)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& y) override {
    const auto& queries = inputs[0];
    const int rows = queries.shape(0);
    const int heads = queries.shape(1);
    const int length = queries.shape(2);
    const int head_dim = queries.shape(3);
    // Queries, keys and values; masks are read through their strides.
    for (int i = 0; i < 1 + 2 * rows; ++i) {
      if (inputs[i].strides().back() != 1) {
        throw std::invalid_argument("rows attention: head_dim is not contiguous");
      }
    }
    y.set_data(mx::allocator::malloc(y.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    std::vector<mx::array> held;
    held.reserve(inputs.size());
    for (const auto& a : inputs) {
      encoder.set_input_array(a);
      held.push_back(mx::array::unsafe_weak_copy(a));
    }
    encoder.set_output_array(y);
    const mx::Dtype stored = inputs[1].dtype();
    encoder.dispatch([held = std::move(held), y = mx::array::unsafe_weak_copy(y), rows, heads,
                      length, head_dim, scale = scale_, softcap = softcap_, causal = causal_,
                      masked = masked_, stored]() mutable {
      if (stored == mx::float16) {
        attend_rows<Direct<Half>>(held, y, rows, heads, length, head_dim, scale, softcap,
                                  causal, masked);
      } else if (stored == mx::uint8) {
        attend_rows<Dequantized>(held, y, rows, heads, length, head_dim, scale, softcap,
                                 causal, masked);
      } else {
        attend_rows<Direct<float>>(held, y, rows, heads, length, head_dim, scale, softcap,
                                   causal, masked);
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("decode attention runs on the CPU only");
  }

  const char* name() const override {
    return "RowsAttention";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const RowsAttention*>(&other);
    return o != nullptr && scale_ == o->scale_ && softcap_ == o->softcap_ &&
           causal_ == o->causal_ && masked_ == o->masked_;
  }

 private:
  float scale_;
  std::optional<float> softcap_;
  std::vector<bool> causal_;
  std::vector<bool> masked_;
};

}  // namespace

std::optional<mx::array> rows_attention(const mx::array& queries,
                                        const std::vector<mx::array>& keys,
                                        const std::vector<mx::array>& values,
                                        const std::vector<bool>& causal,
                                        const std::vector<std::optional<mx::array>>& masks,
                                        float scale, std::optional<float> softcap) {
  if (!primitive_runs(Primitive::RowsAttention) || queries.ndim() != 4 ||
      queries.dtype() != mx::float32) {
    return std::nullopt;
  }
  const int rows = queries.shape(0);
  const int heads = queries.shape(1);
  const int length = queries.shape(2);
  const int head_dim = queries.shape(3);
  if (rows == 0 || length == 0 || head_dim == 0 || keys.size() != static_cast<size_t>(rows) ||
      values.size() != keys.size() || causal.size() != keys.size() ||
      masks.size() != keys.size()) {
    return std::nullopt;
  }
  std::vector<mx::array> inputs{queries};
  inputs.reserve(1 + 2 * keys.size());
  for (size_t r = 0; r < keys.size(); ++r) {
    const auto& k = keys[r];
    const auto& v = values[r];
    // Keys and values are f32, f16 (a half-precision cache) or 8-bit rows of 5/4 bytes an
    // element (groups of 32), for every row alike.
    const auto stored = keys[0].dtype();
    const bool rows_of_codes = stored == mx::uint8 && head_dim % kQ8Group == 0;
    const int row_width = rows_of_codes ? head_dim / 4 * 5 : head_dim;
    if (k.ndim() != 4 || k.shape() != v.shape() ||
        (stored != mx::float32 && stored != mx::float16 && !rows_of_codes) ||
        k.dtype() != stored || v.dtype() != stored || k.shape(0) != 1 || k.shape(1) == 0 ||
        heads % k.shape(1) != 0 || k.shape(1) != keys[0].shape(1) || k.shape(2) == 0 ||
        k.shape(3) != row_width ||
        (causal[r] && k.shape(2) < length)) {
      return std::nullopt;
    }
    inputs.push_back(k);
    inputs.push_back(v);
  }
  std::vector<bool> masked;
  for (size_t r = 0; r < keys.size(); ++r) {
    const auto& mask = masks[r];
    masked.push_back(mask.has_value());
    if (!mask) {
      continue;
    }
    if (mask->dtype() != mx::bool_ || mask->ndim() != 2 || mask->shape(0) != length ||
        mask->shape(1) != keys[r].shape(2)) {
      return std::nullopt;
    }
    inputs.push_back(*mask);
  }
  const auto stream = mx::default_stream(mx::Device::cpu);
  return mx::array(queries.shape(), mx::float32,
                   std::make_shared<RowsAttention>(stream, scale, softcap, causal, masked),
                   std::move(inputs));
}

}  // namespace mlxkit
