// The C++ side of mlx-sys: thin wrappers over MLX's C++ API in shapes cxx can bind.
//
// Every function may throw (MLX reports errors as C++ exceptions); the bridge declares each of
// them as returning `Result`, so cxx turns the exception into a Rust error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "mlx/mlx.h"
#include "distributed.h"
#include "rust/cxx.h"

namespace mlxkit {

using Array = mlx::core::array;

// An owned list of arrays, for ops that take or return several.
struct ArrayList {
  std::vector<Array> items;
};

// A function compiled by MLX from a Rust closure.
struct Compiled {
  std::function<std::vector<Array>(const std::vector<Array>&)> fun;
};

struct RustClosure;
enum class UnaryOp : uint8_t;
enum class BinaryOp : uint8_t;
enum class ReduceOp : uint8_t;
enum class QuantMode : uint8_t;

// Version and devices.
rust::String version();
bool blas_gemv_forwarding();
// The BLAS MLX's f32 matmuls reach, with OpenBLAS's build configuration when linked.
rust::String blas_name();
bool blas_is_reference();
// OpenBLAS calls run on the shim's BLAS threads (blas_threads.cc).
std::uint64_t blas_parallel_calls();
bool metal_is_available();
bool cuda_is_available();
void set_default_device(bool gpu);
bool default_device_is_gpu();
int32_t new_stream(bool gpu);
void set_default_stream(int32_t index, bool gpu);
void synchronize();

// Lists.
std::unique_ptr<ArrayList> list_new();
void list_push(ArrayList& list, const Array& a);
size_t list_len(const ArrayList& list);
std::unique_ptr<Array> list_get(const ArrayList& list, size_t index);

// Construction and inspection.
std::unique_ptr<Array> array_from_bytes(
    rust::Slice<const uint8_t> data,
    rust::Slice<const int32_t> shape,
    uint8_t dtype);
std::unique_ptr<Array> array_scalar_f32(float value, uint8_t dtype);
std::unique_ptr<Array> array_scalar_i32(int32_t value, uint8_t dtype);
std::unique_ptr<Array> array_clone(const Array& a);
rust::Vec<int32_t> array_shape(const Array& a);
uint8_t array_dtype(const Array& a);
size_t array_size(const Array& a);
size_t array_nbytes(const Array& a);
void array_read_bytes(const Array& a, rust::Slice<uint8_t> out);
rust::String array_to_string(const Array& a);
std::unique_ptr<Array> zeros(rust::Slice<const int32_t> shape, uint8_t dtype);
std::unique_ptr<Array> ones(rust::Slice<const int32_t> shape, uint8_t dtype);
std::unique_ptr<Array> full(rust::Slice<const int32_t> shape, const Array& value, uint8_t dtype);
std::unique_ptr<Array> arange(double start, double stop, double step, uint8_t dtype);

// Evaluation.
void eval(const ArrayList& list);
void async_eval(const ArrayList& list);

// Elementwise, matmul and reductions.
std::unique_ptr<Array> unary(UnaryOp op, const Array& a);
std::unique_ptr<Array> binary(BinaryOp op, const Array& a, const Array& b);
std::unique_ptr<Array> reduce(ReduceOp op, const Array& a, rust::Slice<const int32_t> axes, bool keepdims);
std::unique_ptr<Array> argreduce(bool max, const Array& a, int32_t axis, bool keepdims);
std::unique_ptr<Array> astype(const Array& a, uint8_t dtype);
std::unique_ptr<Array> view_as(const Array& a, uint8_t dtype);
std::unique_ptr<Array> where_(const Array& cond, const Array& x, const Array& y);
std::unique_ptr<Array> clip(const Array& a, const Array& lo, const Array& hi);
std::unique_ptr<Array> addmm(const Array& c, const Array& a, const Array& b, float alpha, float beta);

// Shapes.
std::unique_ptr<Array> reshape(const Array& a, rust::Slice<const int32_t> shape);
std::unique_ptr<Array> transpose(const Array& a, rust::Slice<const int32_t> axes);
std::unique_ptr<Array> expand_dims(const Array& a, rust::Slice<const int32_t> axes);
std::unique_ptr<Array> squeeze(const Array& a, rust::Slice<const int32_t> axes);
std::unique_ptr<Array> broadcast_to(const Array& a, rust::Slice<const int32_t> shape);
std::unique_ptr<Array> concatenate(const ArrayList& arrays, int32_t axis);
std::unique_ptr<Array> stack(const ArrayList& arrays, int32_t axis);
std::unique_ptr<ArrayList> split_sections(const Array& a, int32_t sections, int32_t axis);
std::unique_ptr<ArrayList> split_at(const Array& a, rust::Slice<const int32_t> indices, int32_t axis);
std::unique_ptr<Array> contiguous(const Array& a);

// Indexing.
std::unique_ptr<Array> slice(
    const Array& a,
    rust::Slice<const int32_t> start,
    rust::Slice<const int32_t> stop,
    rust::Slice<const int32_t> strides);
std::unique_ptr<Array> slice_dynamic(
    const Array& a,
    const Array& start,
    rust::Slice<const int32_t> axes,
    rust::Slice<const int32_t> sizes);
std::unique_ptr<Array> slice_update(
    const Array& src,
    const Array& update,
    rust::Slice<const int32_t> start,
    rust::Slice<const int32_t> stop,
    rust::Slice<const int32_t> strides);
std::unique_ptr<Array> slice_update_dynamic(
    const Array& src,
    const Array& update,
    const Array& start,
    rust::Slice<const int32_t> axes);
std::unique_ptr<Array> take(const Array& a, const Array& indices, int32_t axis);
std::unique_ptr<Array> take_along_axis(const Array& a, const Array& indices, int32_t axis);
std::unique_ptr<Array> put_along_axis(const Array& a, const Array& indices, const Array& values, int32_t axis);

// Softmax, sorting and scans.
std::unique_ptr<Array> softmax(const Array& a, rust::Slice<const int32_t> axes, bool precise);
std::unique_ptr<Array> sort(const Array& a, int32_t axis);
std::unique_ptr<Array> argsort(const Array& a, int32_t axis);
std::unique_ptr<Array> argpartition(const Array& a, int32_t kth, int32_t axis);
std::unique_ptr<Array> topk(const Array& a, int32_t k, int32_t axis);
std::unique_ptr<Array> cumsum(const Array& a, int32_t axis, bool reverse, bool inclusive);

// Random numbers.
std::unique_ptr<Array> random_key(uint64_t seed);
std::unique_ptr<ArrayList> random_split(const Array& key, int32_t num);
std::unique_ptr<Array> random_uniform(rust::Slice<const int32_t> shape, uint8_t dtype, const Array& key);
std::unique_ptr<Array> random_gumbel(rust::Slice<const int32_t> shape, uint8_t dtype, const Array& key);
std::unique_ptr<Array> random_categorical(const Array& logits, int32_t axis, const Array& key);

// Fused kernels.
std::unique_ptr<Array> rms_norm(const Array& x, bool has_weight, const Array& weight, float eps);
std::unique_ptr<Array> layer_norm(
    const Array& x,
    bool has_weight,
    const Array& weight,
    bool has_bias,
    const Array& bias,
    float eps);
std::unique_ptr<Array> rope(
    const Array& x,
    int32_t dims,
    bool traditional,
    bool has_base,
    float base,
    float scale,
    int32_t offset,
    bool has_freqs,
    const Array& freqs);
std::unique_ptr<Array> rope_offsets(
    const Array& x,
    int32_t dims,
    bool traditional,
    bool has_base,
    float base,
    float scale,
    const Array& offsets,
    bool has_freqs,
    const Array& freqs);
std::unique_ptr<Array> scaled_dot_product_attention(
    const Array& q,
    const Array& k,
    const Array& v,
    float scale,
    rust::Str mask_mode,
    bool has_mask,
    const Array& mask);

// Quantization and gathered matmuls.
std::unique_ptr<ArrayList> quantize(const Array& w, int32_t group_size, int32_t bits, QuantMode mode);
std::unique_ptr<Array> dequantize(
    const Array& w,
    const Array& scales,
    bool has_biases,
    const Array& biases,
    int32_t group_size,
    int32_t bits,
    QuantMode mode,
    bool has_dtype,
    uint8_t dtype);
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
    int32_t activations);
bool packed_matvec_available(int32_t group_size, int32_t bits);
bool k_blocks_available(int32_t ggml_type, int64_t out, int64_t in);
std::unique_ptr<Array> k_blocks_from_affine(const Array& w, const Array& scales,
                                            const Array& biases, int32_t group_size,
                                            int32_t bits);
// `activations`: 0 f32, 1 rounded to signed bytes (kblocks_int8.cc).
std::unique_ptr<Array> k_blocks_matmul(const Array& x, const Array& w, int32_t ggml_type,
                                       int64_t out, int64_t in, int32_t activations);
std::unique_ptr<Array> k_blocks_rows(const Array& w, const Array& ids, int32_t ggml_type,
                                     int64_t out, int64_t in);
int32_t packed_matvec_rows();
// 0: f32, 1: int8 (see qmv.h).
int32_t packed_matvec_activations();
void set_packed_matvec_activations(int32_t activations);
int32_t cpu_threads();
int32_t set_cpu_threads(int32_t threads);
bool cpu_primitives_enabled();
bool set_cpu_primitives(bool enabled);
rust::Vec<rust::String> cpu_primitive_paths();
int32_t cpu_kernel_level();
int32_t set_cpu_kernel_level(int32_t level);
// `act(gate) · up` (0 SiLU, 1 GELU tanh); null when the CPU kernel does not apply (see gated.h).
std::unique_ptr<Array> gated_activation(uint8_t kind, const Array& gate, const Array& up);
std::unique_ptr<Array> softmax_last_axis(const Array& x);
// Null when the rows attention kernel does not apply (see attend.h).
// The gated delta rule's scan: a list of [outputs, final state]; null when the CPU kernel
// does not apply (see delta.h).
std::unique_ptr<ArrayList> gated_delta_scan(const Array& q, const Array& k, const Array& v,
                                            const Array& g, const Array& beta,
                                            const Array& state);

// The Mamba-2 scan: a list of [outputs, final state]; null when the CPU kernel does not apply
// (see ssd.h).
std::unique_ptr<ArrayList> ssd_scan(const Array& x, const Array& dt, const Array& a,
                                    const Array& b, const Array& c, const Array& state);

// Each row's new keys and values written into its own cache buffers, one node for the batch:
// `[key buffers, value buffers, key histories, value histories]`, null when the CPU kernel does
// not apply (see append.h).
std::unique_ptr<ArrayList> append_rows(const Array& keys, const Array& values,
                                       const ArrayList& key_buffers,
                                       const ArrayList& value_buffers,
                                       rust::Slice<const int32_t> offsets,
                                       rust::Slice<const int32_t> lengths);

std::unique_ptr<Array> rows_attention(
    const Array& queries,
    const ArrayList& keys,
    const ArrayList& values,
    rust::Slice<const bool> causal,
    rust::Slice<const bool> masked,
    const ArrayList& masks,
    float scale,
    bool has_softcap,
    float softcap);
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
    bool sorted_indices);
std::unique_ptr<Array> gather_mm(
    const Array& a,
    const Array& b,
    bool has_lhs_indices,
    const Array& lhs_indices,
    bool has_rhs_indices,
    const Array& rhs_indices,
    bool sorted_indices);
std::unique_ptr<Array> conv1d(
    const Array& input,
    const Array& weight,
    int32_t stride,
    int32_t padding,
    int32_t dilation,
    int32_t groups);

// Compilation of Rust closures.
std::unique_ptr<Compiled> compile(rust::Box<RustClosure> closure, bool shapeless);
std::unique_ptr<ArrayList> compiled_call(const Compiled& compiled, const ArrayList& inputs);

// Memory.
size_t active_memory();
size_t peak_memory();
void reset_peak_memory();
size_t cache_memory();
void clear_cache();
size_t set_memory_limit(size_t limit);
size_t set_cache_limit(size_t limit);

// Files.
void load_safetensors(rust::Str path, rust::Vec<rust::String>& names, ArrayList& arrays);

}  // namespace mlxkit
