#include "shim.h"

#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "mlxkit-mlx-sys/src/lib.rs.h"
#include "append.h"
#include "attend.h"
#include "delta.h"
#include "ssd.h"
#include "gated.h"
#include "kblocks.h"
#include "softmax.h"
#include "norm.h"
#include "rope.h"
#include "pool.h"
#include "primitives.h"
#include "qmv.h"
#include "x86.h"

namespace mlxkit {

namespace mx = mlx::core;

namespace {

// Dtype codes shared with Rust: the order of `mlx::core::Dtype::Val`.
mx::Dtype dtype_from_code(uint8_t code) {
  switch (code) {
    case 0: return mx::bool_;
    case 1: return mx::uint8;
    case 2: return mx::uint16;
    case 3: return mx::uint32;
    case 4: return mx::uint64;
    case 5: return mx::int8;
    case 6: return mx::int16;
    case 7: return mx::int32;
    case 8: return mx::int64;
    case 9: return mx::float16;
    case 10: return mx::float32;
    case 11: return mx::float64;
    case 12: return mx::bfloat16;
    case 13: return mx::complex64;
  }
  throw std::invalid_argument("unknown dtype code " + std::to_string(code));
}

uint8_t dtype_to_code(mx::Dtype dtype) {
  return static_cast<uint8_t>(static_cast<mx::Dtype::Val>(dtype));
}

mx::Shape to_shape(rust::Slice<const int32_t> s) {
  return mx::Shape(s.begin(), s.end());
}

std::vector<int> to_ints(rust::Slice<const int32_t> s) {
  return std::vector<int>(s.begin(), s.end());
}

std::unique_ptr<Array> own(Array a) {
  return std::make_unique<Array>(std::move(a));
}

// Null for "this kernel does not apply", for the mlxkit kernels that decline some inputs.
std::unique_ptr<Array> own_if(std::optional<Array> a) {
  return a ? own(std::move(*a)) : nullptr;
}

std::unique_ptr<ArrayList> own_list(std::vector<Array> items) {
  auto list = std::make_unique<ArrayList>();
  list->items = std::move(items);
  return list;
}

std::optional<Array> optional(bool present, const Array& a) {
  if (present) {
    return a;
  }
  return std::nullopt;
}

std::string mode_name(QuantMode mode) {
  switch (mode) {
    case QuantMode::Affine: return "affine";
    case QuantMode::Mxfp4: return "mxfp4";
    case QuantMode::Mxfp8: return "mxfp8";
    case QuantMode::Nvfp4: return "nvfp4";
  }
  throw std::invalid_argument("unknown quantization mode");
}

mx::Device device(bool gpu) {
  return gpu ? mx::Device::gpu : mx::Device::cpu;
}

}  // namespace

rust::String version() { return rust::String(mx::version()); }

bool metal_is_available() { return mx::metal::is_available(); }

bool cuda_is_available() { return mx::cu::is_available(); }

void set_default_device(bool gpu) { mx::set_default_device(device(gpu)); }

bool default_device_is_gpu() { return mx::default_device() == mx::Device::gpu; }

int32_t new_stream(bool gpu) { return mx::new_stream(device(gpu)).index; }

void set_default_stream(int32_t index, bool gpu) {
  for (auto& s : mx::get_streams()) {
    if (s.index == index && s.device == device(gpu)) {
      mx::set_default_stream(s);
      return;
    }
  }
  throw std::invalid_argument("no stream with index " + std::to_string(index));
}

void synchronize() { mx::synchronize(); }

std::unique_ptr<ArrayList> list_new() { return std::make_unique<ArrayList>(); }

void list_push(ArrayList& list, const Array& a) { list.items.push_back(a); }

size_t list_len(const ArrayList& list) { return list.items.size(); }

std::unique_ptr<Array> list_get(const ArrayList& list, size_t index) {
  if (index >= list.items.size()) {
    throw std::out_of_range(
        "array list index " + std::to_string(index) + " out of range for length " +
        std::to_string(list.items.size()));
  }
  return own(list.items[index]);
}

std::unique_ptr<Array> array_from_bytes(
    rust::Slice<const uint8_t> data,
    rust::Slice<const int32_t> shape,
    uint8_t dtype_code) {
  auto dtype = dtype_from_code(dtype_code);
  auto s = to_shape(shape);
  size_t count = 1;
  for (auto d : s) {
    if (d < 0) {
      throw std::invalid_argument("negative dimension in shape");
    }
    count *= static_cast<size_t>(d);
  }
  size_t nbytes = count * mx::size_of(dtype);
  if (nbytes != data.size()) {
    throw std::invalid_argument(
        "data holds " + std::to_string(data.size()) + " bytes but the shape needs " +
        std::to_string(nbytes));
  }
  auto buffer = mx::allocator::malloc(nbytes);
  if (nbytes > 0) {
    std::memcpy(buffer.buffer().raw_ptr(), data.data(), nbytes);
  }
  return own(Array(std::move(buffer), std::move(s), dtype));
}

std::unique_ptr<Array> array_scalar_f32(float value, uint8_t dtype) {
  return own(Array(value, dtype_from_code(dtype)));
}

std::unique_ptr<Array> array_scalar_i32(int32_t value, uint8_t dtype) {
  return own(Array(value, dtype_from_code(dtype)));
}

std::unique_ptr<Array> array_clone(const Array& a) { return own(a); }

rust::Vec<int32_t> array_shape(const Array& a) {
  rust::Vec<int32_t> out;
  for (auto d : a.shape()) {
    out.push_back(d);
  }
  return out;
}

uint8_t array_dtype(const Array& a) { return dtype_to_code(a.dtype()); }

size_t array_size(const Array& a) { return a.size(); }

size_t array_nbytes(const Array& a) { return a.nbytes(); }

void array_read_bytes(const Array& a, rust::Slice<uint8_t> out) {
  // A row-contiguous copy, so transposed, broadcast and sliced views read in logical order.
  Array c = mx::contiguous(a, false);
  c.eval();
  if (!c.flags().row_contiguous) {
    throw std::runtime_error("array is not row-contiguous after a contiguous copy");
  }
  size_t nbytes = c.size() * c.itemsize();
  if (nbytes != out.size()) {
    throw std::invalid_argument(
        "array holds " + std::to_string(nbytes) + " bytes but the destination has " +
        std::to_string(out.size()));
  }
  if (nbytes > 0) {
    std::memcpy(out.data(), c.data<uint8_t>(), nbytes);
  }
}

rust::String array_to_string(const Array& a) {
  std::ostringstream os;
  os << a;
  return rust::String(os.str());
}

std::unique_ptr<Array> zeros(rust::Slice<const int32_t> shape, uint8_t dtype) {
  return own(mx::zeros(to_shape(shape), dtype_from_code(dtype)));
}

std::unique_ptr<Array> ones(rust::Slice<const int32_t> shape, uint8_t dtype) {
  return own(mx::ones(to_shape(shape), dtype_from_code(dtype)));
}

std::unique_ptr<Array> full(rust::Slice<const int32_t> shape, const Array& value, uint8_t dtype) {
  return own(mx::full(to_shape(shape), value, dtype_from_code(dtype)));
}

std::unique_ptr<Array> arange(double start, double stop, double step, uint8_t dtype) {
  return own(mx::arange(start, stop, step, dtype_from_code(dtype)));
}

void eval(const ArrayList& list) { mx::eval(list.items); }

void async_eval(const ArrayList& list) { mx::async_eval(list.items); }

std::unique_ptr<Array> unary(UnaryOp op, const Array& a) {
  switch (op) {
    case UnaryOp::Negative: return own(mx::negative(a));
    case UnaryOp::Abs: return own(mx::abs(a));
    case UnaryOp::Exp: return own(mx::exp(a));
    case UnaryOp::Log: return own(mx::log(a));
    case UnaryOp::Log1p: return own(mx::log1p(a));
    case UnaryOp::Sqrt: return own(mx::sqrt(a));
    case UnaryOp::Rsqrt: return own(mx::rsqrt(a));
    case UnaryOp::Square: return own(mx::square(a));
    case UnaryOp::Reciprocal: return own(mx::reciprocal(a));
    case UnaryOp::Sin: return own(mx::sin(a));
    case UnaryOp::Cos: return own(mx::cos(a));
    case UnaryOp::Tanh: return own(mx::tanh(a));
    case UnaryOp::Sigmoid: return own(mx::sigmoid(a));
    case UnaryOp::Erf: return own(mx::erf(a));
    case UnaryOp::Floor: return own(mx::floor(a));
    case UnaryOp::Ceil: return own(mx::ceil(a));
    case UnaryOp::LogicalNot: return own(mx::logical_not(a));
    case UnaryOp::IsNan: return own(mx::isnan(a));
    case UnaryOp::StopGradient: return own(mx::stop_gradient(a));
    case UnaryOp::Silu: return own(mx::multiply(a, mx::sigmoid(a)));
    case UnaryOp::Gelu: {
      // Exact GELU: x * (1 + erf(x / sqrt(2))) / 2.
      auto half = Array(0.5f, a.dtype());
      auto inv_sqrt2 = Array(0.70710678118654752f, a.dtype());
      auto one = Array(1.0f, a.dtype());
      return own(mx::multiply(mx::multiply(a, half), mx::add(one, mx::erf(mx::multiply(a, inv_sqrt2)))));
    }
    case UnaryOp::GeluTanh: {
      // Tanh approximation: x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) / 2.
      auto half = Array(0.5f, a.dtype());
      auto c = Array(0.7978845608028654f, a.dtype());
      auto k = Array(0.044715f, a.dtype());
      auto one = Array(1.0f, a.dtype());
      auto inner = mx::multiply(c, mx::add(a, mx::multiply(k, mx::multiply(a, mx::square(a)))));
      return own(mx::multiply(mx::multiply(a, half), mx::add(one, mx::tanh(inner))));
    }
  }
  throw std::invalid_argument("unknown unary op");
}

std::unique_ptr<Array> binary(BinaryOp op, const Array& a, const Array& b) {
  switch (op) {
    case BinaryOp::Add: return own(mx::add(a, b));
    case BinaryOp::Subtract: return own(mx::subtract(a, b));
    case BinaryOp::Multiply: return own(mx::multiply(a, b));
    case BinaryOp::Divide: return own(mx::divide(a, b));
    case BinaryOp::Remainder: return own(mx::remainder(a, b));
    case BinaryOp::Power: return own(mx::power(a, b));
    case BinaryOp::Maximum: return own(mx::maximum(a, b));
    case BinaryOp::Minimum: return own(mx::minimum(a, b));
    case BinaryOp::Equal: return own(mx::equal(a, b));
    case BinaryOp::NotEqual: return own(mx::not_equal(a, b));
    case BinaryOp::Less: return own(mx::less(a, b));
    case BinaryOp::LessEqual: return own(mx::less_equal(a, b));
    case BinaryOp::Greater: return own(mx::greater(a, b));
    case BinaryOp::GreaterEqual: return own(mx::greater_equal(a, b));
    case BinaryOp::LogicalAnd: return own(mx::logical_and(a, b));
    case BinaryOp::LogicalOr: return own(mx::logical_or(a, b));
    case BinaryOp::Matmul: return own(mx::matmul(a, b));
  }
  throw std::invalid_argument("unknown binary op");
}

std::unique_ptr<Array> reduce(ReduceOp op, const Array& a, rust::Slice<const int32_t> axes, bool keepdims) {
  auto ax = to_ints(axes);
  switch (op) {
    case ReduceOp::Sum: return own(mx::sum(a, ax, keepdims));
    case ReduceOp::Mean: return own(mx::mean(a, ax, keepdims));
    case ReduceOp::Max: return own(mx::max(a, ax, keepdims));
    case ReduceOp::Min: return own(mx::min(a, ax, keepdims));
    case ReduceOp::Prod: return own(mx::prod(a, ax, keepdims));
    case ReduceOp::LogSumExp: return own(mx::logsumexp(a, ax, keepdims));
    case ReduceOp::All: return own(mx::all(a, ax, keepdims));
    case ReduceOp::Any: return own(mx::any(a, ax, keepdims));
  }
  throw std::invalid_argument("unknown reduction");
}

std::unique_ptr<Array> argreduce(bool max, const Array& a, int32_t axis, bool keepdims) {
  return own(max ? mx::argmax(a, axis, keepdims) : mx::argmin(a, axis, keepdims));
}

std::unique_ptr<Array> astype(const Array& a, uint8_t dtype) {
  return own(mx::astype(a, dtype_from_code(dtype)));
}

std::unique_ptr<Array> view_as(const Array& a, uint8_t dtype) {
  return own(mx::view(a, dtype_from_code(dtype)));
}

std::unique_ptr<Array> where_(const Array& cond, const Array& x, const Array& y) {
  return own(mx::where(cond, x, y));
}

std::unique_ptr<Array> clip(const Array& a, const Array& lo, const Array& hi) {
  return own(mx::clip(a, lo, hi));
}

std::unique_ptr<Array> addmm(const Array& c, const Array& a, const Array& b, float alpha, float beta) {
  return own(mx::addmm(c, a, b, alpha, beta));
}

std::unique_ptr<Array> reshape(const Array& a, rust::Slice<const int32_t> shape) {
  return own(mx::reshape(a, to_shape(shape)));
}

std::unique_ptr<Array> transpose(const Array& a, rust::Slice<const int32_t> axes) {
  return own(mx::transpose(a, to_ints(axes)));
}

std::unique_ptr<Array> expand_dims(const Array& a, rust::Slice<const int32_t> axes) {
  return own(mx::expand_dims(a, to_ints(axes)));
}

std::unique_ptr<Array> squeeze(const Array& a, rust::Slice<const int32_t> axes) {
  return own(mx::squeeze(a, to_ints(axes)));
}

std::unique_ptr<Array> broadcast_to(const Array& a, rust::Slice<const int32_t> shape) {
  return own(mx::broadcast_to(a, to_shape(shape)));
}

std::unique_ptr<Array> concatenate(const ArrayList& arrays, int32_t axis) {
  return own(mx::concatenate(arrays.items, axis));
}

std::unique_ptr<Array> stack(const ArrayList& arrays, int32_t axis) {
  return own(mx::stack(arrays.items, axis));
}

std::unique_ptr<ArrayList> split_sections(const Array& a, int32_t sections, int32_t axis) {
  return own_list(mx::split(a, sections, axis));
}

std::unique_ptr<ArrayList> split_at(const Array& a, rust::Slice<const int32_t> indices, int32_t axis) {
  return own_list(mx::split(a, to_shape(indices), axis));
}

std::unique_ptr<Array> contiguous(const Array& a) { return own(mx::contiguous(a, false)); }

std::unique_ptr<Array> slice(
    const Array& a,
    rust::Slice<const int32_t> start,
    rust::Slice<const int32_t> stop,
    rust::Slice<const int32_t> strides) {
  return own(mx::slice(a, to_shape(start), to_shape(stop), to_shape(strides)));
}

std::unique_ptr<Array> slice_dynamic(
    const Array& a,
    const Array& start,
    rust::Slice<const int32_t> axes,
    rust::Slice<const int32_t> sizes) {
  return own(mx::slice(a, start, to_ints(axes), to_shape(sizes)));
}

std::unique_ptr<Array> slice_update(
    const Array& src,
    const Array& update,
    rust::Slice<const int32_t> start,
    rust::Slice<const int32_t> stop,
    rust::Slice<const int32_t> strides) {
  return own(mx::slice_update(src, update, to_shape(start), to_shape(stop), to_shape(strides)));
}

std::unique_ptr<Array> slice_update_dynamic(
    const Array& src,
    const Array& update,
    const Array& start,
    rust::Slice<const int32_t> axes) {
  return own(mx::slice_update(src, update, start, to_ints(axes)));
}

std::unique_ptr<Array> take(const Array& a, const Array& indices, int32_t axis) {
  return own(mx::take(a, indices, axis));
}

std::unique_ptr<Array> take_along_axis(const Array& a, const Array& indices, int32_t axis) {
  return own(mx::take_along_axis(a, indices, axis));
}

std::unique_ptr<Array> put_along_axis(const Array& a, const Array& indices, const Array& values, int32_t axis) {
  return own(mx::put_along_axis(a, indices, values, axis));
}

std::unique_ptr<Array> softmax(const Array& a, rust::Slice<const int32_t> axes, bool precise) {
  return own(mx::softmax(a, to_ints(axes), precise));
}

std::unique_ptr<Array> sort(const Array& a, int32_t axis) { return own(mx::sort(a, axis)); }

std::unique_ptr<Array> argsort(const Array& a, int32_t axis) { return own(mx::argsort(a, axis)); }

std::unique_ptr<Array> argpartition(const Array& a, int32_t kth, int32_t axis) {
  return own(mx::argpartition(a, kth, axis));
}

std::unique_ptr<Array> topk(const Array& a, int32_t k, int32_t axis) {
  return own(mx::topk(a, k, axis));
}

std::unique_ptr<Array> cumsum(const Array& a, int32_t axis, bool reverse, bool inclusive) {
  return own(mx::cumsum(a, axis, reverse, inclusive));
}

std::unique_ptr<Array> random_key(uint64_t seed) { return own(mx::random::key(seed)); }

std::unique_ptr<ArrayList> random_split(const Array& key, int32_t num) {
  auto keys = mx::random::split(key, num);
  std::vector<Array> out;
  for (int i = 0; i < num; ++i) {
    out.push_back(mx::take(keys, i, 0));
  }
  return own_list(std::move(out));
}

std::unique_ptr<Array> random_uniform(rust::Slice<const int32_t> shape, uint8_t dtype, const Array& key) {
  return own(mx::random::uniform(to_shape(shape), dtype_from_code(dtype), key));
}

std::unique_ptr<Array> random_gumbel(rust::Slice<const int32_t> shape, uint8_t dtype, const Array& key) {
  return own(mx::random::gumbel(to_shape(shape), dtype_from_code(dtype), key));
}

std::unique_ptr<Array> random_categorical(const Array& logits, int32_t axis, const Array& key) {
  return own(mx::random::categorical(logits, axis, key));
}

std::unique_ptr<Array> rms_norm(const Array& x, bool has_weight, const Array& weight, float eps) {
  if (auto ours = mlxkit::rms_norm(x, optional(has_weight, weight), eps)) {
    return own(std::move(*ours));
  }
  return own(mx::fast::rms_norm(x, optional(has_weight, weight), eps));
}

std::unique_ptr<Array> layer_norm(
    const Array& x,
    bool has_weight,
    const Array& weight,
    bool has_bias,
    const Array& bias,
    float eps) {
  return own(mx::fast::layer_norm(x, optional(has_weight, weight), optional(has_bias, bias), eps));
}

// Rotary embedding through mlxkit's CPU primitive where it applies, else MLX's op.
std::unique_ptr<Array> rope_any(const Array& x, int32_t dims, bool traditional,
                                std::optional<float> base, float scale, const mx::array& offset,
                                const std::optional<mx::array>& freqs) {
  if (auto ours = mlxkit::rope(x, dims, traditional, base, scale, offset, freqs)) {
    return own(std::move(*ours));
  }
  return own(mx::fast::rope(x, dims, traditional, base, scale, offset, freqs));
}

std::unique_ptr<Array> rope(
    const Array& x,
    int32_t dims,
    bool traditional,
    bool has_base,
    float base,
    float scale,
    int32_t offset,
    bool has_freqs,
    const Array& freqs) {
  std::optional<float> b = has_base ? std::optional<float>(base) : std::nullopt;
  return rope_any(x, dims, traditional, b, scale, mx::array(offset, mx::int32),
                  optional(has_freqs, freqs));
}

std::unique_ptr<Array> rope_offsets(
    const Array& x,
    int32_t dims,
    bool traditional,
    bool has_base,
    float base,
    float scale,
    const Array& offsets,
    bool has_freqs,
    const Array& freqs) {
  std::optional<float> b = has_base ? std::optional<float>(base) : std::nullopt;
  return rope_any(x, dims, traditional, b, scale, offsets, optional(has_freqs, freqs));
}

std::unique_ptr<Array> scaled_dot_product_attention(
    const Array& q,
    const Array& k,
    const Array& v,
    float scale,
    rust::Str mask_mode,
    bool has_mask,
    const Array& mask) {
  return own(mx::fast::scaled_dot_product_attention(
      q, k, v, scale, std::string(mask_mode), optional(has_mask, mask)));
}

std::unique_ptr<ArrayList> quantize(const Array& w, int32_t group_size, int32_t bits, QuantMode mode) {
  return own_list(mx::quantize(w, group_size, bits, mode_name(mode)));
}

std::unique_ptr<Array> dequantize(
    const Array& w,
    const Array& scales,
    bool has_biases,
    const Array& biases,
    int32_t group_size,
    int32_t bits,
    QuantMode mode,
    bool has_dtype,
    uint8_t dtype) {
  std::optional<mx::Dtype> dt = has_dtype ? std::optional<mx::Dtype>(dtype_from_code(dtype)) : std::nullopt;
  return own(mx::dequantize(
      w, scales, optional(has_biases, biases), group_size, bits, mode_name(mode), std::nullopt, dt));
}

std::unique_ptr<Array> quantized_matmul(
    const Array& x,
    const Array& w,
    const Array& scales,
    bool has_biases,
    const Array& biases,
    bool transpose,
    int32_t group_size,
    int32_t bits,
    QuantMode mode,
    int32_t activations) {
  auto b = optional(has_biases, biases);
  if (transpose && mode == QuantMode::Affine) {
    // A negative `activations` asks for the process's setting.
    const auto precision = activations < 0 ? mlxkit::packed_activations()
                                           : static_cast<mlxkit::Activations>(activations);
    if (auto y = packed_matvec(x, w, scales, b, group_size, bits, precision)) {
      return own(std::move(*y));
    }
  }
  return own(mx::quantized_matmul(x, w, scales, b, transpose, group_size, bits, mode_name(mode)));
}

bool packed_matvec_available(int32_t group_size, int32_t bits) {
  return primitive_runs(Primitive::PackedMatvec) && packed_matvec_supports(group_size, bits);
}

bool k_blocks_available(int32_t ggml_type, int64_t out, int64_t in) {
  return mlxkit::k_blocks_supported(ggml_type, out, in);
}

std::unique_ptr<Array> k_blocks_from_affine(const Array& w, const Array& scales,
                                            const Array& biases, int32_t group_size,
                                            int32_t bits) {
  int type = 0;
  if (auto blocks = mlxkit::k_blocks_repack(w, scales, biases, group_size, bits, type)) {
    return own(std::move(*blocks));
  }
  return nullptr;
}

std::unique_ptr<Array> k_blocks_matmul(const Array& x, const Array& w, int32_t ggml_type,
                                       int64_t out, int64_t in, int32_t activations) {
  return own(mlxkit::k_blocks_product(x, w, ggml_type, out, in, activations == 1));
}

std::unique_ptr<Array> k_blocks_rows(const Array& w, const Array& ids, int32_t ggml_type,
                                     int64_t out, int64_t in) {
  return own(mlxkit::k_blocks_lookup(w, ids, ggml_type, out, in));
}

int32_t packed_matvec_rows() {
  return packed_matvec_max_rows();
}

int32_t packed_matvec_activations() {
  return static_cast<int32_t>(mlxkit::packed_activations());
}

void set_packed_matvec_activations(int32_t activations) {
  mlxkit::set_packed_activations(activations == 1 ? mlxkit::Activations::Int8
                                                  : mlxkit::Activations::F32);
}

int32_t cpu_threads() {
  return mlxkit::pool_threads();
}

int32_t set_cpu_threads(int32_t threads) {
  return mlxkit::set_pool_threads(threads);
}

rust::Vec<rust::String> cpu_primitive_paths() {
  rust::Vec<rust::String> lines;
  for (int i = 0; i < kPrimitiveCount; ++i) {
    const auto primitive = static_cast<Primitive>(i);
    lines.push_back(rust::String(std::string(kPrimitives[i].name) + "\t" +
                                 primitive_path(primitive)));
  }
  return lines;
}

int32_t cpu_kernel_level() {
  return mlxkit::kernel_level();
}

int32_t set_cpu_kernel_level(int32_t level) {
  return mlxkit::set_kernel_level(level);
}

std::unique_ptr<Array> gated_activation(uint8_t kind, const Array& gate, const Array& up) {
  if (kind > 1) {
    throw std::invalid_argument("gated activation: unknown kind");
  }
  return own_if(mlxkit::gated_activation(kind == 0 ? Gate::Silu : Gate::GeluTanh, gate, up));
}

std::unique_ptr<Array> softmax_last_axis(const Array& x) {
  return own_if(mlxkit::last_axis_softmax(x));
}

std::unique_ptr<ArrayList> gated_delta_scan(const Array& q, const Array& k, const Array& v,
                                            const Array& g, const Array& beta,
                                            const Array& state) {
  auto scanned = mlxkit::scan_gated_delta(q, k, v, g, beta, state);
  if (!scanned) {
    return nullptr;
  }
  return own_list({std::move(scanned->first), std::move(scanned->second)});
}

std::unique_ptr<ArrayList> append_rows(const Array& keys, const Array& values,
                                       const ArrayList& key_buffers,
                                       const ArrayList& value_buffers,
                                       rust::Slice<const int32_t> offsets,
                                       rust::Slice<const int32_t> lengths) {
  auto appended = mlxkit::append_rows(keys, values, key_buffers.items, value_buffers.items,
                                      std::vector<int>(offsets.begin(), offsets.end()),
                                      std::vector<int>(lengths.begin(), lengths.end()));
  if (!appended) {
    return nullptr;
  }
  std::vector<Array> all;
  for (auto* list : {&appended->key_buffers, &appended->value_buffers,
                     &appended->key_history, &appended->value_history}) {
    all.insert(all.end(), list->begin(), list->end());
  }
  return own_list(std::move(all));
}

std::unique_ptr<ArrayList> ssd_scan(const Array& x, const Array& dt, const Array& a,
                                    const Array& b, const Array& c, const Array& state) {
  auto scanned = mlxkit::scan_ssd(x, dt, a, b, c, state);
  if (!scanned) {
    return nullptr;
  }
  return own_list({std::move(scanned->first), std::move(scanned->second)});
}

std::unique_ptr<Array> rows_attention(
    const Array& queries,
    const ArrayList& keys,
    const ArrayList& values,
    rust::Slice<const bool> causal,
    rust::Slice<const bool> masked,
    const ArrayList& masks,
    float scale,
    bool has_softcap,
    float softcap) {
  // One optional mask per row: `masks` holds those of the rows `masked` marks, in order.
  std::vector<std::optional<mx::array>> row_masks;
  size_t next = 0;
  for (bool has : masked) {
    if (!has) {
      row_masks.emplace_back(std::nullopt);
    } else if (next < masks.items.size()) {
      row_masks.emplace_back(masks.items[next++]);
    } else {
      break;
    }
  }
  if (row_masks.size() != masked.size() || next != masks.items.size()) {
    throw std::invalid_argument("rows attention: masks do not match the rows marked masked");
  }
  return own_if(mlxkit::rows_attention(
      queries, keys.items, values.items, std::vector<bool>(causal.begin(), causal.end()),
      row_masks, scale, has_softcap ? std::optional<float>(softcap) : std::nullopt));
}

std::unique_ptr<Array> gather_qmm(
    const Array& x,
    const Array& w,
    const Array& scales,
    bool has_biases,
    const Array& biases,
    bool has_lhs_indices,
    const Array& lhs_indices,
    bool has_rhs_indices,
    const Array& rhs_indices,
    bool transpose,
    int32_t group_size,
    int32_t bits,
    QuantMode mode,
    bool sorted_indices) {
  return own(mx::gather_qmm(
      x,
      w,
      scales,
      optional(has_biases, biases),
      optional(has_lhs_indices, lhs_indices),
      optional(has_rhs_indices, rhs_indices),
      transpose,
      group_size,
      bits,
      mode_name(mode),
      std::nullopt,
      sorted_indices));
}

std::unique_ptr<Array> gather_mm(
    const Array& a,
    const Array& b,
    bool has_lhs_indices,
    const Array& lhs_indices,
    bool has_rhs_indices,
    const Array& rhs_indices,
    bool sorted_indices) {
  return own(mx::gather_mm(
      a, b, optional(has_lhs_indices, lhs_indices), optional(has_rhs_indices, rhs_indices), sorted_indices));
}

std::unique_ptr<Array> conv1d(
    const Array& input,
    const Array& weight,
    int32_t stride,
    int32_t padding,
    int32_t dilation,
    int32_t groups) {
  return own(mx::conv1d(input, weight, stride, padding, dilation, groups));
}

std::unique_ptr<Compiled> compile(rust::Box<RustClosure> closure, bool shapeless) {
  // std::function must be copyable; rust::Box is not, so the closure is shared.
  auto shared = std::make_shared<rust::Box<RustClosure>>(std::move(closure));
  auto fun = [shared](const std::vector<Array>& inputs) -> std::vector<Array> {
    ArrayList in;
    in.items = inputs;
    // Throws rust::Error when the closure returns an error or panics; MLX passes it through.
    auto out = call_rust_closure(**shared, in);
    return std::move(out->items);
  };
  auto compiled = std::make_unique<Compiled>();
  compiled->fun = mx::compile(std::move(fun), shapeless);
  return compiled;
}

std::unique_ptr<ArrayList> compiled_call(const Compiled& compiled, const ArrayList& inputs) {
  return own_list(compiled.fun(inputs.items));
}

size_t active_memory() { return mx::get_active_memory(); }

size_t peak_memory() { return mx::get_peak_memory(); }

void reset_peak_memory() { mx::reset_peak_memory(); }

size_t cache_memory() { return mx::get_cache_memory(); }

void clear_cache() { mx::clear_cache(); }

size_t set_memory_limit(size_t limit) { return mx::set_memory_limit(limit); }

size_t set_cache_limit(size_t limit) { return mx::set_cache_limit(limit); }

void load_safetensors(rust::Str path, rust::Vec<rust::String>& names, ArrayList& arrays) {
  auto loaded = mx::load_safetensors(std::string(path));
  for (auto& [name, array] : loaded.first) {
    names.push_back(rust::String(name));
    arrays.items.push_back(array);
  }
}

}  // namespace mlxkit
