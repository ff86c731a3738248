// Products of k-block matrices (kblocks_layout.h) with their activations rounded to signed
// bytes, as llama.cpp computes a k-quant product on a CPU (its Q8_K activations).
//
// Why: on a CPU with little float throughput a k-quant decode step is bound by arithmetic,
// not by memory. The f32 product widens each weight to a float, scales it and multiplies it:
// about five vector instructions per eight weights. Llama 3.2 1B in Q4_K_M decoded at 4.7
// tokens/s that way on two cores where llama.cpp, reading the same bytes with byte
// multiplies, gave 10.2 (issue 51). Rounded to bytes, a row of `x` meets 32 weights per
// `vpmaddubsw`, and a super-block's sums are exact integers.
//
// Rounding: for each row of `x` and 256 columns, `step = max|x| / 127` and
// `q = round(x · (127 / max|x|))`, to nearest (ties to even), so `|x − step · q|` is at most
// `step / 2` plus f32 rounding. A product's distance from the f32 one is therefore at most
// `Σ |w| · step / 2` over each super-block, plus f32 rounding; mlx/tests/k_blocks.rs holds
// every product to that bound. It is not the f32 product: a model run this way answers as
// llama.cpp's CPU product of the same file would, not as the reference does, so the user
// chooses it (`MLXKIT_ACTIVATIONS=int8`, `KBlocks::matmul_with`); it is never the default.
//
// Exactness: one super-block's `Σ_g sc_g Σ q_w · q_x` is an exact 32-bit integer (at most
// 63·15·127·256 for Q4_K; 128·127·127·256 for Q6_K, whose held values `q − 32` the loader
// admits up to 127; both below 2^31). It becomes f32 once and is added, times `d · step`, to
// its row's f32 sum in super-block order. Q4_K's min term, `Σ_g m_g Σ q_x` per super-block
// (at most 8·63·32·127 < 2^24, exact in f32), times `dmin · step`, is summed apart and
// subtracted at the end. The AVX2 and portable kernels run
// exactly these operations, so they agree to the bit, and a row's result depends on neither
// the rows batched with it nor the thread count.

#include "kblocks_int8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kblocks_layout.h"
#include "pool.h"
#include "x86.h"

namespace mlxkit {

namespace {

using kblock::band_block;
using kblock::f16;
using kblock::kBand;
using kblock::kBlockRows;
using kblock::kQ4;
using kblock::kQ4Mins;
using kblock::kQ4Offsets;
using kblock::kQ4Scales;
using kblock::kQ4Values;
using kblock::kQ6Scales;
using kblock::kQ6Values;
using kblock::kSuper;

// The rows of `x` rounded to bytes.
struct Rounded {
  int rows = 0;
  int64_t in = 0;
  int64_t supers = 0;
  std::vector<int8_t> values;  // [rows][in]
  // [supers][rows + 8]: one super-block's steps for consecutive rows sit together, so a tile
  // loads eight at once; the 8 spare lanes keep that load inside the vector.
  std::vector<float> steps;
  // [rows][supers][8]: each group of 32's sum of values (Q4_K's min term), exact in f32.
  std::vector<float> group_sums;

  Rounded(int rows_, int64_t in_)
      : rows(rows_),
        in(in_),
        supers(in_ / kSuper),
        values(static_cast<size_t>(rows_) * in_),
        steps(static_cast<size_t>(supers) * (rows_ + 8), 0.0f),
        group_sums(static_cast<size_t>(rows_) * supers * 8) {}

  const int8_t* row(int m) const {
    return values.data() + m * in;
  }
  float step(int m, int64_t s) const {
    return steps[s * (rows + 8) + m];
  }
  const float* steps_from(int64_t s, int m) const {
    return steps.data() + s * (rows + 8) + m;
  }
  const float* sums(int m, int64_t s) const {
    return group_sums.data() + (m * supers + s) * 8;
  }
};

// One super-block of a row rounded: the step, the 256 values and the 8 group sums. A block
// holding a NaN or an infinity gets step NaN (and zero values), so its products are NaN as
// the f32 product's would be.
float round_block_portable(const float* x, int8_t* q, float* sums) {
  float largest = 0.0f;
  bool finite = true;
  for (int e = 0; e < kSuper; ++e) {
    finite = finite && std::isfinite(x[e]);
    largest = std::max(largest, std::fabs(x[e]));
  }
  if (!finite || largest == 0.0f) {
    std::fill(q, q + kSuper, 0);
    std::fill(sums, sums + 8, 0.0f);
    return finite ? 0.0f : NAN;
  }
  const float inverse = 127.0f / largest;
  for (int g = 0; g < 8; ++g) {
    int sum = 0;
    for (int e = 32 * g; e < 32 * g + 32; ++e) {
      q[e] = static_cast<int8_t>(std::lrint(x[e] * inverse));
      sum += q[e];
    }
    sums[g] = static_cast<float>(sum);
  }
  return largest / 127.0f;
}

#if defined(__x86_64__)

// As `round_block_portable`, eight lanes at a time: `vcvtps2dq` rounds to nearest, ties to
// even, as `lrint` does in the default rounding mode.
MLXKIT_AVX2 float round_block_avx2(const float* x, int8_t* q, float* sums) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 infinity = _mm256_set1_ps(INFINITY);
  __m256 largest = _mm256_setzero_ps();
  __m256 bad = _mm256_setzero_ps();
  for (int e = 0; e < kSuper; e += 8) {
    const __m256 magnitude = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + e));
    largest = _mm256_max_ps(largest, magnitude);
    // Not less than infinity, or unordered: an infinity or a NaN.
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(magnitude, infinity, _CMP_NLT_UQ));
  }
  __m128 top = _mm_max_ps(_mm256_castps256_ps128(largest), _mm256_extractf128_ps(largest, 1));
  top = _mm_max_ps(top, _mm_movehl_ps(top, top));
  top = _mm_max_ss(top, _mm_movehdup_ps(top));
  const float most = _mm_cvtss_f32(top);
  const bool finite = _mm256_movemask_ps(bad) == 0;
  if (!finite || most == 0.0f) {
    std::memset(q, 0, kSuper);
    std::fill(sums, sums + 8, 0.0f);
    return finite ? 0.0f : NAN;
  }
  const __m256 inverse = _mm256_set1_ps(127.0f / most);
  // packs interleave the 128-bit lanes; this puts the 32 bytes back in column order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int g = 0; g < 8; ++g) {
    const float* v = x + 32 * g;
    const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v), inverse));
    const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 8), inverse));
    const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 16), inverse));
    const __m256i d = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 24), inverse));
    const __m256i bytes = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d)), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * g), bytes);
    const __m256i total = _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, d));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    sums[g] = static_cast<float>(_mm_cvtsi128_si32(s));
  }
  return most / 127.0f;
}

#endif  // __x86_64__

Rounded round_rows(const float* x, int rows, int64_t in, bool avx2) {
  Rounded r(rows, in);
  for (int m = 0; m < rows; ++m) {
    for (int64_t s = 0; s < r.supers; ++s) {
      const float* block = x + m * in + s * kSuper;
      int8_t* q = r.values.data() + m * in + s * kSuper;
      float* sums = r.group_sums.data() + (m * r.supers + s) * 8;
#if defined(__x86_64__)
      r.steps[s * (rows + 8) + m] = avx2 ? round_block_avx2(block, q, sums)
                                         : round_block_portable(block, q, sums);
#else
      (void)avx2;
      r.steps[s * (rows + 8) + m] = round_block_portable(block, q, sums);
#endif
    }
  }
  return r;
}

// Any machine: bands `[b0, b1)` against every rounded row, one (row, weight row) at a time.
void matmul_portable(int type, const Rounded& x, const uint8_t* w, int64_t out, int b0, int b1,
                     float* y) {
  const size_t block_bytes = band_block(type);
  const size_t band_bytes = block_bytes * x.supers;
  for (int b = b0; b < b1; ++b) {
    const uint8_t* band = w + b * band_bytes;
    for (int row = 0; row < kBand; ++row) {
      for (int m = 0; m < x.rows; ++m) {
        float total = 0.0f;
        float mins = 0.0f;
        for (int64_t s = 0; s < x.supers; ++s) {
          const uint8_t* block = band + s * block_bytes;
          const int8_t* xq = x.row(m) + s * kSuper;
          int32_t sum = 0;
          if (type == kQ4) {
            const uint8_t* q = block + kQ4Values + 128 * row;
            for (int c = 0; c < 4; ++c) {
              int32_t low = 0;
              int32_t high = 0;
              for (int l = 0; l < 32; ++l) {
                low += (q[32 * c + l] & 0xF) * xq[64 * c + l];
                high += (q[32 * c + l] >> 4) * xq[64 * c + 32 + l];
              }
              sum += block[kQ4Scales + 8 * (2 * c) + row] * low +
                     block[kQ4Scales + 8 * (2 * c + 1) + row] * high;
            }
            int32_t offsets = 0;
            for (int g = 0; g < 8; ++g) {
              offsets += block[kQ4Offsets + 8 * g + row] * static_cast<int32_t>(x.sums(m, s)[g]);
            }
            const float dmin = f16(block + kQ4Mins + 2 * row);
            mins = std::fma(static_cast<float>(offsets), dmin * x.step(m, s), mins);
          } else {
            const auto* q = reinterpret_cast<const int8_t*>(block + kQ6Values + 256 * row);
            for (int g = 0; g < 16; ++g) {
              int32_t part = 0;
              for (int e = 16 * g; e < 16 * g + 16; ++e) {
                part += q[e] * xq[e];
              }
              sum += static_cast<int8_t>(block[kQ6Scales + 8 * g + row]) * part;
            }
          }
          total = std::fma(static_cast<float>(sum), f16(block + 2 * row) * x.step(m, s), total);
        }
        y[m * out + b * kBand + row] = type == kQ4 ? total - mins : total;
      }
    }
  }
}

#if defined(__x86_64__)

// Lane i holds the sum of `v[i]`'s lanes.
MLXKIT_AVX2 inline __m256i lane_sums(const __m256i (&v)[8]) {
  const __m256i ab = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]),
                                       _mm256_hadd_epi32(v[2], v[3]));
  const __m256i cd = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]),
                                       _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20),
                          _mm256_permute2x128_si256(ab, cd, 0x31));
}

// A band's group scales as 16-bit integers, as the tiles broadcast them. Q4_K: `[s][g][row]`,
// one `vpbroadcastw` each. Q6_K: per super-block, `[pair][row]` 32-bit words holding groups
// 2p and 2p + 1 of that row, which one `vpbroadcastd` and a shuffle spread over a register's
// two halves (a 32-byte load of Q6_K values spans two groups of 16).
constexpr int kScaleWords = 128;  // int16 per super-block

MLXKIT_AVX2 void band_scales(int type, const uint8_t* band, int64_t supers, int16_t* scales) {
  const size_t block_bytes = band_block(type);
  for (int64_t s = 0; s < supers; ++s) {
    const uint8_t* block = band + s * block_bytes;
    int16_t* to = scales + s * kScaleWords;
    if (type == kQ4) {
      for (int g = 0; g < 8; g += 2) {
        const __m128i bytes =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kQ4Scales + 8 * g));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + 8 * g), _mm256_cvtepu8_epi16(bytes));
      }
    } else {
      for (int p = 0; p < 8; ++p) {
        // Groups 2p and 2p + 1, eight rows each: interleaved per row, then widened.
        const __m128i both =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kQ6Scales + 16 * p));
        const __m128i pairs = _mm_unpacklo_epi8(both, _mm_srli_si128(both, 8));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + 16 * p), _mm256_cvtepi8_epi16(pairs));
      }
    }
  }
}

// Q4_K's min term of rows `[m0, m0 + rows)` against a band's 8 rows: `mins[m][row]`, the same
// operations as the portable kernel's (the products and sums of whole numbers are exact).
MLXKIT_AVX2 void q4k_mins(const Rounded& x, int m0, int rows, const uint8_t* band, float* mins) {
  const size_t block_bytes = band_block(kQ4);
  for (int m = 0; m < rows; ++m) {
    __m256 total = _mm256_setzero_ps();
    for (int64_t s = 0; s < x.supers; ++s) {
      const uint8_t* block = band + s * block_bytes;
      const float* sums = x.sums(m0 + m, s);
      __m256 offsets = _mm256_setzero_ps();
      for (int g = 0; g < 8; ++g) {
        const __m256 m_g = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + kQ4Offsets + 8 * g))));
        offsets = _mm256_fmadd_ps(m_g, _mm256_set1_ps(sums[g]), offsets);
      }
      const __m256 dmin =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kQ4Mins)));
      total = _mm256_fmadd_ps(offsets, _mm256_mul_ps(dmin, _mm256_set1_ps(x.step(m0 + m, s))),
                              total);
    }
    _mm256_storeu_ps(mins + kBand * m, total);
  }
}

// Lane i of a tile's sums is (row of x i / J, weight row j0 + i % J): the index of each
// lane's weight row within the band and of its row of x within the tile.
struct LaneRows {
  __m256i weight_rows;
  __m256i x_rows;
};

template <int J>
MLXKIT_AVX2 inline LaneRows lane_rows(int j0) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return {_mm256_add_epi32(_mm256_set1_epi32(j0), _mm256_and_si256(lane, _mm256_set1_epi32(J - 1))),
          _mm256_srli_epi32(lane, J == 8 ? 3 : J == 4 ? 2 : J == 2 ? 1 : 0)};
}

// The super-block's factor `d · step` for each lane, from the band's eight `d` and the tile's
// rows' eight steps.
MLXKIT_AVX2 inline __m256 lane_factors(const uint8_t* block, const float* steps, LaneRows lanes) {
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
  return _mm256_mul_ps(_mm256_permutevar8x32_ps(d, lanes.weight_rows),
                       _mm256_permutevar8x32_ps(_mm256_loadu_ps(steps), lanes.x_rows));
}

template <int M, int J>
MLXKIT_AVX2 inline __attribute__((always_inline)) void store_lanes(__m256 total, const float* mins,
                                                                   int m0, int j0, int64_t n,
                                                                   int64_t out, float* y) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  for (int m = 0; m < M; ++m) {
    for (int j = 0; j < J; ++j) {
      const float v = lanes[m * J + j];
      y[(m0 + m) * out + n + j0 + j] = mins != nullptr ? v - mins[kBand * m + j0 + j] : v;
    }
  }
}

// Rows `[m0, m0 + M)` of `x` against rows `[j0, j0 + J)` of one Q4_K band; `scales` the band's
// (`band_scales`), `mins` its min terms for those rows (`q4k_mins`).
template <int M, int J>
MLXKIT_AVX2 inline __attribute__((always_inline)) void q4k_tile(const Rounded& x, int m0,
                                                                const uint8_t* band,
                                                                const int16_t* scales, int j0,
                                                                const float* mins, int64_t n,
                                                                int64_t out, float* y) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const LaneRows lanes = lane_rows<J>(j0);
  const size_t block_bytes = band_block(kQ4);
  __m256 total = _mm256_setzero_ps();
  for (int64_t s = 0; s < x.supers; ++s) {
    const uint8_t* block = band + s * block_bytes;
    const uint8_t* q = block + kQ4Values;
    const int16_t* sc = scales + s * kScaleWords;
    __m256i sums[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      sums[i] = _mm256_setzero_si256();
    }
    for (int c = 0; c < 4; ++c) {
#pragma GCC unroll 8
      for (int j = 0; j < J; ++j) {
        const int row = j0 + j;
        const __m256i w =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 128 * row + 32 * c));
        const __m256i w_low = _mm256_and_si256(w, low);
        const __m256i w_high = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
        const __m256i sc_low = _mm256_set1_epi16(sc[kBand * (2 * c) + row]);
        const __m256i sc_high = _mm256_set1_epi16(sc[kBand * (2 * c + 1) + row]);
#pragma GCC unroll 8
        for (int m = 0; m < M; ++m) {
          const int8_t* xq = x.row(m0 + m) + s * kSuper + 64 * c;
          const __m256i lo = _mm256_madd_epi16(
              _mm256_maddubs_epi16(w_low, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq))),
              sc_low);
          const __m256i hi = _mm256_madd_epi16(
              _mm256_maddubs_epi16(w_high,
                                   _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32))),
              sc_high);
          sums[m * J + j] = _mm256_add_epi32(sums[m * J + j], _mm256_add_epi32(lo, hi));
        }
      }
    }
    total = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane_sums(sums)),
                            lane_factors(block, x.steps_from(s, m0), lanes),
                            total);
  }
  store_lanes<M, J>(total, mins, m0, j0, n, out, y);
}

// As `q4k_tile` for a Q6_K band: signed values, so `|w|` meets `x` with `w`'s sign.
template <int M, int J>
MLXKIT_AVX2 inline __attribute__((always_inline)) void q6k_tile(const Rounded& x, int m0,
                                                                const uint8_t* band,
                                                                const int16_t* scales, int j0,
                                                                int64_t n, int64_t out, float* y) {
  // Bytes 0-1 of the broadcast word (group 2p) over the low half, 2-3 (group 2p + 1) the high.
  const __m256i spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3,
                                          2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  const LaneRows lanes = lane_rows<J>(j0);
  const size_t block_bytes = band_block(kblock::kQ6);
  __m256 total = _mm256_setzero_ps();
  for (int64_t s = 0; s < x.supers; ++s) {
    const uint8_t* block = band + s * block_bytes;
    const uint8_t* q = block + kQ6Values;
    const int16_t* sc = scales + s * kScaleWords;
    __m256i sums[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      sums[i] = _mm256_setzero_si256();
    }
    for (int p = 0; p < 8; ++p) {
#pragma GCC unroll 8
      for (int j = 0; j < J; ++j) {
        const int row = j0 + j;
        const __m256i w =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 256 * row + 32 * p));
        const __m256i magnitude = _mm256_abs_epi8(w);
        int32_t pair;
        std::memcpy(&pair, sc + 16 * p + 2 * row, 4);
        const __m256i scale = _mm256_shuffle_epi8(_mm256_set1_epi32(pair), spread);
#pragma GCC unroll 8
        for (int m = 0; m < M; ++m) {
          const int8_t* xq = x.row(m0 + m) + s * kSuper + 32 * p;
          const __m256i signed_x =
              _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq)), w);
          sums[m * J + j] = _mm256_add_epi32(
              sums[m * J + j],
              _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_x), scale));
        }
      }
    }
    total = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane_sums(sums)),
                            lane_factors(block, x.steps_from(s, m0), lanes),
                            total);
  }
  store_lanes<M, J>(total, nullptr, m0, j0, n, out, y);
}

// Rows `[m0, m0 + M)` against bands `[b0, b1)`, `J` of each band's rows at a time: M×J sums
// of eight lanes each, one register apiece.
template <int Type, int M>
MLXKIT_AVX2 void matmul_avx2(const Rounded& x, int m0, const uint8_t* w, int64_t out, int b0,
                             int b1, float* y) {
  constexpr int J = M == 1 ? 8 : M == 2 ? 4 : M <= 4 ? 2 : 1;
  const size_t band_bytes = band_block(Type) * x.supers;
  std::vector<int16_t> scales(static_cast<size_t>(x.supers) * kScaleWords);
  alignas(32) float mins[kBlockRows * kBand];
  for (int b = b0; b < b1; ++b) {
    const uint8_t* band = w + b * band_bytes;
    if (b + 2 < b1) {
      const char* ahead = reinterpret_cast<const char*>(band + 2 * band_bytes);
      for (size_t offset = 0; offset < band_bytes; offset += 64) {
        _mm_prefetch(ahead + offset, _MM_HINT_T0);
      }
    }
    band_scales(Type, band, x.supers, scales.data());
    const int64_t n = static_cast<int64_t>(b) * kBand;
    if constexpr (Type == kQ4) {
      q4k_mins(x, m0, M, band, mins);
      for (int j0 = 0; j0 < kBand; j0 += J) {
        q4k_tile<M, J>(x, m0, band, scales.data(), j0, mins, n, out, y);
      }
    } else {
      for (int j0 = 0; j0 < kBand; j0 += J) {
        q6k_tile<M, J>(x, m0, band, scales.data(), j0, n, out, y);
      }
    }
  }
}

#endif  // __x86_64__

}  // namespace

void k_blocks_matmul_int8(int type, const float* x, int rows, int64_t in, const uint8_t* w,
                          int64_t out, float* y) {
  const bool avx2 = has_avx2();
  const Rounded rounded = round_rows(x, rows, in, avx2);
#if defined(__x86_64__)
  if (avx2) {
    using Kernel = void (*)(const Rounded&, int, const uint8_t*, int64_t, int, int, float*);
    constexpr int q6 = kblock::kQ6;
    static constexpr Kernel kernels[2][kBlockRows] = {
        {matmul_avx2<kQ4, 1>, matmul_avx2<kQ4, 2>, matmul_avx2<kQ4, 3>, matmul_avx2<kQ4, 4>,
         matmul_avx2<kQ4, 5>, matmul_avx2<kQ4, 6>, matmul_avx2<kQ4, 7>, matmul_avx2<kQ4, 8>},
        {matmul_avx2<q6, 1>, matmul_avx2<q6, 2>, matmul_avx2<q6, 3>, matmul_avx2<q6, 4>,
         matmul_avx2<q6, 5>, matmul_avx2<q6, 6>, matmul_avx2<q6, 7>, matmul_avx2<q6, 8>},
    };
    const Kernel* by_rows = kernels[type == kQ4 ? 0 : 1];
    kblock::for_each_pass(rows, in, out, [&](int m0, int m, int b0, int b1) {
      by_rows[m - 1](rounded, m0, w, out, b0, b1, y);
    });
    return;
  }
#endif
  split_rows(rows, static_cast<int>(in), static_cast<int>(out), [&](int n0, int n1) {
    matmul_portable(type, rounded, w, out, n0 / kBand, n1 / kBand, y);
  });
}

}  // namespace mlxkit
