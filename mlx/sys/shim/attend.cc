// Attention of one new token per row over each row's own history, for batched decode steps.
//
// A decode step over B sequences has B histories of different lengths. Attending them with
// MLX's `scaled_dot_product_attention` takes one call per row, and on the CPU each call is a
// handful of small ops (slices, the GQA reshape, two matmuls, a softmax): on SmolLM2 with 8
// rows that was about a fifth of the step. This primitive takes every row's keys and values
// as they lie in the caches (strided views, nothing copied) and attends them all in one op.
//
// Each (row, head) runs the same operations in the same order whatever the other rows are, so
// a row's result does not depend on the batch it is in.

#include "attend.h"

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mlxkit {

namespace mx = mlx::core;

namespace {

// Element strides of a `[1 or rows, heads, tokens, head_dim]` view, head_dim contiguous.
struct View {
  const float* data;
  int64_t head;
  int64_t token;
};

View view_of(const mx::array& a, int64_t row = 0) {
  const auto& s = a.strides();
  return View{a.data<float>() + row * s[0], s[1], s[2]};
}

float dot_portable(const float* a, const float* b, int n) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    sum += a[i] * b[i];
  }
  return sum;
}

void axpy_portable(float p, const float* v, int n, float* out) {
  for (int i = 0; i < n; ++i) {
    out[i] += p * v[i];
  }
}

#if defined(__x86_64__)

#define MLXKIT_AVX2 __attribute__((target("avx2,fma")))

// `n` a multiple of 8.
MLXKIT_AVX2 float dot_avx2(const float* a, const float* b, int n) {
  __m256 s0 = _mm256_setzero_ps();
  __m256 s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  if (i < n) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  }
  const __m256 s = _mm256_add_ps(s0, s1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

// `n` a multiple of 8.
MLXKIT_AVX2 void axpy_avx2(float p, const float* v, int n, float* out) {
  const __m256 scale = _mm256_set1_ps(p);
  for (int i = 0; i < n; i += 8) {
    _mm256_storeu_ps(out + i,
                     _mm256_fmadd_ps(scale, _mm256_loadu_ps(v + i), _mm256_loadu_ps(out + i)));
  }
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

#endif  // __x86_64__

struct Kernels {
  float (*dot)(const float*, const float*, int);
  void (*axpy)(float, const float*, int, float*);
};

Kernels kernels_for(int head_dim) {
#if defined(__x86_64__)
  if (has_avx2() && head_dim % 8 == 0) {
    return {dot_avx2, axpy_avx2};
  }
#endif
  return {dot_portable, axpy_portable};
}

// One head of one row: `out = softmax(scale · K q) V` over `len` tokens.
void attend_head(const Kernels& k, const float* q, View keys, View values, int kv_head, int len,
                 int head_dim, float scale, std::optional<float> softcap, float* scores,
                 float* out) {
  const float* kh = keys.data + kv_head * keys.head;
  const float* vh = values.data + kv_head * values.head;
  float max = -INFINITY;
  for (int t = 0; t < len; ++t) {
    float s = k.dot(q, kh + t * keys.token, head_dim) * scale;
    if (softcap) {
      s = *softcap * std::tanh(s / *softcap);
    }
    scores[t] = s;
    max = std::max(max, s);
  }
  float total = 0.0f;
  for (int t = 0; t < len; ++t) {
    scores[t] = std::exp(scores[t] - max);
    total += scores[t];
  }
  std::fill(out, out + head_dim, 0.0f);
  for (int t = 0; t < len; ++t) {
    k.axpy(scores[t], vh + t * values.token, head_dim, out);
  }
  const float inverse = 1.0f / total;
  for (int d = 0; d < head_dim; ++d) {
    out[d] *= inverse;
  }
}

class DecodeAttention : public mx::UnaryPrimitive {
 public:
  DecodeAttention(mx::Stream stream, float scale, std::optional<float> softcap)
      : mx::UnaryPrimitive(stream), scale_(scale), softcap_(softcap) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& y) override {
    const auto& queries = inputs[0];
    const int rows = queries.shape(0);
    const int heads = queries.shape(1);
    const int head_dim = queries.shape(3);
    for (const auto& a : inputs) {
      if (a.strides().back() != 1) {
        throw std::invalid_argument("decode attention: head_dim is not contiguous");
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
    encoder.dispatch([held = std::move(held), y = mx::array::unsafe_weak_copy(y), rows, heads,
                      head_dim, scale = scale_, softcap = softcap_]() mutable {
      const Kernels k = kernels_for(head_dim);
      const auto& queries = held[0];
      int longest = 0;
      for (int r = 0; r < rows; ++r) {
        longest = std::max(longest, held[1 + 2 * r].shape(2));
      }
      std::vector<float> scores(longest);
      float* out = y.data<float>();
      for (int r = 0; r < rows; ++r) {
        const auto& keys = held[1 + 2 * r];
        const auto& values = held[2 + 2 * r];
        const int group = heads / keys.shape(1);
        const View q = view_of(queries, r);
        for (int h = 0; h < heads; ++h) {
          attend_head(k, q.data + h * q.head, view_of(keys), view_of(values), h / group,
                      keys.shape(2), head_dim, scale, softcap, scores.data(),
                      out + (static_cast<size_t>(r) * heads + h) * head_dim);
        }
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("decode attention runs on the CPU only");
  }

  const char* name() const override {
    return "DecodeAttention";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const DecodeAttention*>(&other);
    return o != nullptr && scale_ == o->scale_ && softcap_ == o->softcap_;
  }

 private:
  float scale_;
  std::optional<float> softcap_;
};

}  // namespace

std::optional<mx::array> decode_attention(const mx::array& queries,
                                          const std::vector<mx::array>& keys,
                                          const std::vector<mx::array>& values, float scale,
                                          std::optional<float> softcap) {
  if (mx::default_device() != mx::Device::cpu || queries.ndim() != 4 ||
      queries.dtype() != mx::float32 || queries.shape(2) != 1) {
    return std::nullopt;
  }
  const int rows = queries.shape(0);
  const int heads = queries.shape(1);
  const int head_dim = queries.shape(3);
  if (rows == 0 || head_dim == 0 || keys.size() != static_cast<size_t>(rows) ||
      values.size() != keys.size()) {
    return std::nullopt;
  }
  std::vector<mx::array> inputs{queries};
  inputs.reserve(1 + 2 * keys.size());
  for (size_t r = 0; r < keys.size(); ++r) {
    const auto& k = keys[r];
    const auto& v = values[r];
    if (k.ndim() != 4 || k.shape() != v.shape() || k.dtype() != mx::float32 ||
        v.dtype() != mx::float32 || k.shape(0) != 1 || k.shape(1) == 0 ||
        heads % k.shape(1) != 0 || k.shape(2) == 0 || k.shape(3) != head_dim) {
      return std::nullopt;
    }
    inputs.push_back(k);
    inputs.push_back(v);
  }
  const auto stream = mx::default_stream(mx::Device::cpu);
  return mx::array(mx::Shape{rows, heads, 1, head_dim}, mx::float32,
                   std::make_shared<DecodeAttention>(stream, scale, softcap), std::move(inputs));
}

}  // namespace mlxkit
