// A CPU matrix-vector product over MLX's packed affine weights, for decode steps.
//
// MLX's CPU `quantized_matmul` is a generic scalar loop: on a 3072x576 4-bit matrix it took
// about three times as long as an f32 `sgemv` over the dequantized matrix (issue 11), so small
// models were dequantized at load and read 4 bytes per weight every token. This kernel reads
// the packed weights (4 or 8 bits, plus one f32 scale and bias per group) and accumulates in
// f32, so a decode step reads 5-8x fewer bytes for the same values.
//
// Products with any number of rows of `x` take this path: MLX's kernel took 17 ms for 17 rows
// of a 1536x576 4-bit matrix where this one takes 0.6, and 576 ms against 18 for 17 rows of
// an 8-bit 49152x576 head. Past `kMaxRows` rows a dense f32 copy through BLAS is faster still,
// so a layer that keeps one uses it there (`packed_matvec_max_rows`). The AVX2 kernel holds up
// to `kBlockRows` rows of `x` in a pass, in tiles of rows × weight rows with eight
// accumulators; more rows run in blocks over the same band of weight rows, which is still in
// cache for the next block.
//
// Layout (MLX affine): row n of `w` is a little-endian bit stream of `in` unsigned integers of
// `bits` bits; element k of group g of row n is `scales[n, g] * q + biases[n, g]`.
//
// Each weight is dequantized with one FMA (`q * scale + bias`) and then meets every row of `x`:
// the bias costs nothing in the loop. (Summing `bias * Σx` per group after the loop instead
// was a scalar chain per (row, weight row) pair, about a quarter of an 8-row product's time.)

#include "qmv.h"
#include "primitives.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

#include "inputs.h"
#include "pool.h"
#include "qmv8.h"
#include "x86.h"

namespace mlxkit {

namespace mx = mlx::core;

namespace {

// The most rows for which this kernel beats a dense f32 copy of the matrix through BLAS.
constexpr int kMaxRows = 16;

// Rows of `x` one pass of the AVX2 kernel carries, and weight rows per band: a band of a
// 576-wide 4-bit matrix is ~37 KB, which stays in L2 while every block of rows reads it.
constexpr int kBlockRows = 8;
constexpr int kBandRows = 128;
// Rows of `x` one pass of the AVX-512 kernel over 4-bit weights carries (see `matvec_avx512`).
constexpr int kBlockRows512x4 = 4;

// Reference kernel for any machine: rows `[n0, n1)` of `y = x wᵀ` for `rows` rows of `x`.
void matvec_portable(const float* x, int rows, int in, const uint8_t* w, const float* scales,
                     const float* biases, int group, int bits, int n0, int n1, int out,
                     float* y) {
  const int groups = in / group;
  const size_t row_bytes = static_cast<size_t>(in) * bits / 8;
  const uint32_t mask = (1u << bits) - 1u;
  for (int n = n0; n < n1; ++n) {
    const uint8_t* wr = w + n * row_bytes;
    for (int m = 0; m < rows; ++m) {
      const float* xm = x + static_cast<size_t>(m) * in;
      float total = 0.0f;
      for (int g = 0; g < groups; ++g) {
        const float scale = scales[n * groups + g];
        const float bias = biases[n * groups + g];
        for (int k = g * group; k < (g + 1) * group; ++k) {
          const size_t bit = static_cast<size_t>(k) * bits;
          const uint32_t q = (wr[bit / 8] >> (bit % 8)) & mask;
          total += std::fma(static_cast<float>(q), scale, bias) * xm[k];
        }
      }
      y[static_cast<size_t>(m) * out + n] = total;
    }
  }
}

#if defined(__x86_64__)

MLXKIT_AVX2 inline void prefetch(const void* start, size_t bytes) {
  const char* p = static_cast<const char*>(start);
  for (size_t offset = 0; offset < bytes; offset += 64) {
    _mm_prefetch(p + offset, _MM_HINT_T0);
  }
}

// Eight packed bytes as eight f32 values (8-bit weights).
MLXKIT_AVX2 inline __m256 bytes_to_floats(const uint8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Dequantizes 16 consecutive weights of one row from `k` on with the group's scale and bias. For 4
// bits the 8 bytes hold elements k..k+15, low nibbles the even ones, high nibbles the odd ones,
// so `lo` gets the evens and `hi` the odds (`x` is given in that order, see `nibble_order`).
template <int Bits>
MLXKIT_AVX2 inline void dequantize16(const uint8_t* row, int k, __m256 scale, __m256 bias,
                                     __m256& lo, __m256& hi) {
  if constexpr (Bits == 4) {
    const __m256i v =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k / 2)));
    lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xF)));
    hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
  } else {
    lo = bytes_to_floats(row + k);
    hi = bytes_to_floats(row + k + 8);
  }
  lo = _mm256_fmadd_ps(lo, scale, bias);
  hi = _mm256_fmadd_ps(hi, scale, bias);
}

// `M` rows of x against weight rows `[n, n + N)`: the M×N dot products share every load, and
// their M×N accumulators are independent FMA chains, so the loop is not bound by FMA latency.
// Every (row, weight row) pair runs the same operations in the same order whatever M and N
// are, so a row's result does not depend on the rows it is batched with. The unroll pragmas
// matter: without them GCC keeps the accumulator arrays on the stack.
template <int Bits, int M, int N>
MLXKIT_AVX2 inline __attribute__((always_inline)) void tile(const float* x, int in,
                                                            const uint8_t* w, const float* scales,
                                                            const float* biases, int group,
                                                            int n, int out, float* y) {
  const int groups = in / group;
  const size_t row_bytes = static_cast<size_t>(in) * Bits / 8;
  __m256 acc[M][N];
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) {
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) {
      acc[m][j] = _mm256_setzero_ps();
    }
  }
  for (int g = 0; g < groups; ++g) {
    __m256 scale[N], bias[N];
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) {
      scale[j] = _mm256_set1_ps(scales[static_cast<size_t>(n + j) * groups + g]);
      bias[j] = _mm256_set1_ps(biases[static_cast<size_t>(n + j) * groups + g]);
    }
    for (int k = g * group; k < (g + 1) * group; k += 16) {
      if constexpr (M <= 2) {
        // Wide tiles: each weight row meets the few rows of x as soon as it is unpacked, so
        // the registers hold one unpacked row at a time.
#pragma GCC unroll 16
        for (int j = 0; j < N; ++j) {
          __m256 lo, hi;
          dequantize16<Bits>(w + static_cast<size_t>(n + j) * row_bytes, k, scale[j], bias[j], lo, hi);
#pragma GCC unroll 16
          for (int m = 0; m < M; ++m) {
            const float* xm = x + static_cast<size_t>(m) * in + k;
            acc[m][j] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xm), acc[m][j]);
            acc[m][j] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xm + 8), acc[m][j]);
          }
        }
      } else {
        // Narrow tiles over many rows: every weight row of the tile is unpacked first, then
        // each row of x is loaded once for all of them.
        __m256 lo[N], hi[N];
#pragma GCC unroll 16
        for (int j = 0; j < N; ++j) {
          dequantize16<Bits>(w + static_cast<size_t>(n + j) * row_bytes, k, scale[j], bias[j], lo[j],
                     hi[j]);
        }
#pragma GCC unroll 16
        for (int m = 0; m < M; ++m) {
          const float* xm = x + static_cast<size_t>(m) * in + k;
          const __m256 x_lo = _mm256_loadu_ps(xm);
          const __m256 x_hi = _mm256_loadu_ps(xm + 8);
#pragma GCC unroll 16
          for (int j = 0; j < N; ++j) {
            acc[m][j] = _mm256_fmadd_ps(lo[j], x_lo, acc[m][j]);
            acc[m][j] = _mm256_fmadd_ps(hi[j], x_hi, acc[m][j]);
          }
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) {
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) {
      y[static_cast<size_t>(m) * out + n + j] = horizontal_sum(acc[m][j]);
    }
  }
}

// `M` rows of x against weight rows `[n0, n1)`, `N` weight rows at a time: wide tiles for few
// rows of x, where the dequantization is the cost, and narrow ones for many, where the FMAs
// are (eight accumulators either way).
template <int Bits, int M>
MLXKIT_AVX2 void matvec_avx2(const float* x, int in, const uint8_t* w, const float* scales,
                             const float* biases, int group, int n0, int n1, int out, float* y) {
  constexpr int N = M == 1 ? 8 : M == 2 ? 4 : M <= 4 ? 2 : 1;
  const size_t row_bytes = static_cast<size_t>(in) * Bits / 8;
  int n = n0;
  for (; n + N <= n1; n += N) {
    // Two tiles ahead: the hardware prefetcher alone left the loop waiting on its loads.
    if (n + 3 * N <= n1) {
      prefetch(w + static_cast<size_t>(n + 2 * N) * row_bytes, N * row_bytes);
    }
    tile<Bits, M, N>(x, in, w, scales, biases, group, n, out, y);
  }
  for (; n < n1; ++n) {
    tile<Bits, M, 1>(x, in, w, scales, biases, group, n, out, y);
  }
}


// The AVX-512 kernels: the same tiles over 32 weights at a time, in sixteen-lane registers.
// They need groups of a multiple of 32 elements.

// What dequantizing one weight row's group takes in sixteen-lane registers. For 8 bits, its
// scale and bias. For 4 bits, the sixteen values its integers stand for, `q * scale + bias`
// for q = 0..15 (one FMA each, the same as dequantizing every weight), so that a weight is one
// `vpermps` lookup rather than a conversion and an FMA: one thread, 576x1536, 1 row 47.6 ->
// 40.3 us, 4 rows 88 -> 72 us (a scratch copy of these tiles). The values are the same.
template <int Bits>
struct Group512;

template <>
struct Group512<4> {
  __m512 values;
};

template <>
struct Group512<8> {
  __m512 scale;
  __m512 bias;
};

template <int Bits>
MLXKIT_AVX512 inline Group512<Bits> group512(float scale, float bias) {
  if constexpr (Bits == 4) {
    const __m512 q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return {_mm512_fmadd_ps(q, _mm512_set1_ps(scale), _mm512_set1_ps(bias))};
  } else {
    return {_mm512_set1_ps(scale), _mm512_set1_ps(bias)};
  }
}

// Dequantizes 32 consecutive weights of one row from `k` on in its group `g`. For 4 bits the
// 16 bytes hold elements k..k+31: `lo` gets the even ones, `hi` the odd ones (`x` in that
// order, see `nibble_order`); `vpermps` reads only an index's low four bits, so the low
// nibbles need no mask. For 8 bits `lo` gets k..k+15 and `hi` k+16..k+31.
template <int Bits>
MLXKIT_AVX512 inline void dequantize32(const uint8_t* row, int k, const Group512<Bits>& g,
                                       __m512& lo, __m512& hi) {
  if constexpr (Bits == 4) {
    const __m512i v = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2)));
    lo = _mm512_permutexvar_ps(v, g.values);
    hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), g.values);
  } else {
    lo = _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k))));
    hi = _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k + 16))));
    lo = _mm512_fmadd_ps(lo, g.scale, g.bias);
    hi = _mm512_fmadd_ps(hi, g.scale, g.bias);
  }
}

// As `tile`, sixteen lanes wide. Every (row, weight row) pair runs the same operations in the
// same order whatever M and N are. It is a copy rather than one template over both widths
// because GCC's per-function target attributes cannot depend on a template parameter.
template <int Bits, int M, int N>
MLXKIT_AVX512 inline __attribute__((always_inline)) void tile512(
    const float* x, int in, const uint8_t* w, const float* scales, const float* biases,
    int group, int n, int out, float* y) {
  const int groups = in / group;
  const size_t row_bytes = static_cast<size_t>(in) * Bits / 8;
  __m512 acc[M][N];
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) {
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) {
      acc[m][j] = _mm512_setzero_ps();
    }
  }
  for (int g = 0; g < groups; ++g) {
    Group512<Bits> of[N];
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) {
      const size_t at = static_cast<size_t>(n + j) * groups + g;
      of[j] = group512<Bits>(scales[at], biases[at]);
    }
    for (int k = g * group; k < (g + 1) * group; k += 32) {
      if constexpr (M <= 2) {
        // Wide tiles: each weight row meets the few rows of x as soon as it is unpacked, so
        // the registers hold one unpacked row at a time.
#pragma GCC unroll 16
        for (int j = 0; j < N; ++j) {
          __m512 lo, hi;
          dequantize32<Bits>(w + static_cast<size_t>(n + j) * row_bytes, k, of[j], lo, hi);
#pragma GCC unroll 16
          for (int m = 0; m < M; ++m) {
            const float* xm = x + static_cast<size_t>(m) * in + k;
            acc[m][j] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xm), acc[m][j]);
            acc[m][j] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xm + 16), acc[m][j]);
          }
        }
      } else {
        // Narrow tiles over many rows: every weight row of the tile is unpacked first, then
        // each row of x is loaded once for all of them.
        __m512 lo[N], hi[N];
#pragma GCC unroll 16
        for (int j = 0; j < N; ++j) {
          dequantize32<Bits>(w + static_cast<size_t>(n + j) * row_bytes, k, of[j], lo[j], hi[j]);
        }
#pragma GCC unroll 16
        for (int m = 0; m < M; ++m) {
          const float* xm = x + static_cast<size_t>(m) * in + k;
          const __m512 x_lo = _mm512_loadu_ps(xm);
          const __m512 x_hi = _mm512_loadu_ps(xm + 16);
#pragma GCC unroll 16
          for (int j = 0; j < N; ++j) {
            acc[m][j] = _mm512_fmadd_ps(lo[j], x_lo, acc[m][j]);
            acc[m][j] = _mm512_fmadd_ps(hi[j], x_hi, acc[m][j]);
          }
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) {
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) {
      y[static_cast<size_t>(m) * out + n + j] = horizontal_sum(acc[m][j]);
    }
  }
}

// As `matvec_avx2`; with 32 registers, tiles can be twice as wide for many rows of x. 4-bit
// weights, whose lookups are cheap, run four weight rows at a time against at most
// `kBlockRows512x4` rows of x (measured on the scratch copy: 4 rows by 4 took 67 us where
// 8 rows by 2 took 150, so two passes of 4 rows beat one of 8).
template <int Bits, int M>
MLXKIT_AVX512 void matvec_avx512(const float* x, int in, const uint8_t* w, const float* scales,
                                 const float* biases, int group, int n0, int n1, int out,
                                 float* y) {
  constexpr int N = Bits == 4 ? 4 : M == 1 ? 8 : M <= 4 ? 4 : 2;
  const size_t row_bytes = static_cast<size_t>(in) * Bits / 8;
  int n = n0;
  for (; n + N <= n1; n += N) {
    if (n + 3 * N <= n1) {
      prefetch(w + static_cast<size_t>(n + 2 * N) * row_bytes, N * row_bytes);
    }
    tile512<Bits, M, N>(x, in, w, scales, biases, group, n, out, y);
  }
  for (; n < n1; ++n) {
    tile512<Bits, M, 1>(x, in, w, scales, biases, group, n, out, y);
  }
}


#endif  // __x86_64__

// `len` floats starting on a cache-line boundary. The kernels read `x` in 32- and 64-byte
// vectors; a vector that straddles two lines costs two loads, and from a buffer only 16-byte
// aligned (malloc's promise) most of them did: the 8-row AVX-512 product took 226 µs against
// 167 µs from an aligned copy of the same rows. Rows stay aligned because `in` is a multiple
// of 16 (see `packed_matvec_supports`).
class AlignedFloats {
 public:
  explicit AlignedFloats(size_t len) : storage_(len + kLineFloats) {
    const auto address = reinterpret_cast<uintptr_t>(storage_.data());
    const uintptr_t line = kLineFloats * sizeof(float);
    data_ = reinterpret_cast<float*>((address + line - 1) / line * line);
  }
  float* data() {
    return data_;
  }

 private:
  static constexpr size_t kLineFloats = 16;
  std::vector<float> storage_;
  float* data_;
};

// Reorders each `chunk`-element piece of `x` as its even then its odd elements, the order in
// which the 4-bit kernels unpack `chunk / 2` bytes.
void nibble_order(const float* x, size_t len, size_t chunk, float* out) {
  const size_t half = chunk / 2;
  for (size_t c = 0; c < len; c += chunk) {
    for (size_t i = 0; i < half; ++i) {
      out[c + i] = x[c + 2 * i];
      out[c + half + i] = x[c + 2 * i + 1];
    }
  }
}

void matvec(const float* x, int rows, int in, const uint8_t* w, const float* scales,
            const float* biases, int group, int bits, int out, float* y) {
#if defined(__x86_64__)
  const int level = kernel_level();
  const bool wide = level >= kAvx512 && group % 32 == 0;
  if (level >= kAvx2 && (bits == 4 || bits == 8)) {
    const size_t len = static_cast<size_t>(rows) * in;
    AlignedFloats aligned(len);
    if (bits == 4) {
      nibble_order(x, len, wide ? 32 : 16, aligned.data());
    } else {
      std::memcpy(aligned.data(), x, len * sizeof(float));
    }
    const float* xs = aligned.data();
    using Kernel = void (*)(const float*, int, const uint8_t*, const float*, const float*, int,
                            int, int, int, float*);
    static constexpr Kernel avx2[2][kBlockRows] = {
        {matvec_avx2<4, 1>, matvec_avx2<4, 2>, matvec_avx2<4, 3>, matvec_avx2<4, 4>,
         matvec_avx2<4, 5>, matvec_avx2<4, 6>, matvec_avx2<4, 7>, matvec_avx2<4, 8>},
        {matvec_avx2<8, 1>, matvec_avx2<8, 2>, matvec_avx2<8, 3>, matvec_avx2<8, 4>,
         matvec_avx2<8, 5>, matvec_avx2<8, 6>, matvec_avx2<8, 7>, matvec_avx2<8, 8>},
    };
    static constexpr Kernel avx512[2][kBlockRows] = {
        {matvec_avx512<4, 1>, matvec_avx512<4, 2>, matvec_avx512<4, 3>, matvec_avx512<4, 4>,
         matvec_avx512<4, 5>, matvec_avx512<4, 6>, matvec_avx512<4, 7>, matvec_avx512<4, 8>},
        {matvec_avx512<8, 1>, matvec_avx512<8, 2>, matvec_avx512<8, 3>, matvec_avx512<8, 4>,
         matvec_avx512<8, 5>, matvec_avx512<8, 6>, matvec_avx512<8, 7>, matvec_avx512<8, 8>},
    };
    // The instruction set is chosen per call, never per row count: a row sums the same way
    // alone and in a batch.
    const Kernel* by_rows = (wide ? avx512 : avx2)[bits == 8 ? 1 : 0];
    const int block = wide && bits == 4 ? kBlockRows512x4 : kBlockRows;
    // Each row's sums run in the same order whatever block or part it is in, so a row's
    // result depends neither on how many rows share the product nor on the thread count.
    const int band = rows <= block ? out : kBandRows;
    split_rows(rows, in, out, [&](int p0, int p1) {
      for (int n0 = p0; n0 < p1; n0 += band) {
        const int n1 = std::min(p1, n0 + band);
        for (int m0 = 0; m0 < rows; m0 += block) {
          const int m = std::min(block, rows - m0);
          by_rows[m - 1](xs + static_cast<size_t>(m0) * in, in, w, scales, biases, group, n0,
                         n1, out, y + static_cast<size_t>(m0) * out);
        }
      }
    });
    return;
  }
#endif
  split_rows(rows, in, out, [&](int n0, int n1) {
    matvec_portable(x, rows, in, w, scales, biases, group, bits, n0, n1, out, y);
  });
}

class PackedMatvec : public mx::UnaryPrimitive {
 public:
  PackedMatvec(mx::Stream stream, int group, int bits, bool int8)
      : mx::UnaryPrimitive(stream), group_(group), bits_(bits), int8_(int8) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& y) override {
    auto& encoder = mx::cpu::get_command_encoder(stream());
    const auto x = ensure_row_contiguous(inputs[0], encoder);
    const auto w = ensure_row_contiguous(inputs[1], encoder);
    const auto scales = ensure_row_contiguous(inputs[2], encoder);
    const auto biases = ensure_row_contiguous(inputs[3], encoder);
    y.set_data(mx::allocator::malloc(y.nbytes()));

    const int in = x.shape(-1);
    const int rows = static_cast<int>(x.size() / in);
    const int out = y.shape(-1);
    encoder.set_input_array(x);
    encoder.set_input_array(w);
    encoder.set_input_array(scales);
    encoder.set_input_array(biases);
    encoder.set_output_array(y);
    encoder.dispatch([x = mx::array::unsafe_weak_copy(x), w = mx::array::unsafe_weak_copy(w),
                      scales = mx::array::unsafe_weak_copy(scales),
                      biases = mx::array::unsafe_weak_copy(biases),
                      y = mx::array::unsafe_weak_copy(y), in, rows, out, group = group_,
                      bits = bits_, int8 = int8_]() mutable {
      (int8 ? int8_matvec : matvec)(x.data<float>(), rows, in, w.data<uint8_t>(),
                                    scales.data<float>(), biases.data<float>(), group, bits, out,
                                    y.data<float>());
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("packed matvec runs on the CPU only");
  }

  const char* name() const override {
    return "PackedMatvec";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const PackedMatvec*>(&other);
    return o != nullptr && group_ == o->group_ && bits_ == o->bits_ && int8_ == o->int8_;
  }

 private:
  int group_;
  int bits_;
  // Activations quantized to 8 bits (qmv8.cc) rather than kept in f32.
  bool int8_;
};

std::atomic<int>& activations_setting() {
  static std::atomic<int> setting([] {
    const char* env = std::getenv("MLXKIT_ACTIVATIONS");
    const bool int8 = env != nullptr && std::strcmp(env, "int8") == 0;
    return static_cast<int>(int8 ? Activations::Int8 : Activations::F32);
  }());
  return setting;
}

}  // namespace

Activations packed_activations() {
  return static_cast<Activations>(activations_setting().load(std::memory_order_relaxed));
}

void set_packed_activations(Activations activations) {
  activations_setting().store(static_cast<int>(activations), std::memory_order_relaxed);
}

int packed_matvec_max_rows() {
  return kMaxRows;
}

bool packed_matvec_supports(int group, int bits) {
  return (bits == 4 || bits == 8) && group >= 16 && group % 16 == 0;
}

std::optional<mx::array> packed_matvec(const mx::array& x, const mx::array& w,
                                       const mx::array& scales,
                                       const std::optional<mx::array>& biases, int group,
                                       int bits, Activations activations) {
  if (!primitive_runs(Primitive::PackedMatvec) || !packed_matvec_supports(group, bits) ||
      !biases || x.ndim() < 1 || w.ndim() != 2 || w.dtype() != mx::uint32 ||
      x.dtype() != mx::float32 || scales.dtype() != mx::float32 ||
      biases->dtype() != mx::float32) {
    return std::nullopt;
  }
  const int in = x.shape(-1);
  const int out = w.shape(0);
  if (in == 0 || in % group != 0 || w.shape(1) * 32 != in * bits ||
      scales.shape() != mx::Shape{out, in / group} || biases->shape() != scales.shape()) {
    return std::nullopt;
  }
  const size_t rows = x.size() / in;
  if (rows == 0 || rows > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return std::nullopt;
  }
  // The setting is read here, when the graph is built, so an op keeps the precision it was
  // made with.
  const bool int8 = activations == Activations::Int8 && int8_matvec_supports(in, group, bits);
  auto shape = x.shape();
  shape.back() = out;
  const auto stream = mx::default_stream(mx::Device::cpu);
  return mx::array(std::move(shape), mx::float32,
                   std::make_shared<PackedMatvec>(stream, group, bits, int8),
                   {x, w, scales, *biases});
}

}  // namespace mlxkit
