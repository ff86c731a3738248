// The gated delta rule's recurrence as one CPU kernel.
//
// Per value head, the state S (`Dv × Dk`) is decayed, corrected towards the token's value
// along its key, and read by its query:
//
//     S ← exp(g_t) · S
//     S ← S + β_t · (v_t − S k_t) k_tᵀ
//     y_t = S q_t
//
// In MLX ops that is about ten small ops per token and layer, which on the CPU costs far more
// in dispatch than in arithmetic (a decode step does `Hv · Dv · Dk · 4` flops per layer). Here
// each state row stays in cache for the whole scan. Prefill runs the same scan: on the CPU the
// sequential form does the fewest flops (the chunked form exists for GPU parallelism), and a
// prompt evaluated in one piece or in chunks gives the same arithmetic, token by token.

#include "delta.h"
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
  int batch, tokens, key_heads, value_heads, key_dim, value_dim;
};

void scan(const Dims& d, const float* q, const float* k, const float* v, const float* g,
          const float* beta, float* y, float* state) {
  const int group = d.value_heads / d.key_heads;
  for (int b = 0; b < d.batch; ++b) {
    for (int hv = 0; hv < d.value_heads; ++hv) {
      const int hk = hv / group;
      float* s = state + (static_cast<size_t>(b) * d.value_heads + hv) * d.value_dim * d.key_dim;
      for (int t = 0; t < d.tokens; ++t) {
        const size_t bt = static_cast<size_t>(b) * d.tokens + t;
        const float* kt = k + (bt * d.key_heads + hk) * d.key_dim;
        const float* qt = q + (bt * d.key_heads + hk) * d.key_dim;
        const float* vt = v + (bt * d.value_heads + hv) * d.value_dim;
        float* yt = y + (bt * d.value_heads + hv) * d.value_dim;
        const float decay = std::exp(g[bt * d.value_heads + hv]);
        const float rate = beta[bt * d.value_heads + hv];
        for (int i = 0; i < d.value_dim; ++i) {
          float* row = s + static_cast<size_t>(i) * d.key_dim;
          float memory = 0.0f;
          for (int j = 0; j < d.key_dim; ++j) {
            row[j] *= decay;
            memory += row[j] * kt[j];
          }
          const float delta = (vt[i] - memory) * rate;
          float out = 0.0f;
          for (int j = 0; j < d.key_dim; ++j) {
            row[j] += delta * kt[j];
            out += row[j] * qt[j];
          }
          yt[i] = out;
        }
      }
    }
  }
}

class GatedDeltaScan : public mx::Primitive {
 public:
  explicit GatedDeltaScan(mx::Stream stream) : mx::Primitive(stream) {}

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
    const auto& k = in[1];
    const auto& v = in[2];
    const Dims dims{static_cast<int>(k.shape(0)), static_cast<int>(k.shape(1)),
                    static_cast<int>(k.shape(2)), static_cast<int>(v.shape(2)),
                    static_cast<int>(k.shape(3)), static_cast<int>(v.shape(3))};
    for (const auto& a : in) {
      encoder.set_input_array(a);
    }
    encoder.set_output_array(y);
    encoder.set_output_array(state);
    encoder.dispatch([dims, q = mx::array::unsafe_weak_copy(in[0]),
                      k = mx::array::unsafe_weak_copy(in[1]),
                      v = mx::array::unsafe_weak_copy(in[2]),
                      g = mx::array::unsafe_weak_copy(in[3]),
                      beta = mx::array::unsafe_weak_copy(in[4]),
                      initial = mx::array::unsafe_weak_copy(in[5]),
                      y = mx::array::unsafe_weak_copy(y),
                      state = mx::array::unsafe_weak_copy(state)]() mutable {
      std::memcpy(state.data<float>(), initial.data<float>(), state.nbytes());
      scan(dims, q.data<float>(), k.data<float>(), v.data<float>(), g.data<float>(),
           beta.data<float>(), y.data<float>(), state.data<float>());
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("the gated delta scan kernel runs on the CPU only");
  }

  const char* name() const override {
    return "GatedDeltaScan";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    return dynamic_cast<const GatedDeltaScan*>(&other) != nullptr;
  }
};

}  // namespace

std::optional<std::pair<mx::array, mx::array>> scan_gated_delta(
    const mx::array& q, const mx::array& k, const mx::array& v, const mx::array& g,
    const mx::array& beta, const mx::array& state) {
  if (!primitive_runs(Primitive::GatedDeltaScan)) {
    return std::nullopt;
  }
  for (const auto* a : {&q, &k, &v, &g, &beta, &state}) {
    if (a->dtype() != mx::float32) {
      return std::nullopt;
    }
  }
  if (q.ndim() != 4 || k.shape() != q.shape() || v.ndim() != 4 || g.ndim() != 3 ||
      beta.shape() != g.shape() || state.ndim() != 4) {
    return std::nullopt;
  }
  const auto batch = k.shape(0), tokens = k.shape(1), key_heads = k.shape(2);
  const auto value_heads = v.shape(2), key_dim = k.shape(3), value_dim = v.shape(3);
  if (v.shape(0) != batch || v.shape(1) != tokens || key_heads == 0 ||
      value_heads % key_heads != 0 || g.shape() != mx::Shape{batch, tokens, value_heads} ||
      state.shape() != mx::Shape{batch, value_heads, value_dim, key_dim}) {
    return std::nullopt;
  }
  const auto stream = mx::default_stream(mx::Device::cpu);
  auto outputs = mx::array::make_arrays(
      {v.shape(), state.shape()}, {mx::float32, mx::float32},
      std::make_shared<GatedDeltaScan>(stream),
      {q, k, v, g, beta, state});
  return std::make_pair(outputs[0], outputs[1]);
}

}  // namespace mlxkit
