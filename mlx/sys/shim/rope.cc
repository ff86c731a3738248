// Rotary position embedding on the CPU as one graph node.
//
// The MLX wheel has no CPU kernel for `fast::rope`: it composes the rotation out of about thirty
// ops (positions, inverse frequencies, sines, cosines, slices, products, a concatenation), and a
// SmolLM2 decode step evaluated some 1,900 graph nodes for its 60 rotations, each paying MLX's
// per-node cost. This primitive computes the same formula in one node:
//
//   position p = (t + offset) · scale            (f32, as MLX's fallback)
//   inverse frequency w_i = exp(-i · ln(base) / (dims/2)), or 1 / freqs_i
//   θ = p · w_i (f32); pairs (x1, x2) ↦ (x1 cos θ − x2 sin θ, x1 sin θ + x2 cos θ)
//
// pairing the two halves of the first `dims` features, or adjacent features when
// `traditional`; features past `dims` pass through. Each token's result depends only on its
// own features and position, so a token gives the same bits alone, in a chunk or in a batch.
// Input rows are read through their strides (queries and keys arrive as transposed views).

#include "rope.h"
#include "primitives.h"

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "inputs.h"

namespace mlxkit {

namespace mx = mlx::core;

namespace {

// The shape of one call: rows of `D` features, grouped as [batch, heads, tokens].
struct RopeShape {
  int64_t batch;
  int64_t heads;  // the product of the axes between the first and the last two
  int64_t tokens;
  int64_t features;
  int dims;
  bool traditional;
  float scale;
};

void rotate(const RopeShape& shape, const float* x, const std::vector<int64_t>& starts,
            int64_t feature_stride, const int32_t* offsets, int64_t offset_stride,
            const float* inverse, float* out) {
  const int half = shape.dims / 2;
  std::vector<float> cosines(half), sines(half);
  for (int64_t b = 0; b < shape.batch; ++b) {
    const int32_t offset = offsets[b * offset_stride];
    for (int64_t t = 0; t < shape.tokens; ++t) {
      const float position =
          (static_cast<float>(t) + static_cast<float>(offset)) * shape.scale;
      for (int i = 0; i < half; ++i) {
        const float theta = position * inverse[i];
        cosines[i] = std::cos(theta);
        sines[i] = std::sin(theta);
      }
      for (int64_t h = 0; h < shape.heads; ++h) {
        const int64_t row = (b * shape.heads + h) * shape.tokens + t;
        const float* in = x + starts[row];
        float* o = out + row * shape.features;
        const int64_t s = feature_stride;
        for (int i = 0; i < half; ++i) {
          const int64_t a = shape.traditional ? 2 * i : i;
          const int64_t c = shape.traditional ? 2 * i + 1 : i + half;
          const float x1 = in[a * s];
          const float x2 = in[c * s];
          o[a] = x1 * cosines[i] - x2 * sines[i];
          o[c] = x1 * sines[i] + x2 * cosines[i];
        }
        for (int64_t d = shape.dims; d < shape.features; ++d) {
          o[d] = in[d * s];
        }
      }
    }
  }
}

class Rope : public mx::UnaryPrimitive {
 public:
  Rope(mx::Stream stream, int dims, bool traditional, float base, float scale, bool has_freqs)
      : mx::UnaryPrimitive(stream),
        dims_(dims),
        traditional_(traditional),
        base_(base),
        scale_(scale),
        has_freqs_(has_freqs) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& x = inputs[0];
    const auto& offset = inputs[1];
    const int n = static_cast<int>(x.ndim());
    RopeShape shape{x.shape(0), 1, x.shape(n - 2), x.shape(n - 1), dims_, traditional_, scale_};
    for (int axis = 1; axis < n - 2; ++axis) {
      shape.heads *= x.shape(axis);
    }
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    encoder.set_input_array(offset);
    if (has_freqs_) {
      encoder.set_input_array(inputs[2]);
    }
    encoder.set_output_array(out);
    std::optional<mx::array> freqs;
    if (has_freqs_) {
      freqs = mx::array::unsafe_weak_copy(inputs[2]);
    }
    const int64_t offset_stride = offset.size() > 1 ? offset.strides(0) : 0;
    encoder.dispatch([x = mx::array::unsafe_weak_copy(x),
                      offset = mx::array::unsafe_weak_copy(offset), freqs = std::move(freqs),
                      out = mx::array::unsafe_weak_copy(out), starts = row_starts(x), shape,
                      offset_stride, base = base_]() mutable {
      const int half = shape.dims / 2;
      std::vector<float> inverse(half);
      if (freqs) {
        const float* f = freqs->data<float>();
        const int64_t stride = freqs->strides(0);
        for (int i = 0; i < half; ++i) {
          inverse[i] = 1.0f / f[i * stride];
        }
      } else {
        const float step = std::log(base) / static_cast<float>(half);
        for (int i = 0; i < half; ++i) {
          inverse[i] = std::exp(static_cast<float>(-i) * step);
        }
      }
      rotate(shape, x.data<float>(), starts, x.strides(x.ndim() - 1), offset.data<int32_t>(),
             offset_stride, inverse.data(), out.data<float>());
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("the rotary embedding kernel runs on the CPU only");
  }

  const char* name() const override {
    return "MlxkitRope";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const Rope*>(&other);
    return o != nullptr && dims_ == o->dims_ && traditional_ == o->traditional_ &&
           base_ == o->base_ && scale_ == o->scale_ && has_freqs_ == o->has_freqs_;
  }

 private:
  int dims_;
  bool traditional_;
  float base_;
  float scale_;
  bool has_freqs_;
};

void check(bool ok, const std::string& message) {
  if (!ok) {
    throw std::invalid_argument("[rope] " + message);
  }
}

}  // namespace

std::optional<mx::array> rope(const mx::array& x, int dims, bool traditional,
                              std::optional<float> base, float scale, const mx::array& offset,
                              const std::optional<mx::array>& freqs) {
  if (!primitive_runs(Primitive::Rope) || x.dtype() != mx::float32) {
    return std::nullopt;
  }
  // The checks MLX's own op makes, with its messages' substance.
  check(x.ndim() >= 3, "input must have at least 3 dimensions");
  check(dims > 0 && dims % 2 == 0, "dims must be positive and even but got " +
                                       std::to_string(dims));
  check(dims <= x.shape(-1), "dims must not exceed the input's last dimension");
  check(offset.ndim() <= 1, "offset must be a scalar or a vector");
  check(offset.size() == 1 || offset.size() == static_cast<size_t>(x.shape(0)),
        "offset must be a scalar or hold one position per row of the batch");
  check(mx::issubdtype(offset.dtype(), mx::integer), "offset must be an integer");
  check(freqs.has_value() != base.has_value(), "exactly one of base or freqs must be given");
  if (freqs) {
    check(freqs->ndim() == 1 && freqs->shape(0) == dims / 2,
          "freqs must be one dimensional with size dims / 2");
  }
  const auto stream = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> inputs{x, offset.dtype() == mx::int32
                                       ? offset
                                       : mx::astype(offset, mx::int32, stream)};
  if (freqs) {
    inputs.push_back(freqs->dtype() == mx::float32 ? *freqs
                                                   : mx::astype(*freqs, mx::float32, stream));
  }
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<Rope>(stream, dims, traditional, base.value_or(1.0f), scale,
                                          freqs.has_value()),
                   std::move(inputs));
}

}  // namespace mlxkit
