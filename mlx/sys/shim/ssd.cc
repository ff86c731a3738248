// The Mamba-2 selective state space recurrence as one CPU kernel.
//
// Per head, the state S (`P × N`) decays by `exp(dt · a)`, takes in the token's input along
// the group's `b`, and is read along the group's `c`:
//
//     S ← exp(dt_t a) · S + dt_t x_t b_tᵀ
//     y_t = S c_t
//
// As with the gated delta rule (delta.cc), MLX ops would spend a decode step in dispatch; the
// sequential form here also serves prefill, where on a CPU it does the fewest flops.

#include "ssd.h"
#include "primitives.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

#include "inputs.h"

namespace mlxkit {

namespace mx = mlx::core;

namespace {

struct Dims {
  int batch, tokens, heads, head_dim, groups, state;
};

void scan(const Dims& d, const float* x, const float* dt, const float* a, const float* b,
          const float* c, float* y, float* state) {
  const int per_group = d.heads / d.groups;
  for (int n = 0; n < d.batch; ++n) {
    for (int h = 0; h < d.heads; ++h) {
      const int g = h / per_group;
      float* s = state + (static_cast<size_t>(n) * d.heads + h) * d.head_dim * d.state;
      for (int t = 0; t < d.tokens; ++t) {
        const size_t nt = static_cast<size_t>(n) * d.tokens + t;
        const float step = dt[nt * d.heads + h];
        const float decay = std::exp(step * a[h]);
        const float* xt = x + (nt * d.heads + h) * d.head_dim;
        const float* bt = b + (nt * d.groups + g) * d.state;
        const float* ct = c + (nt * d.groups + g) * d.state;
        float* yt = y + (nt * d.heads + h) * d.head_dim;
        for (int p = 0; p < d.head_dim; ++p) {
          float* row = s + static_cast<size_t>(p) * d.state;
          const float input = step * xt[p];
          float out = 0.0f;
          for (int j = 0; j < d.state; ++j) {
            row[j] = row[j] * decay + input * bt[j];
            out += row[j] * ct[j];
          }
          yt[p] = out;
        }
      }
    }
  }
}

class SsdScan : public mx::Primitive {
 public:
  explicit SsdScan(mx::Stream stream) : mx::Primitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& encoder = mx::cpu::get_command_encoder(stream());
    std::vector<mx::array> in;
    for (const auto& a : inputs) {
      in.push_back(ensure_row_contiguous(a, encoder));
    }
    auto& y = outputs[0];
    auto& state = outputs[1];
    y.set_data(mx::allocator::malloc(y.nbytes()));
    state.set_data(mx::allocator::malloc(state.nbytes()));
    const auto& x = in[0];
    const auto& b = in[3];
    const Dims dims{static_cast<int>(x.shape(0)), static_cast<int>(x.shape(1)),
                    static_cast<int>(x.shape(2)), static_cast<int>(x.shape(3)),
                    static_cast<int>(b.shape(2)), static_cast<int>(b.shape(3))};
    for (const auto& a : in) {
      encoder.set_input_array(a);
    }
    encoder.set_output_array(y);
    encoder.set_output_array(state);
    encoder.dispatch([dims, x = mx::array::unsafe_weak_copy(in[0]),
                      dt = mx::array::unsafe_weak_copy(in[1]),
                      a = mx::array::unsafe_weak_copy(in[2]),
                      b = mx::array::unsafe_weak_copy(in[3]),
                      c = mx::array::unsafe_weak_copy(in[4]),
                      initial = mx::array::unsafe_weak_copy(in[5]),
                      y = mx::array::unsafe_weak_copy(y),
                      state = mx::array::unsafe_weak_copy(state)]() mutable {
      std::memcpy(state.data<float>(), initial.data<float>(), state.nbytes());
      scan(dims, x.data<float>(), dt.data<float>(), a.data<float>(), b.data<float>(),
           c.data<float>(), y.data<float>(), state.data<float>());
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("the ssd scan kernel runs on the CPU only");
  }

  const char* name() const override {
    return "SsdScan";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const SsdScan*>(&other) != nullptr;
  }
};

}  // namespace

std::optional<std::pair<mx::array, mx::array>> scan_ssd(const mx::array& x, const mx::array& dt,
                                                        const mx::array& a, const mx::array& b,
                                                        const mx::array& c,
                                                        const mx::array& state) {
  if (!primitive_runs(Primitive::SsdScan)) {
    return std::nullopt;
  }
  for (const auto* t : {&x, &dt, &a, &b, &c, &state}) {
    if (t->dtype() != mx::float32) {
      return std::nullopt;
    }
  }
  if (x.ndim() != 4 || dt.ndim() != 3 || a.ndim() != 1 || b.ndim() != 4 ||
      c.shape() != b.shape() || state.ndim() != 4) {
    return std::nullopt;
  }
  const auto batch = x.shape(0), tokens = x.shape(1), heads = x.shape(2), head_dim = x.shape(3);
  const auto groups = b.shape(2), size = b.shape(3);
  if (dt.shape() != mx::Shape{batch, tokens, heads} || a.shape(0) != heads ||
      b.shape(0) != batch || b.shape(1) != tokens || groups == 0 || heads % groups != 0 ||
      state.shape() != mx::Shape{batch, heads, head_dim, size}) {
    return std::nullopt;
  }
  const auto stream = mx::default_stream(mx::Device::cpu);
  auto outputs = mx::array::make_arrays(
      {x.shape(), state.shape()}, {mx::float32, mx::float32}, std::make_shared<SsdScan>(stream),
      {x, dt, a, b, c, state});
  return std::make_pair(outputs[0], outputs[1]);
}

}  // namespace mlxkit
