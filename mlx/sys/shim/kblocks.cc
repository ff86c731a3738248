// GGUF k-quant matrices (Q4_K, Q6_K) in a CPU layout of their own, and their products.
//
// Loaded into MLX's affine layout, a k-quant matrix carries an f32 scale and bias per group:
// 6 bits per Q4_K weight where its GGUF blocks take 4.5, and 12 per Q6_K weight (widened to
// bytes, in groups of 16) where they take 6.56. Its weights, scales and biases are also three
// arrays read in step, so a tile of eight weight rows streams from 24 places at once. Llama
// 3.2 1B in Q4_K_M read 1.23 GB per token that way where llama.cpp reads 0.80 (issue 51).
//
// Here a matrix is kept in bands of 8 weight rows. A band holds, super-block after super-block
// (256 columns), everything its 8 rows need for those columns in one run of bytes:
//
//   Q4_K (1,184 bytes, 4.63 bits per weight): d[8] and dmin[8] (f16, one per row), then the
//   6-bit scales and mins unpacked to bytes as sc[group][row] and m[group][row] (8 groups of
//   32), then each row's 128 bytes of nibbles as GGUF stores them (bytes 32c..32c+31 hold
//   elements 64c.. in their low nibbles and 64c+32.. in their high ones).
//
//   Q6_K (2,192 bytes, 8.56 bits per weight): d[8] (f16), the signed scales sc[group][row]
//   (16 groups of 16), then each row's 256 values `q - 32` as signed bytes, in column order.
//   (Offsets in kblocks_layout.h.) Q6_K's 6-bit values are widened to bytes: unpacking its split 4 + 2 bits costs about as
//   much arithmetic again as the product, which a decode step cannot spare on two cores.
//
// Values: a group's scale is `d · sc` and (Q4_K) its bias `−dmin · m`, computed in f32 as the
// GGUF loader computes them for MLX's layout, and a Q4_K weight is `fma(q, scale, bias)`, as
// the packed kernel dequantizes (qmv.cc). A Q6_K weight is `(q − 32) · scale`, one rounding of
// the same real number the affine form's `fma(q, scale, −32 · scale)` rounds. So every weight
// has the value it has in the affine form; only the order of the f32 sums differs. Every
// (row of x, weight row) pair runs the same operations in the same order whatever the tile,
// the number of rows and the thread count, so a row's result does not depend on its batch.
// With `MLXKIT_ACTIVATIONS=int8` the products round `x` to bytes first (kblocks_int8.cc).
//
// The loader makes the form from a matrix it has in MLX's affine layout, when that matrix's
// scales and biases factor exactly as a k-quant's (`k_blocks_from_affine`): a GGUF read
// directly, and one `mlxkit create` kept "as loaded", alike. It exists only where the packed
// CPU kernels run (x86-64, CPU primitives on): nothing else reads it, so the loader keeps
// MLX's layout on a GPU, on arm64 and on the GPU path run on a CPU.

#include "kblocks.h"

#include <algorithm>
#include <optional>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

#include "half.h"
#include "inputs.h"
#include "kblocks_int8.h"
#include "kblocks_layout.h"
#include "pool.h"
#include "primitives.h"
#include "x86.h"

namespace mlxkit {

namespace mx = mlx::core;

namespace {

using kblock::kBand;
using kblock::kSuper;
using kblock::known;

using kblock::band_block;

// The f16 bits of `v` when `v` is an f16 value exactly.
bool exact_half(float v, uint16_t& bits) {
  uint32_t f;
  std::memcpy(&f, &v, 4);
  const uint16_t sign = static_cast<uint16_t>((f >> 16) & 0x8000u);
  const int exponent = static_cast<int>((f >> 23) & 0xFF) - 127;
  const uint32_t mantissa = f & 0x7FFFFFu;
  if (exponent >= -14 && exponent <= 15) {
    bits = static_cast<uint16_t>(sign | ((exponent + 15) << 10) | (mantissa >> 13));
  } else {
    // Zero or an f16 subnormal: a whole number of 2^-24.
    const float units = std::fabs(v) * 16777216.0f;
    if (units >= 1024.0f || units != std::floor(units)) {
      return false;
    }
    bits = static_cast<uint16_t>(sign | static_cast<uint16_t>(units));
  }
  return widen(Half{bits}) == v;
}

// Whether `scales` factor as `d · sc` with the widest one's `sc` equal to `top`; sets `d_bits`
// and `sc` when they do.
bool factor_by(const float* scales, int count, int lo, int hi, int top, int widest,
               uint16_t& d_bits, int8_t* sc) {
  const float d = scales[widest] / static_cast<float>(top);
  uint16_t bits;
  if (!exact_half(d, bits)) {
    return false;
  }
  for (int g = 0; g < count; ++g) {
    const float q = std::nearbyint(scales[g] / d);
    if (!(q >= lo && q <= hi && d * q == scales[g])) {
      return false;
    }
    sc[g] = static_cast<int8_t>(static_cast<int>(q));
  }
  d_bits = bits;
  return true;
}

// `scales` (eight or sixteen groups of one row's super-block) as `d · sc` with `d` an f16 and
// each `sc` an integer in `[lo, hi]`, every product equal to its scale exactly; false when no
// such `d` exists. A k-quant's products have at most 11 + 8 significant bits, so f32 holds
// them exactly and `scale / sc` recovers `d` exactly: for the `sc` of the largest scale, tried
// from the ends of the range in (a quantizer gives its largest group an end of the range).
bool factor(const float* scales, int count, int lo, int hi, uint16_t& d_bits, int8_t* sc) {
  int widest = 0;
  for (int g = 1; g < count; ++g) {
    if (std::fabs(scales[g]) > std::fabs(scales[widest])) {
      widest = g;
    }
  }
  if (scales[widest] == 0.0f) {
    d_bits = 0;
    std::fill(sc, sc + count, 0);
    return std::all_of(scales, scales + count, [](float s) { return s == 0.0f; });
  }
  // Largest magnitudes first, either sign: Q6_K's quantizer gives its widest group -128.
  for (int magnitude = std::max(-lo, hi); magnitude >= 1; --magnitude) {
    for (const int top : {magnitude, -magnitude}) {
      if (top >= lo && top <= hi && factor_by(scales, count, lo, hi, top, widest, d_bits, sc)) {
        return true;
      }
    }
  }
  return false;
}

using kblock::f16;

// The scales (and Q4_K's biases) of one band super-block, `[group][row]`, as every kernel
// computes them.
void group_maps(int type, const uint8_t* block, float* scale, float* bias) {
  if (type == static_cast<int>(KBlockType::Q4K)) {
    for (int row = 0; row < kBand; ++row) {
      const float d = f16(block + 2 * row);
      const float dmin = f16(block + 16 + 2 * row);
      for (int g = 0; g < 8; ++g) {
        scale[8 * g + row] = d * static_cast<float>(block[32 + 8 * g + row]);
        bias[8 * g + row] = -(dmin * static_cast<float>(block[96 + 8 * g + row]));
      }
    }
  } else {
    for (int row = 0; row < kBand; ++row) {
      const float d = f16(block + 2 * row);
      for (int g = 0; g < 16; ++g) {
        scale[8 * g + row] =
            d * static_cast<float>(static_cast<int8_t>(block[16 + 8 * g + row]));
      }
    }
  }
}

// Row `row` (0..7) of a band, super-block `block`, dequantized into `out[0..256)`.
void dequantize_block(int type, const uint8_t* block, int row, float* out) {
  float scale[16 * kBand];
  float bias[16 * kBand];
  group_maps(type, block, scale, bias);
  if (type == static_cast<int>(KBlockType::Q4K)) {
    const uint8_t* q = block + 160 + 128 * row;
    for (int e = 0; e < kSuper; ++e) {
      const int c = e / 64;
      const bool high = e % 64 >= 32;
      const uint8_t byte = q[32 * c + e % 32];
      const int g = 2 * c + (high ? 1 : 0);
      const float v = static_cast<float>(high ? byte >> 4 : byte & 0xF);
      out[e] = std::fma(v, scale[8 * g + row], bias[8 * g + row]);
    }
  } else {
    const auto* q = reinterpret_cast<const int8_t*>(block + 144 + 256 * row);
    for (int e = 0; e < kSuper; ++e) {
      out[e] = static_cast<float>(q[e]) * scale[8 * (e / 16) + row];
    }
  }
}

// Any machine: weight rows of bands `[b0, b1)` against `rows` rows of `x`, a row at a time.
void matmul_portable(int type, const float* x, int rows, int64_t in, const uint8_t* w,
                     int64_t out, int b0, int b1, float* y) {
  const int64_t supers = in / kSuper;
  const size_t band_bytes = band_block(type) * supers;
  std::vector<float> values(kSuper);
  for (int b = b0; b < b1; ++b) {
    for (int row = 0; row < kBand; ++row) {
      std::vector<float> sums(rows, 0.0f);
      for (int64_t s = 0; s < supers; ++s) {
        dequantize_block(type, w + b * band_bytes + s * band_block(type), row,
                         values.data());
        for (int m = 0; m < rows; ++m) {
          const float* xm = x + m * in + s * kSuper;
          float total = 0.0f;
          for (int e = 0; e < kSuper; ++e) {
            total = std::fma(values[e], xm[e], total);
          }
          sums[m] += total;
        }
      }
      for (int m = 0; m < rows; ++m) {
        y[m * out + b * kBand + row] = sums[m];
      }
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

// Floats the maps of one band super-block take in `band_maps`: Q4_K's scales and biases of
// 8 groups, or Q6_K's scales of 16, for 8 rows.
constexpr int kMapFloats = 16 * kBand;

// The eight rows' scales and biases of one band super-block, `scale[group][row]` and
// `bias[group][row]` in `maps`: the same f32 products and negations as `group_maps`, eight
// rows to a vector.
MLXKIT_AVX2 inline void q4k_maps(const uint8_t* block, float* maps) {
  float* scale = maps;
  float* bias = maps + 8 * kBand;
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
  const __m256 dmin =
      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16)));
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int g = 0; g < 8; ++g) {
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 32 + 8 * g))));
    const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 96 + 8 * g))));
    _mm256_storeu_ps(scale + kBand * g, _mm256_mul_ps(d, sc));
    _mm256_storeu_ps(bias + kBand * g, _mm256_xor_ps(_mm256_mul_ps(dmin, m), sign));
  }
}

MLXKIT_AVX2 inline void q6k_maps(const uint8_t* block, float* scale) {
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
  for (int g = 0; g < 16; ++g) {
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 16 + 8 * g))));
    _mm256_storeu_ps(scale + kBand * g, _mm256_mul_ps(d, sc));
  }
}

// A tile's M×J accumulators, cleared; and their sums written to rows `[n, n + J)` of `y`'s M
// rows. The unroll pragmas keep the accumulators in registers.
template <int M, int J>
MLXKIT_AVX2 inline __attribute__((always_inline)) void zero_sums(__m256 (&acc)[M][J]) {
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) {
#pragma GCC unroll 16
    for (int j = 0; j < J; ++j) {
      acc[m][j] = _mm256_setzero_ps();
    }
  }
}

template <int M, int J>
MLXKIT_AVX2 inline __attribute__((always_inline)) void store_sums(const __m256 (&acc)[M][J],
                                                                  int64_t n, int64_t out,
                                                                  float* y) {
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) {
#pragma GCC unroll 16
    for (int j = 0; j < J; ++j) {
      y[m * out + n + j] = horizontal_sum(acc[m][j]);
    }
  }
}

// `M` rows of `x` against rows `[j0, j0 + J)` of one band: M×J independent FMA chains, each
// weight dequantized once for the M rows. The unroll pragmas keep the accumulators in
// registers.
template <int M, int J>
MLXKIT_AVX2 inline __attribute__((always_inline)) void q4k_tile(const float* x, int64_t in,
                                                                const uint8_t* band,
                                                                const float* maps, int j0,
                                                                int64_t n, int64_t out,
                                                                float* y) {
  const int64_t supers = in / kSuper;
  __m256 acc[M][J];
  zero_sums<M, J>(acc);
  for (int64_t s = 0; s < supers; ++s) {
    const uint8_t* block = band + s * band_block(kblock::kQ4);
    const float* scale = maps + s * kMapFloats;
    const float* bias = scale + 8 * kBand;
    const uint8_t* q = block + 160;
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; l += 8) {
        const int64_t k = s * kSuper + 64 * c + l;
#pragma GCC unroll 16
        for (int j = 0; j < J; ++j) {
          const int row = j0 + j;
          const __m256i v = _mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 128 * row + 32 * c + l)));
          const __m256 lo = _mm256_fmadd_ps(
              _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xF))),
              _mm256_broadcast_ss(&scale[kBand * (2 * c) + row]),
              _mm256_broadcast_ss(&bias[kBand * (2 * c) + row]));
          const __m256 hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)),
                                            _mm256_broadcast_ss(&scale[kBand * (2 * c + 1) + row]),
                                            _mm256_broadcast_ss(&bias[kBand * (2 * c + 1) + row]));
#pragma GCC unroll 16
          for (int m = 0; m < M; ++m) {
            const float* xm = x + m * in + k;
            acc[m][j] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xm), acc[m][j]);
            acc[m][j] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xm + 32), acc[m][j]);
          }
        }
      }
    }
  }
  store_sums<M, J>(acc, n + j0, out, y);
}

template <int M, int J>
MLXKIT_AVX2 inline __attribute__((always_inline)) void q6k_tile(const float* x, int64_t in,
                                                                const uint8_t* band,
                                                                const float* maps, int j0,
                                                                int64_t n, int64_t out,
                                                                float* y) {
  const int64_t supers = in / kSuper;
  __m256 acc[M][J];
  zero_sums<M, J>(acc);
  for (int64_t s = 0; s < supers; ++s) {
    const uint8_t* block = band + s * band_block(kblock::kQ6);
    const float* scale = maps + s * kMapFloats;
    const uint8_t* q = block + 144;
    for (int g = 0; g < 16; ++g) {
      const int64_t k = s * kSuper + 16 * g;
#pragma GCC unroll 16
      for (int j = 0; j < J; ++j) {
        const int row = j0 + j;
        const __m128i bytes =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 256 * row + 16 * g));
        const __m256 sc = _mm256_broadcast_ss(&scale[kBand * g + row]);
        const __m256 lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), sc);
        const __m256 hi = _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8))), sc);
#pragma GCC unroll 16
        for (int m = 0; m < M; ++m) {
          const float* xm = x + m * in + k;
          acc[m][j] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xm), acc[m][j]);
          acc[m][j] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xm + 8), acc[m][j]);
        }
      }
    }
  }
  store_sums<M, J>(acc, n + j0, out, y);
}

// `M` rows of `x` against bands `[b0, b1)`, `J` of each band's rows at a time: all eight for a
// single row (the decode step), fewer as rows grow, so that M×J accumulators stay at eight.
template <int Type, int M>
MLXKIT_AVX2 void matmul_avx2(const float* x, int64_t in, const uint8_t* w, int64_t out, int b0,
                             int b1, float* y) {
  constexpr int J = M == 1 ? 8 : M == 2 ? 4 : M <= 4 ? 2 : 1;
  const int64_t supers = in / kSuper;
  const size_t band_bytes = band_block(Type) * supers;
  // The band's scales (and biases), computed once for all its tiles: per tile, they cost a
  // seventh of a prompt's product, whose tiles take one weight row each.
  std::vector<float> maps(static_cast<size_t>(supers) * kMapFloats);
  for (int b = b0; b < b1; ++b) {
    const uint8_t* band = w + b * band_bytes;
    // Two bands ahead: the hardware prefetcher alone left the loop waiting on its loads.
    if (b + 2 < b1) {
      prefetch(band + 2 * band_bytes, band_bytes);
    }
    for (int64_t s = 0; s < supers; ++s) {
      const uint8_t* block = band + s * band_block(Type);
      if constexpr (Type == static_cast<int>(KBlockType::Q4K)) {
        q4k_maps(block, maps.data() + s * kMapFloats);
      } else {
        q6k_maps(block, maps.data() + s * kMapFloats);
      }
    }
    for (int j0 = 0; j0 < kBand; j0 += J) {
      if constexpr (Type == static_cast<int>(KBlockType::Q4K)) {
        q4k_tile<M, J>(x, in, band, maps.data(), j0, static_cast<int64_t>(b) * kBand, out, y);
      } else {
        q6k_tile<M, J>(x, in, band, maps.data(), j0, static_cast<int64_t>(b) * kBand, out, y);
      }
    }
  }
}

#endif  // __x86_64__

void matmul(int type, const float* x, int rows, int64_t in, const uint8_t* w, int64_t out,
            float* y) {
#if defined(__x86_64__)
  if (kernel_level() >= kAvx2) {
    using Kernel = void (*)(const float*, int64_t, const uint8_t*, int64_t, int, int, float*);
    constexpr int q4 = static_cast<int>(KBlockType::Q4K);
    constexpr int q6 = static_cast<int>(KBlockType::Q6K);
    static constexpr Kernel kernels[2][kblock::kBlockRows] = {
        {matmul_avx2<q4, 1>, matmul_avx2<q4, 2>, matmul_avx2<q4, 3>, matmul_avx2<q4, 4>,
         matmul_avx2<q4, 5>, matmul_avx2<q4, 6>, matmul_avx2<q4, 7>, matmul_avx2<q4, 8>},
        {matmul_avx2<q6, 1>, matmul_avx2<q6, 2>, matmul_avx2<q6, 3>, matmul_avx2<q6, 4>,
         matmul_avx2<q6, 5>, matmul_avx2<q6, 6>, matmul_avx2<q6, 7>, matmul_avx2<q6, 8>},
    };
    const Kernel* by_rows = kernels[type == q4 ? 0 : 1];
    kblock::for_each_pass(rows, in, out, [&](int m0, int m, int b0, int b1) {
      by_rows[m - 1](x + m0 * in, in, w, out, b0, b1, y + m0 * out);
    });
    return;
  }
#endif
  split_rows(rows, static_cast<int>(in), static_cast<int>(out), [&](int n0, int n1) {
    matmul_portable(type, x, rows, in, w, out, n0 / kBand, n1 / kBand, y);
  });
}

class KBlocksMatmul : public mx::UnaryPrimitive {
 public:
  KBlocksMatmul(mx::Stream stream, int type, int64_t out, int64_t in, bool int8_activations)
      : mx::UnaryPrimitive(stream),
        type_(type),
        out_(out),
        in_(in),
        int8_activations_(int8_activations) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& y) override {
    auto& encoder = mx::cpu::get_command_encoder(stream());
    const auto x = ensure_row_contiguous(inputs[0], encoder);
    const auto& w = inputs[1];
    y.set_data(mx::allocator::malloc(y.nbytes()));
    const int rows = static_cast<int>(x.size() / in_);
    encoder.set_input_array(x);
    encoder.set_input_array(w);
    encoder.set_output_array(y);
    encoder.dispatch([x = mx::array::unsafe_weak_copy(x), w = mx::array::unsafe_weak_copy(w),
                      y = mx::array::unsafe_weak_copy(y), rows, type = type_, in = in_,
                      out = out_, int8 = int8_activations_]() mutable {
      if (int8) {
        k_blocks_matmul_int8(type, x.data<float>(), rows, in, w.data<uint8_t>(), out,
                             y.data<float>());
      } else {
        matmul(type, x.data<float>(), rows, in, w.data<uint8_t>(), out, y.data<float>());
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("k-block products run on the CPU only");
  }

  const char* name() const override {
    return "KBlocksMatmul";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const KBlocksMatmul*>(&other);
    return o != nullptr && type_ == o->type_ && out_ == o->out_ && in_ == o->in_ &&
           int8_activations_ == o->int8_activations_;
  }

 private:
  int type_;
  int64_t out_;
  int64_t in_;
  bool int8_activations_;
};

class KBlocksRows : public mx::UnaryPrimitive {
 public:
  KBlocksRows(mx::Stream stream, int type, int64_t out, int64_t in)
      : mx::UnaryPrimitive(stream), type_(type), out_(out), in_(in) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& y) override {
    auto& encoder = mx::cpu::get_command_encoder(stream());
    const auto& w = inputs[0];
    const auto ids = ensure_row_contiguous(inputs[1], encoder);
    y.set_data(mx::allocator::malloc(y.nbytes()));
    encoder.set_input_array(w);
    encoder.set_input_array(ids);
    encoder.set_output_array(y);
    encoder.dispatch([w = mx::array::unsafe_weak_copy(w), ids = mx::array::unsafe_weak_copy(ids),
                      y = mx::array::unsafe_weak_copy(y), type = type_, in = in_,
                      out = out_]() mutable {
      const int64_t supers = in / kSuper;
      const size_t band_bytes = band_block(type) * supers;
      const uint8_t* data = w.data<uint8_t>();
      float* rows = y.data<float>();
      for (size_t i = 0; i < ids.size(); ++i) {
        const int64_t id = ids.dtype() == mx::int64 ? ids.data<int64_t>()[i]
                           : ids.dtype() == mx::uint32
                               ? static_cast<int64_t>(ids.data<uint32_t>()[i])
                               : static_cast<int64_t>(ids.data<int32_t>()[i]);
        float* row = rows + i * in;
        // An id past the table (which the tokenizer never gives) reads as a zero row rather
        // than memory outside it.
        if (id < 0 || id >= out) {
          std::fill(row, row + in, 0.0f);
          continue;
        }
        const uint8_t* band = data + (id / kBand) * band_bytes;
        for (int64_t s = 0; s < supers; ++s) {
          dequantize_block(type, band + s * band_block(type), static_cast<int>(id % kBand),
                           row + s * kSuper);
        }
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("k-block lookups run on the CPU only");
  }

  const char* name() const override {
    return "KBlocksRows";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const KBlocksRows*>(&other);
    return o != nullptr && type_ == o->type_ && out_ == o->out_ && in_ == o->in_;
  }

 private:
  int type_;
  int64_t out_;
  int64_t in_;
};

void check_shape(int type, int64_t out, int64_t in) {
  if (!known(type) || out <= 0 || in <= 0 || out % kBand != 0 || in % kSuper != 0) {
    throw std::invalid_argument("no k-block form for GGML type " + std::to_string(type) +
                                " at " + std::to_string(out) + "x" + std::to_string(in));
  }
}

}  // namespace

bool k_blocks_supported(int type, int64_t out, int64_t in) {
  return known(type) && out > 0 && in > 0 && out % kBand == 0 && in % kSuper == 0 &&
         primitive_runs(Primitive::PackedMatvec);
}

std::optional<mx::array> k_blocks_repack(const mx::array& w, const mx::array& scales,
                                              const mx::array& biases, int group, int bits,
                                              int& type) {
  if (bits == 4 && group == 32) {
    type = static_cast<int>(KBlockType::Q4K);
  } else if (bits == 8 && group == 16) {
    type = static_cast<int>(KBlockType::Q6K);
  } else {
    return std::nullopt;
  }
  if (w.ndim() != 2 || w.dtype() != mx::uint32 || scales.dtype() != mx::float32 ||
      biases.dtype() != mx::float32) {
    return std::nullopt;
  }
  const int64_t out = w.shape(0);
  const int64_t in = static_cast<int64_t>(w.shape(1)) * 32 / bits;
  if (!k_blocks_supported(type, out, in) || scales.shape() != mx::Shape{w.shape(0),
                                                                         static_cast<int>(in / group)} ||
      biases.shape() != scales.shape()) {
    return std::nullopt;
  }
  mx::eval({w, scales, biases});
  if (!w.flags().row_contiguous || !scales.flags().row_contiguous ||
      !biases.flags().row_contiguous) {
    return std::nullopt;
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(w.data<uint32_t>());
  const float* scale = scales.data<float>();
  const float* bias = biases.data<float>();
  const size_t block_bytes = band_block(type);
  const int64_t supers = in / kSuper;
  const size_t band_bytes = block_bytes * supers;
  const int64_t bands = out / kBand;
  const int64_t groups = in / group;
  auto buffer = mx::allocator::malloc(bands * band_bytes);
  auto* dst = static_cast<uint8_t*>(buffer.buffer().raw_ptr());
  bool fits = true;
  for (int64_t b = 0; b < bands && fits; ++b) {
    for (int64_t s = 0; s < supers && fits; ++s) {
      uint8_t* block = dst + b * band_bytes + s * block_bytes;
      for (int row = 0; row < kBand && fits; ++row) {
        const int64_t n = b * kBand + row;
        const float* row_scales = scale + n * groups + s * (kSuper / group);
        const float* row_biases = bias + n * groups + s * (kSuper / group);
        uint16_t d;
        if (type == static_cast<int>(KBlockType::Q4K)) {
          // Q4_K: scales `d · sc` and biases `−dmin · m`, `sc` and `m` in 0..63.
          int8_t sc[8];
          int8_t m[8];
          float minus_bias[8];
          uint16_t dmin;
          for (int g = 0; g < 8; ++g) {
            minus_bias[g] = -row_biases[g];
          }
          fits = factor(row_scales, 8, 0, 63, d, sc) && factor(minus_bias, 8, 0, 63, dmin, m);
          if (!fits) {
            break;
          }
          std::memcpy(block + 2 * row, &d, 2);
          std::memcpy(block + 16 + 2 * row, &dmin, 2);
          for (int g = 0; g < 8; ++g) {
            block[32 + 8 * g + row] = static_cast<uint8_t>(sc[g]);
            block[96 + 8 * g + row] = static_cast<uint8_t>(m[g]);
          }
          // MLX packs element k in the low nibble of byte k/2 when k is even, the high one
          // when odd; Q4_K's byte 32c + l holds element 64c + l low and 64c + 32 + l high.
          const uint8_t* packed = bytes + n * (in / 2) + s * (kSuper / 2);
          auto nibble = [&](int e) { return (packed[e / 2] >> (4 * (e % 2))) & 0xF; };
          uint8_t* q = block + 160 + 128 * row;
          for (int c = 0; c < 4; ++c) {
            for (int l = 0; l < 32; ++l) {
              q[32 * c + l] =
                  static_cast<uint8_t>(nibble(64 * c + l) | (nibble(64 * c + 32 + l) << 4));
            }
          }
        } else {
          // Q6_K: scales `d · sc`, `sc` in -128..127, biases `−32 · scale`, values `q − 32`
          // within a signed byte.
          int8_t sc[16];
          fits = factor(row_scales, 16, -128, 127, d, sc);
          for (int g = 0; g < 16 && fits; ++g) {
            fits = row_biases[g] == -32.0f * row_scales[g];
          }
          const uint8_t* values = bytes + n * in + s * kSuper;
          for (int e = 0; e < kSuper && fits; ++e) {
            fits = values[e] <= 159;
          }
          if (!fits) {
            break;
          }
          std::memcpy(block + 2 * row, &d, 2);
          for (int g = 0; g < 16; ++g) {
            block[16 + 8 * g + row] = static_cast<uint8_t>(sc[g]);
          }
          auto* q = reinterpret_cast<int8_t*>(block + 144 + 256 * row);
          for (int e = 0; e < kSuper; ++e) {
            q[e] = static_cast<int8_t>(static_cast<int>(values[e]) - 32);
          }
        }
      }
    }
  }
  if (!fits) {
    return std::nullopt;
  }
  return mx::array(std::move(buffer), {static_cast<int>(bands), static_cast<int>(band_bytes)},
                   mx::uint8);
}

mx::array k_blocks_product(const mx::array& x, const mx::array& w, int type, int64_t out,
                          int64_t in, bool int8_activations) {
  check_shape(type, out, in);
  if (x.dtype() != mx::float32 || x.ndim() < 1 || x.shape(-1) != in) {
    throw std::invalid_argument("a k-block product takes f32 activations of width " +
                                std::to_string(in));
  }
  auto shape = x.shape();
  shape.back() = static_cast<int>(out);
  return mx::array(std::move(shape), mx::float32,
                   std::make_shared<KBlocksMatmul>(mx::default_stream(mx::Device::cpu), type,
                                                   out, in, int8_activations),
                   {x, w});
}

mx::array k_blocks_lookup(const mx::array& w, const mx::array& ids, int type, int64_t out,
                        int64_t in) {
  check_shape(type, out, in);
  auto index = ids;
  if (ids.dtype() != mx::int32 && ids.dtype() != mx::uint32 && ids.dtype() != mx::int64) {
    index = mx::astype(ids, mx::int32);
  }
  auto shape = ids.shape();
  shape.push_back(static_cast<int>(in));
  return mx::array(std::move(shape), mx::float32,
                   std::make_shared<KBlocksRows>(mx::default_stream(mx::Device::cpu), type, out,
                                                 in),
                   {w, index});
}

}  // namespace mlxkit
