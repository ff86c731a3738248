// Softmax over the last axis on the CPU, for attention spelled out as two products around it
// (a vision tower's thousands of patches, where the score matrix is worth forming so that BLAS
// does the products).
//
// The MLX wheel's CPU softmax evaluates `exp` one lane at a time through libm's `fmaf`: in
// Gemma 3's SigLIP tower (4,096 patches, 16 heads, 27 layers: 7 billion exponentials an image)
// it took about half of the encoder's time. Here each row takes its maximum, then
// `exp(x - max)` eight lanes at a time with their sum, then the scale by `1 / sum`, as MLX's
// precise softmax does in f32.

#include "softmax.h"
#include "primitives.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "inputs.h"
#include "pool.h"
#include "vexp.h"
#include "x86.h"

namespace mlxkit {

namespace mx = mlx::core;

namespace {

// Rows a part of the pool's work takes at least: a part's overhead is a few microseconds.
constexpr int64_t kMinElementsPerPart = 1 << 15;

void softmax_row_portable(const float* x, int64_t n, float* y) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    max = std::max(max, x[i]);
  }
  float total = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - max);
    total += y[i];
  }
  const float inverse = 1.0f / total;
  for (int64_t i = 0; i < n; ++i) {
    y[i] *= inverse;
  }
}

#if defined(__x86_64__)

MLXKIT_AVX2 void softmax_row_avx2(const float* x, int64_t n, float* y) {
  const float max = max_avx2(x, n);
  const __m256 max_all = _mm256_set1_ps(max);
  __m256 total8 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), max_all));
    _mm256_storeu_ps(y + i, e);
    total8 = _mm256_add_ps(total8, e);
  }
  float total = horizontal_sum(total8);
  for (int64_t j = i; j < n; ++j) {
    y[j] = std::exp(x[j] - max);
    total += y[j];
  }
  const __m256 inverse = _mm256_set1_ps(1.0f / total);
  i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), inverse));
  }
  for (int64_t j = i; j < n; ++j) {
    y[j] *= 1.0f / total;
  }
}

#endif  // __x86_64__

void softmax_rows(const float* x, int64_t rows, int64_t n, float* y) {
  auto row = softmax_row_portable;
#if defined(__x86_64__)
  if (has_avx2()) {
    row = softmax_row_avx2;
  }
#endif
  const int64_t parts = std::clamp<int64_t>(rows * n / kMinElementsPerPart, 1,
                                            std::min<int64_t>(rows, pool_threads() * 4));
  parallel_for(static_cast<int>(parts), [&](int p) {
    for (int64_t r = rows * p / parts; r < rows * (p + 1) / parts; ++r) {
      row(x + r * n, n, y + r * n);
    }
  });
}

class SoftmaxLastAxis : public mx::UnaryPrimitive {
 public:
  explicit SoftmaxLastAxis(mx::Stream stream) : mx::UnaryPrimitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& y) override {
    auto& encoder = mx::cpu::get_command_encoder(stream());
    const auto x = ensure_row_contiguous(inputs[0], encoder);
    y.set_data(mx::allocator::malloc(y.nbytes()));
    encoder.set_input_array(x);
    encoder.set_output_array(y);
    const int64_t n = x.shape(-1);
    encoder.dispatch([x = mx::array::unsafe_weak_copy(x), y = mx::array::unsafe_weak_copy(y),
                      n]() mutable {
      softmax_rows(x.data<float>(), static_cast<int64_t>(x.size()) / n, n, y.data<float>());
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("the softmax kernel runs on the CPU only");
  }

  const char* name() const override {
    return "SoftmaxLastAxis";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const SoftmaxLastAxis*>(&other) != nullptr;
  }
};

}  // namespace

std::optional<mx::array> last_axis_softmax(const mx::array& x) {
  if (!primitive_runs(Primitive::Softmax) || x.dtype() != mx::float32 || x.ndim() < 1 ||
      x.size() == 0 || x.shape(-1) == 0) {
    return std::nullopt;
  }
  const auto stream = mx::default_stream(mx::Device::cpu);
  return mx::array(x.shape(), mx::float32, std::make_shared<SoftmaxLastAxis>(stream), {x});
}

}  // namespace mlxkit
