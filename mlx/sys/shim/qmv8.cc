// The packed matrix-vector product over 8-bit activations: the integer path of `qmv.cc`.
//
// The f32 kernel unpacks every weight to a float and spends one FMA per weight and row. Here
// each row of `x` is first quantized to signed 8-bit integers in blocks of 32 elements, with
// one f32 scale per block (`dx = max|x| / 127`, rounded to nearest), and a block's products
// with the packed weights are integer dot products: `maddubs` multiplies 32 unsigned weights by
// 32 signed activations into 16-bit pair sums, `madd` widens them to eight 32-bit sums, and
// only then does the block meet its scales in f32. That is llama.cpp's Q4_1 × Q8_1 scheme,
// over MLX's affine layout.
//
// What is exact and what is not:
// - The integer sums are exact. The weights are the checkpoint's own integers and scales.
// - The bias term of a group, `bias · Σ x`, uses the exact f32 sum of the unquantized `x`, as
//   the f32 kernel does; only the `scale · Σ q·x` term sees the rounded activations.
// - Each activation moves by at most half a step, `dx / 2`, so a block's term moves by at most
//   `scale · dx / 2 · Σ |q - c|`, `c` the centre below (0 for 4-bit weights; the bound
//   `mlx/tests/int8_matvec.rs` checks).
//
// 8-bit weights (`q` in 0..255) would overflow `maddubs`' 16-bit pair sums against activations
// up to 127, so they are centred to `q - 128` (-128..127) and multiplied by sign: `|q - 128|`
// as unsigned times `x` with the sign of `q - 128` (at most 2·128·127 = 32512 per pair). The
// 128 that centring removed comes back through the bias: `(bias + 128 · scale) · Σ x`, with
// the exact sum again. Only `scale · (q - 128)` then meets the rounded activations: for weights
// spread over 0..255 (Q8_0) that shrinks the rounding error, while 5- and 6-bit weights widened
// into 8 bits sit far below 128 and see it grow (bench/RESULTS.md). Every level does the same.
//
// Every (row of x, weight row) pair runs the same operations in the same order whatever the
// tile, the batch or the thread count, so a row's result does not depend on the rows it is
// batched with (the engine's batch invariance).

#include "qmv8.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "pool.h"
#include "x86.h"

namespace mlxkit {

namespace {

// Activations share one scale per block of this many elements.
constexpr int kBlock = 32;
// Rows of `x` one pass carries, and weight rows per band when there are more.
constexpr int kBlockRows = 8;
constexpr int kBandRows = 128;

// Rows of `x` quantized: `q` holds `rows × in` integers (for 4-bit weights each block's
// evens then its odds, the order the kernel unpacks nibbles in), `scale` one f32 per block,
// `sums` the exact f32 sum of `x` over each weight group.
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<float> sums;
};

QuantizedRows quantize_rows(const float* x, int rows, int in, int group, bool nibble_order) {
  const int blocks = in / kBlock;
  const int groups = in / group;
  QuantizedRows out;
  out.q.resize(static_cast<size_t>(rows) * in);
  out.scale.resize(static_cast<size_t>(rows) * blocks);
  out.sums.resize(static_cast<size_t>(rows) * groups);
  for (int m = 0; m < rows; ++m) {
    const float* xm = x + static_cast<size_t>(m) * in;
    for (int g = 0; g < groups; ++g) {
      float sum = 0.0f;
      for (int k = g * group; k < (g + 1) * group; ++k) {
        sum += xm[k];
      }
      out.sums[static_cast<size_t>(m) * groups + g] = sum;
    }
    for (int b = 0; b < blocks; ++b) {
      const float* xb = xm + b * kBlock;
      float most = 0.0f;
      for (int k = 0; k < kBlock; ++k) {
        most = std::max(most, std::fabs(xb[k]));
      }
      // A block of zeros gets scale 0 and zero integers. A NaN gets integer 0 (converting it
      // would be undefined) and shows through the exact sums of the bias term instead.
      const float scale = most > 0.0f ? most / 127.0f : 0.0f;
      const float inverse = most > 0.0f ? 127.0f / most : 0.0f;
      out.scale[static_cast<size_t>(m) * blocks + b] = scale;
      int8_t* qb = out.q.data() + static_cast<size_t>(m) * in + b * kBlock;
      for (int k = 0; k < kBlock; ++k) {
        const float v = std::nearbyint(xb[k] * inverse);
        const int8_t q = std::isnan(v) ? 0 : static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
        const int at = nibble_order ? (k % 2) * (kBlock / 2) + k / 2 : k;
        qb[at] = q;
      }
    }
  }
  return out;
}

// The centre 8-bit weights are multiplied from (see the top of the file).
constexpr int kCentre8 = 128;

// Reference kernel for any machine: rows `[n0, n1)` of `y` for every row of `x`. Integer dot
// products per half block of 16 (the smallest group).
void matvec_portable(const QuantizedRows& xq, int rows, int in, const uint8_t* w,
                     const float* scales, const float* biases, int group, int bits, int n0,
                     int n1, int out, float* y) {
  const int blocks = in / kBlock;
  const int groups = in / group;
  const size_t row_bytes = static_cast<size_t>(in) * bits / 8;
  const uint32_t mask = (1u << bits) - 1u;
  const int centre = bits == 8 ? kCentre8 : 0;
  for (int n = n0; n < n1; ++n) {
    const uint8_t* wr = w + n * row_bytes;
    for (int m = 0; m < rows; ++m) {
      const int8_t* qm = xq.q.data() + static_cast<size_t>(m) * in;
      float total = 0.0f;
      for (int b = 0; b < blocks; ++b) {
        const float dx = xq.scale[static_cast<size_t>(m) * blocks + b];
        for (int half = 0; half < 2; ++half) {
          int32_t dot = 0;
          for (int i = 0; i < kBlock / 2; ++i) {
            const int k = b * kBlock + half * (kBlock / 2) + i;
            const size_t bit = static_cast<size_t>(k) * bits;
            const int32_t q = static_cast<int32_t>((wr[bit / 8] >> (bit % 8)) & mask) - centre;
            const int within = k - b * kBlock;
            const int at = bits == 4 ? (within % 2) * (kBlock / 2) + within / 2 : within;
            dot += q * qm[b * kBlock + at];
          }
          const size_t g = static_cast<size_t>(n) * groups + (b * kBlock + half * 16) / group;
          total += static_cast<float>(dot) * (scales[g] * dx);
        }
      }
      for (int g = 0; g < groups; ++g) {
        const size_t at = static_cast<size_t>(n) * groups + g;
        total += (biases[at] + centre * scales[at]) * xq.sums[static_cast<size_t>(m) * groups + g];
      }
      y[static_cast<size_t>(m) * out + n] = total;
    }
  }
}

#if defined(__x86_64__)

// One block of 32 weights of one row as 32 unsigned bytes, and (8-bit weights) the offset
// weights whose signs the activations take: for 4 bits the 16 bytes of elements k..k+31, low
// nibbles (the evens) in the lower half, high nibbles (the odds) in the upper.
template <int Bits>
MLXKIT_AVX2 inline void unpack_block(const uint8_t* row, int k, __m256i& magnitude,
                                     __m256i& signs) {
  if constexpr (Bits == 4) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2));
    const __m128i nibble = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(bytes, nibble);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
    magnitude = _mm256_set_m128i(hi, lo);
    signs = magnitude;
  } else {
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k));
    signs = _mm256_xor_si256(bytes, _mm256_set1_epi8(static_cast<char>(0x80)));
    magnitude = _mm256_abs_epi8(signs);
  }
}

// The eight 32-bit partial sums of one block's products, as floats.
template <int Bits>
MLXKIT_AVX2 inline __m256 block_dot(__m256i magnitude, __m256i signs, __m256i x) {
  const __m256i xs = Bits == 4 ? x : _mm256_sign_epi8(x, signs);
  const __m256i pairs = _mm256_maddubs_epi16(magnitude, xs);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

// `M` rows of x against weight rows `[n, n + N)`. The lower four lanes of a block's sums come
// from its first 16 elements (8-bit) or its evens (4-bit); with `Halves` (8-bit groups of 16)
// the two halves of a block take the scales of their own groups, otherwise a block lies in one
// group and `per_group` blocks share its scale.
template <int Bits, bool Halves, int M, int N>
MLXKIT_AVX2 inline __attribute__((always_inline)) void tile(const QuantizedRows& xq, int in,
                                                            const uint8_t* w,
                                                            const float* scales,
                                                            const float* biases, int group,
                                                            int n, int out, float* y,
                                                            int m0) {
  const int blocks = in / kBlock;
  const int groups = in / group;
  const int per_group = Halves ? 1 : group / kBlock;
  const size_t row_bytes = static_cast<size_t>(in) * Bits / 8;
  __m256 acc[M][N];
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) {
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) {
      acc[m][j] = _mm256_setzero_ps();
    }
  }
  // Blocks walk the groups with a counter: a division per block (the group size is known only
  // at run time) would cost more than the block's arithmetic.
  int g = 0;
  int left = per_group;
  for (int b = 0; b < blocks; ++b) {
    const int k = b * kBlock;
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) {
      const float* s = scales + static_cast<size_t>(n + j) * groups;
      const __m256 scale = Halves ? _mm256_setr_m128(_mm_set1_ps(s[2 * b]), _mm_set1_ps(s[2 * b + 1]))
                                  : _mm256_broadcast_ss(s + g);
      __m256i magnitude, signs;
      unpack_block<Bits>(w + static_cast<size_t>(n + j) * row_bytes, k, magnitude, signs);
      // The rows' integers and scales are read where they are used (from L1): held in
      // registers across the tile, eight rows' would spill AVX2's sixteen.
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) {
        const size_t row = static_cast<size_t>(m0 + m);
        const __m256i x =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.q.data() + row * in + k));
        const __m256 dx = _mm256_broadcast_ss(xq.scale.data() + row * blocks + b);
        acc[m][j] = _mm256_fmadd_ps(block_dot<Bits>(magnitude, signs, x),
                                    _mm256_mul_ps(scale, dx), acc[m][j]);
      }
    }
    if (--left == 0) {
      ++g;
      left = per_group;
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) {
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) {
      const float* sum = xq.sums.data() + static_cast<size_t>(m0 + m) * groups;
      const float* s = scales + static_cast<size_t>(n + j) * groups;
      const float* bias = biases + static_cast<size_t>(n + j) * groups;
      // 8-bit weights come back from their centre through the bias.
      const float centre = Bits == 8 ? kCentre8 : 0;
      float bias_total = 0.0f;
      for (int gi = 0; gi < groups; ++gi) {
        bias_total += (bias[gi] + centre * s[gi]) * sum[gi];
      }
      y[static_cast<size_t>(m0 + m) * out + n + j] = horizontal_sum(acc[m][j]) + bias_total;
    }
  }
}

// `M` rows of x (from row `m0` on) against weight rows `[n0, n1)`, `N` weight rows at a time:
// wide tiles for one row, where unpacking is the cost, narrow ones for many.
template <int Bits, bool Halves, int M>
MLXKIT_AVX2 void matvec_avx2(const QuantizedRows& xq, int in, const uint8_t* w,
                             const float* scales, const float* biases, int group, int n0,
                             int n1, int out, float* y, int m0) {
  constexpr int N = M == 1 ? 4 : M <= 4 ? 2 : 1;
  const size_t row_bytes = static_cast<size_t>(in) * Bits / 8;
  int n = n0;
  for (; n + N <= n1; n += N) {
    if (n + 3 * N <= n1) {
      const char* ahead =
          reinterpret_cast<const char*>(w + static_cast<size_t>(n + 2 * N) * row_bytes);
      for (size_t offset = 0; offset < N * row_bytes; offset += 64) {
        _mm_prefetch(ahead + offset, _MM_HINT_T0);
      }
    }
    tile<Bits, Halves, M, N>(xq, in, w, scales, biases, group, n, out, y, m0);
  }
  for (; n < n1; ++n) {
    tile<Bits, Halves, M, 1>(xq, in, w, scales, biases, group, n, out, y, m0);
  }
}

#endif  // __x86_64__

}  // namespace

bool int8_matvec_supports(int in, int group, int bits) {
  if (in % kBlock != 0) {
    return false;
  }
  // A 4-bit block holds its evens and odds apart, so it must lie inside one group.
  return bits == 4 ? group % kBlock == 0 : bits == 8 && group % 16 == 0;
}

void int8_matvec(const float* x, int rows, int in, const uint8_t* w, const float* scales,
                 const float* biases, int group, int bits, int out, float* y) {
  const QuantizedRows xq = quantize_rows(x, rows, in, group, bits == 4);
#if defined(__x86_64__)
  if (has_avx2()) {
    using Kernel = void (*)(const QuantizedRows&, int, const uint8_t*, const float*,
                            const float*, int, int, int, int, float*, int);
    static constexpr Kernel kernels[3][kBlockRows] = {
        {matvec_avx2<4, false, 1>, matvec_avx2<4, false, 2>, matvec_avx2<4, false, 3>,
         matvec_avx2<4, false, 4>, matvec_avx2<4, false, 5>, matvec_avx2<4, false, 6>,
         matvec_avx2<4, false, 7>, matvec_avx2<4, false, 8>},
        {matvec_avx2<8, false, 1>, matvec_avx2<8, false, 2>, matvec_avx2<8, false, 3>,
         matvec_avx2<8, false, 4>, matvec_avx2<8, false, 5>, matvec_avx2<8, false, 6>,
         matvec_avx2<8, false, 7>, matvec_avx2<8, false, 8>},
        {matvec_avx2<8, true, 1>, matvec_avx2<8, true, 2>, matvec_avx2<8, true, 3>,
         matvec_avx2<8, true, 4>, matvec_avx2<8, true, 5>, matvec_avx2<8, true, 6>,
         matvec_avx2<8, true, 7>, matvec_avx2<8, true, 8>},
    };
    const Kernel* by_rows = kernels[bits == 4 ? 0 : group == 16 ? 2 : 1];
    const int band = rows <= kBlockRows ? out : kBandRows;
    split_rows(rows, in, out, [&](int p0, int p1) {
      for (int n0 = p0; n0 < p1; n0 += band) {
        const int n1 = std::min(p1, n0 + band);
        for (int m0 = 0; m0 < rows; m0 += kBlockRows) {
          const int m = std::min(kBlockRows, rows - m0);
          by_rows[m - 1](xq, in, w, scales, biases, group, n0, n1, out, y, m0);
        }
      }
    });
    return;
  }
#endif
  split_rows(rows, in, out, [&](int n0, int n1) {
    matvec_portable(xq, rows, in, w, scales, biases, group, bits, n0, n1, out, y);
  });
}

}  // namespace mlxkit
