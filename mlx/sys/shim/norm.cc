// RMS normalization on the CPU as one graph node.
//
// The MLX wheel has no CPU kernel for `fast::rms_norm`: it composes it out of eight ops (a
// cast, the square, a sum, a division, the epsilon, `rsqrt`, two products) and every layer
// normalizes two or more times, each op paying MLX's per-node cost. This primitive computes the
// same formula per row of the last axis in one node:
//
//   y = (x · 1/√(mean(x²) + ε)) · w
//
// The sum of squares runs in eight f32 lanes (so the compiler may vectorize it without
// reassociating), added pairwise at the end; a row's result depends on that row alone.
// Input rows are read through their strides.

#include "norm.h"
#include "primitives.h"

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "inputs.h"

namespace mlxkit {

namespace mx = mlx::core;

namespace {

constexpr int kLanes = 8;

float mean_square(const float* x, int64_t n, int64_t stride) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  if (stride == 1) {
    for (; i + kLanes <= n; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        lanes[l] += x[i + l] * x[i + l];
      }
    }
  }
  for (; i < n; ++i) {
    lanes[i % kLanes] += x[i * stride] * x[i * stride];
  }
  const float sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
                    ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
  return sum / static_cast<float>(n);
}

class RmsNorm : public mx::UnaryPrimitive {
 public:
  RmsNorm(mx::Stream stream, float eps, bool has_weight)
      : mx::UnaryPrimitive(stream), eps_(eps), has_weight_(has_weight) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& x = inputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    std::optional<mx::array> weight;
    if (has_weight_) {
      encoder.set_input_array(inputs[1]);
      weight = mx::array::unsafe_weak_copy(inputs[1]);
    }
    encoder.set_output_array(out);
    encoder.dispatch([x = mx::array::unsafe_weak_copy(x), weight = std::move(weight),
                      out = mx::array::unsafe_weak_copy(out), starts = row_starts(x),
                      eps = eps_]() mutable {
      const int64_t n = x.shape(-1);
      const int64_t stride = x.strides(x.ndim() - 1);
      const float* w = weight ? weight->data<float>() : nullptr;
      const int64_t w_stride = weight ? weight->strides(0) : 0;
      const float* base = x.data<float>();
      float* y = out.data<float>();
      for (size_t r = 0; r < starts.size(); ++r) {
        const float* row = base + starts[r];
        const float inverse = 1.0f / std::sqrt(mean_square(row, n, stride) + eps);
        float* o = y + static_cast<int64_t>(r) * n;
        for (int64_t i = 0; i < n; ++i) {
          const float normed = row[i * stride] * inverse;
          o[i] = w ? normed * w[i * w_stride] : normed;
        }
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("the RMS norm kernel runs on the CPU only");
  }

  const char* name() const override {
    return "MlxkitRmsNorm";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const RmsNorm*>(&other);
    return o != nullptr && eps_ == o->eps_ && has_weight_ == o->has_weight_;
  }

 private:
  float eps_;
  bool has_weight_;
};

}  // namespace

std::optional<mx::array> rms_norm(const mx::array& x, const std::optional<mx::array>& weight,
                                  float eps) {
  if (!primitive_runs(Primitive::RmsNorm) || x.dtype() != mx::float32 ||
      (weight && weight->dtype() != mx::float32)) {
    return std::nullopt;
  }
  if (x.ndim() == 0) {
    throw std::invalid_argument("[rms_norm] input must have at least 1 dimension");
  }
  if (weight && (weight->ndim() != 1 || weight->shape(0) != x.shape(-1))) {
    throw std::invalid_argument(
        "[rms_norm] the weight must be one dimensional, the size of the input's last axis");
  }
  const auto stream = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> inputs{x};
  if (weight) {
    inputs.push_back(*weight);
  }
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<RmsNorm>(stream, eps, weight.has_value()), std::move(inputs));
}

}  // namespace mlxkit
