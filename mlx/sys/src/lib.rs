//! Raw bindings to MLX through a C++ shim.
//!
//! This is the only crate of mlxkit with `unsafe` FFI. `build.rs` finds or installs MLX (see
//! its docs for the order), compiles `shim/shim.cc` with `cxx-build`, links `libmlx` and
//! publishes, as `links = "mlx"` metadata, what dependents need to start without
//! `LD_LIBRARY_PATH`:
//!
//! - `DEP_MLX_LIB_DIR`: the folder holding `libmlx`;
//! - `DEP_MLX_LINK_ARGS`: link arguments (an rpath to that folder, and OpenBLAS ahead of the
//!   wheel's reference BLAS on Linux: the system's, else `scipy-openblas32` installed from
//!   PyPI into the cache), separated by `\u{1f}`.
//!
//! The shim also holds CPU fast paths MLX lacks: `shim/gemv.cc` sends single-row f32 matmuls to
//! BLAS `sgemv` (when OpenBLAS is linked); `shim/qmv.cc` multiplies decode rows by packed 4- and
//! 8-bit affine weights without dequantizing them, and `shim/kblocks.cc` GGUF Q4_K and Q6_K
//! matrices kept in bands of their own blocks; `shim/attend.cc` attends each row's queries
//! over its own history in one op; `shim/gated.cc` computes gated activations and
//! `shim/softmax.cc` softmax with the vectorized `exp` of `shim/vexp.h`. The x86 kernels are chosen at run time (`shim/x86.h`),
//! with portable fallbacks. The packed matvec and the rows attention split their work over
//! `shim/pool.cc`'s helper threads, because MLX runs a CPU stream's ops on one thread.
//!
//! A crate whose binaries or tests link MLX forwards them in a three-line `build.rs`:
//!
//! ```ignore
//! fn main() {
//!     for arg in std::env::var("DEP_MLX_LINK_ARGS").unwrap_or_default().split('\u{1f}') {
//!         println!("cargo:rustc-link-arg={arg}");
//!     }
//! }
//! ```
//!
//! Every bridge function returns `Result`: MLX reports errors as C++ exceptions, and cxx turns
//! them into [`cxx::Exception`]s instead of aborting. Use the safe `mlx` crate rather than this
//! one.
#![allow(unsafe_code)]

pub use cxx::{Exception, UniquePtr};

/// A Rust closure that MLX's `compile` traces. It receives the inputs and returns the outputs,
/// or an error message (which MLX sees as a C++ exception).
pub struct RustClosure(
    #[allow(clippy::type_complexity)]
    pub  Box<dyn Fn(&ffi::ArrayList) -> Result<cxx::UniquePtr<ffi::ArrayList>, String>>,
);

/// Called by the shim each time MLX traces a compiled function. A panic is caught here: it must
/// not unwind into C++.
fn call_rust_closure(
    closure: &RustClosure,
    inputs: &ffi::ArrayList,
) -> Result<cxx::UniquePtr<ffi::ArrayList>, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (closure.0)(inputs))) {
        Ok(result) => result,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_string());
            Err(format!("compiled closure panicked: {message}"))
        }
    }
}

// SAFETY: an MLX array is a reference-counted handle with an atomic count; moving one to another
// thread is sound. Using it from two threads at once is not, hence no `Sync`. mlxkit keeps all
// MLX work on one worker thread (`mlx-thread`).
unsafe impl Send for ffi::Array {}
// SAFETY: as for `Array`: a vector of handles that is moved, not shared.
unsafe impl Send for ffi::ArrayList {}
// SAFETY: a group is a shared handle on MLX's backend state, which its collectives use from the
// thread that evaluates them; it is moved to that thread, not shared.
unsafe impl Send for ffi::Group {}

#[cxx::bridge(namespace = "mlxkit")]
pub mod ffi {
    /// Elementwise ops of one operand.
    #[repr(u8)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum UnaryOp {
        Negative,
        Abs,
        Exp,
        Log,
        Log1p,
        Sqrt,
        Rsqrt,
        Square,
        Reciprocal,
        Sin,
        Cos,
        Tanh,
        Sigmoid,
        Erf,
        Floor,
        Ceil,
        LogicalNot,
        IsNan,
        StopGradient,
        Silu,
        Gelu,
        GeluTanh,
    }

    /// Elementwise ops of two broadcast operands, and matmul.
    #[repr(u8)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum BinaryOp {
        Add,
        Subtract,
        Multiply,
        Divide,
        Remainder,
        Power,
        Maximum,
        Minimum,
        Equal,
        NotEqual,
        Less,
        LessEqual,
        Greater,
        GreaterEqual,
        LogicalAnd,
        LogicalOr,
        Matmul,
    }

    /// Reductions over a set of axes.
    #[repr(u8)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum ReduceOp {
        Sum,
        Mean,
        Max,
        Min,
        Prod,
        LogSumExp,
        All,
        Any,
    }

    /// MLX quantization modes.
    #[repr(u8)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum QuantMode {
        Affine,
        Mxfp4,
        Mxfp8,
        Nvfp4,
    }

    extern "Rust" {
        type RustClosure;
        fn call_rust_closure(
            closure: &RustClosure,
            inputs: &ArrayList,
        ) -> Result<UniquePtr<ArrayList>>;
    }

    unsafe extern "C++" {
        include!("shim.h");

        type Array;
        type ArrayList;
        type Compiled;
        /// A group of processes MLX's distributed backend formed (`shim/distributed.h`).
        type Group;

        fn version() -> Result<String>;
        /// Whether single-row f32 matmuls go to BLAS `sgemv` (see `shim/gemv.cc`).
        fn blas_gemv_forwarding() -> bool;
        /// The BLAS MLX's f32 matmuls reach (`shim/gemv.cc`), with OpenBLAS's configuration.
        fn blas_name() -> String;
        /// OpenBLAS calls whose jobs ran on the shim's BLAS threads (`shim/blas_threads.cc`).
        fn blas_parallel_calls() -> u64;
        /// Whether a Linux CPU build fell back to the MLX wheel's reference BLAS.
        fn blas_is_reference() -> bool;
        fn metal_is_available() -> Result<bool>;
        fn cuda_is_available() -> Result<bool>;
        fn set_default_device(gpu: bool) -> Result<()>;
        fn default_device_is_gpu() -> Result<bool>;
        fn new_stream(gpu: bool) -> Result<i32>;
        fn set_default_stream(index: i32, gpu: bool) -> Result<()>;
        fn synchronize() -> Result<()>;

        fn list_new() -> Result<UniquePtr<ArrayList>>;
        fn list_push(list: Pin<&mut ArrayList>, a: &Array) -> Result<()>;
        fn list_len(list: &ArrayList) -> Result<usize>;
        fn list_get(list: &ArrayList, index: usize) -> Result<UniquePtr<Array>>;

        fn array_from_bytes(data: &[u8], shape: &[i32], dtype: u8) -> Result<UniquePtr<Array>>;
        fn array_scalar_f32(value: f32, dtype: u8) -> Result<UniquePtr<Array>>;
        fn array_scalar_i32(value: i32, dtype: u8) -> Result<UniquePtr<Array>>;
        fn array_clone(a: &Array) -> Result<UniquePtr<Array>>;
        fn array_shape(a: &Array) -> Result<Vec<i32>>;
        fn array_dtype(a: &Array) -> Result<u8>;
        fn array_size(a: &Array) -> Result<usize>;
        fn array_nbytes(a: &Array) -> Result<usize>;
        fn array_read_bytes(a: &Array, out: &mut [u8]) -> Result<()>;
        fn array_to_string(a: &Array) -> Result<String>;
        fn zeros(shape: &[i32], dtype: u8) -> Result<UniquePtr<Array>>;
        fn ones(shape: &[i32], dtype: u8) -> Result<UniquePtr<Array>>;
        fn full(shape: &[i32], value: &Array, dtype: u8) -> Result<UniquePtr<Array>>;
        fn arange(start: f64, stop: f64, step: f64, dtype: u8) -> Result<UniquePtr<Array>>;

        fn eval(list: &ArrayList) -> Result<()>;
        fn async_eval(list: &ArrayList) -> Result<()>;

        fn unary(op: UnaryOp, a: &Array) -> Result<UniquePtr<Array>>;
        fn binary(op: BinaryOp, a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn reduce(
            op: ReduceOp,
            a: &Array,
            axes: &[i32],
            keepdims: bool,
        ) -> Result<UniquePtr<Array>>;
        fn argreduce(max: bool, a: &Array, axis: i32, keepdims: bool) -> Result<UniquePtr<Array>>;
        fn astype(a: &Array, dtype: u8) -> Result<UniquePtr<Array>>;
        fn view_as(a: &Array, dtype: u8) -> Result<UniquePtr<Array>>;
        fn where_(cond: &Array, x: &Array, y: &Array) -> Result<UniquePtr<Array>>;
        fn clip(a: &Array, lo: &Array, hi: &Array) -> Result<UniquePtr<Array>>;
        fn addmm(
            c: &Array,
            a: &Array,
            b: &Array,
            alpha: f32,
            beta: f32,
        ) -> Result<UniquePtr<Array>>;

        fn reshape(a: &Array, shape: &[i32]) -> Result<UniquePtr<Array>>;
        fn transpose(a: &Array, axes: &[i32]) -> Result<UniquePtr<Array>>;
        fn expand_dims(a: &Array, axes: &[i32]) -> Result<UniquePtr<Array>>;
        fn squeeze(a: &Array, axes: &[i32]) -> Result<UniquePtr<Array>>;
        fn broadcast_to(a: &Array, shape: &[i32]) -> Result<UniquePtr<Array>>;
        fn concatenate(arrays: &ArrayList, axis: i32) -> Result<UniquePtr<Array>>;
        fn stack(arrays: &ArrayList, axis: i32) -> Result<UniquePtr<Array>>;
        fn split_sections(a: &Array, sections: i32, axis: i32) -> Result<UniquePtr<ArrayList>>;
        fn split_at(a: &Array, indices: &[i32], axis: i32) -> Result<UniquePtr<ArrayList>>;
        fn contiguous(a: &Array) -> Result<UniquePtr<Array>>;

        fn slice(
            a: &Array,
            start: &[i32],
            stop: &[i32],
            strides: &[i32],
        ) -> Result<UniquePtr<Array>>;
        fn slice_dynamic(
            a: &Array,
            start: &Array,
            axes: &[i32],
            sizes: &[i32],
        ) -> Result<UniquePtr<Array>>;
        fn slice_update(
            src: &Array,
            update: &Array,
            start: &[i32],
            stop: &[i32],
            strides: &[i32],
        ) -> Result<UniquePtr<Array>>;
        fn slice_update_dynamic(
            src: &Array,
            update: &Array,
            start: &Array,
            axes: &[i32],
        ) -> Result<UniquePtr<Array>>;
        fn take(a: &Array, indices: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn take_along_axis(a: &Array, indices: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn put_along_axis(
            a: &Array,
            indices: &Array,
            values: &Array,
            axis: i32,
        ) -> Result<UniquePtr<Array>>;

        fn softmax(a: &Array, axes: &[i32], precise: bool) -> Result<UniquePtr<Array>>;
        fn sort(a: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn argsort(a: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn argpartition(a: &Array, kth: i32, axis: i32) -> Result<UniquePtr<Array>>;
        fn topk(a: &Array, k: i32, axis: i32) -> Result<UniquePtr<Array>>;
        fn cumsum(a: &Array, axis: i32, reverse: bool, inclusive: bool)
        -> Result<UniquePtr<Array>>;

        fn random_key(seed: u64) -> Result<UniquePtr<Array>>;
        fn random_split(key: &Array, num: i32) -> Result<UniquePtr<ArrayList>>;
        fn random_uniform(shape: &[i32], dtype: u8, key: &Array) -> Result<UniquePtr<Array>>;
        fn random_gumbel(shape: &[i32], dtype: u8, key: &Array) -> Result<UniquePtr<Array>>;
        fn random_categorical(logits: &Array, axis: i32, key: &Array) -> Result<UniquePtr<Array>>;

        fn rms_norm(
            x: &Array,
            has_weight: bool,
            weight: &Array,
            eps: f32,
        ) -> Result<UniquePtr<Array>>;
        fn layer_norm(
            x: &Array,
            has_weight: bool,
            weight: &Array,
            has_bias: bool,
            bias: &Array,
            eps: f32,
        ) -> Result<UniquePtr<Array>>;
        #[allow(clippy::too_many_arguments)]
        fn rope(
            x: &Array,
            dims: i32,
            traditional: bool,
            has_base: bool,
            base: f32,
            scale: f32,
            offset: i32,
            has_freqs: bool,
            freqs: &Array,
        ) -> Result<UniquePtr<Array>>;
        #[allow(clippy::too_many_arguments)]
        fn rope_offsets(
            x: &Array,
            dims: i32,
            traditional: bool,
            has_base: bool,
            base: f32,
            scale: f32,
            offsets: &Array,
            has_freqs: bool,
            freqs: &Array,
        ) -> Result<UniquePtr<Array>>;
        fn scaled_dot_product_attention(
            q: &Array,
            k: &Array,
            v: &Array,
            scale: f32,
            mask_mode: &str,
            has_mask: bool,
            mask: &Array,
        ) -> Result<UniquePtr<Array>>;

        fn quantize(
            w: &Array,
            group_size: i32,
            bits: i32,
            mode: QuantMode,
        ) -> Result<UniquePtr<ArrayList>>;
        #[allow(clippy::too_many_arguments)]
        fn dequantize(
            w: &Array,
            scales: &Array,
            has_biases: bool,
            biases: &Array,
            group_size: i32,
            bits: i32,
            mode: QuantMode,
            has_dtype: bool,
            dtype: u8,
        ) -> Result<UniquePtr<Array>>;
        #[allow(clippy::too_many_arguments)]
        fn quantized_matmul(
            x: &Array,
            w: &Array,
            scales: &Array,
            has_biases: bool,
            biases: &Array,
            transpose: bool,
            group_size: i32,
            bits: i32,
            mode: QuantMode,
            activations: i32,
        ) -> Result<UniquePtr<Array>>;
        fn packed_matvec_available(group_size: i32, bits: i32) -> bool;
        /// Whether a `[out, in]` matrix of this GGML k-quant type takes the k-block form
        /// (`shim/kblocks.cc`) here.
        fn k_blocks_available(ggml_type: i32, out: i64, in_: i64) -> bool;
        /// Null when the matrix's values are not a k-quant's (4-bit groups of 32: Q4_K;
        /// 8-bit groups of 16: Q6_K).
        fn k_blocks_from_affine(
            w: &Array,
            scales: &Array,
            biases: &Array,
            group_size: i32,
            bits: i32,
        ) -> Result<UniquePtr<Array>>;
        fn k_blocks_matmul(
            x: &Array,
            w: &Array,
            ggml_type: i32,
            out: i64,
            in_: i64,
            activations: i32,
        ) -> Result<UniquePtr<Array>>;
        fn k_blocks_rows(
            w: &Array,
            ids: &Array,
            ggml_type: i32,
            out: i64,
            in_: i64,
        ) -> Result<UniquePtr<Array>>;
        fn packed_matvec_rows() -> i32;
        /// 0: f32, 1: int8.
        fn packed_matvec_activations() -> i32;
        fn set_packed_matvec_activations(activations: i32);
        fn cpu_threads() -> i32;
        fn set_cpu_threads(threads: i32) -> i32;
        fn cpu_primitives_enabled() -> bool;
        fn set_cpu_primitives(enabled: bool) -> bool;
        /// One line per custom CPU primitive: its name, a tab, what it runs on this machine.
        fn cpu_primitive_paths() -> Vec<String>;
        fn cpu_kernel_level() -> i32;
        fn set_cpu_kernel_level(level: i32) -> i32;
        /// Null when the CPU kernel does not apply.
        fn gated_activation(kind: u8, gate: &Array, up: &Array) -> Result<UniquePtr<Array>>;
        /// Null when the CPU kernel does not apply.
        fn softmax_last_axis(x: &Array) -> Result<UniquePtr<Array>>;
        /// `[outputs, final state]`; null when the CPU kernel does not apply.
        fn gated_delta_scan(
            q: &Array,
            k: &Array,
            v: &Array,
            g: &Array,
            beta: &Array,
            state: &Array,
        ) -> Result<UniquePtr<ArrayList>>;
        /// `[outputs, final state]`; null when the CPU kernel does not apply.
        fn ssd_scan(
            x: &Array,
            dt: &Array,
            a: &Array,
            b: &Array,
            c: &Array,
            state: &Array,
        ) -> Result<UniquePtr<ArrayList>>;
        /// `[key buffers, value buffers, key histories, value histories]`, a row each; null
        /// when the CPU kernel does not apply.
        fn append_rows(
            keys: &Array,
            values: &Array,
            key_buffers: &ArrayList,
            value_buffers: &ArrayList,
            offsets: &[i32],
            lengths: &[i32],
        ) -> Result<UniquePtr<ArrayList>>;
        /// Null when the rows attention kernel does not apply.
        #[allow(clippy::too_many_arguments)]
        fn rows_attention(
            queries: &Array,
            keys: &ArrayList,
            values: &ArrayList,
            causal: &[bool],
            masked: &[bool],
            masks: &ArrayList,
            scale: f32,
            has_softcap: bool,
            softcap: f32,
        ) -> Result<UniquePtr<Array>>;
        #[allow(clippy::too_many_arguments)]
        fn gather_qmm(
            x: &Array,
            w: &Array,
            scales: &Array,
            has_biases: bool,
            biases: &Array,
            has_lhs_indices: bool,
            lhs_indices: &Array,
            has_rhs_indices: bool,
            rhs_indices: &Array,
            transpose: bool,
            group_size: i32,
            bits: i32,
            mode: QuantMode,
            sorted_indices: bool,
        ) -> Result<UniquePtr<Array>>;
        fn gather_mm(
            a: &Array,
            b: &Array,
            has_lhs_indices: bool,
            lhs_indices: &Array,
            has_rhs_indices: bool,
            rhs_indices: &Array,
            sorted_indices: bool,
        ) -> Result<UniquePtr<Array>>;
        fn conv1d(
            input: &Array,
            weight: &Array,
            stride: i32,
            padding: i32,
            dilation: i32,
            groups: i32,
        ) -> Result<UniquePtr<Array>>;

        fn compile(closure: Box<RustClosure>, shapeless: bool) -> Result<UniquePtr<Compiled>>;
        fn compiled_call(compiled: &Compiled, inputs: &ArrayList) -> Result<UniquePtr<ArrayList>>;

        fn active_memory() -> Result<usize>;
        fn peak_memory() -> Result<usize>;
        fn reset_peak_memory() -> Result<()>;
        fn cache_memory() -> Result<usize>;
        fn clear_cache() -> Result<()>;
        fn set_memory_limit(limit: usize) -> Result<usize>;
        fn set_cache_limit(limit: usize) -> Result<usize>;

        fn load_safetensors(
            path: &str,
            names: &mut Vec<String>,
            arrays: Pin<&mut ArrayList>,
        ) -> Result<()>;

        fn distributed_is_available(backend: &str) -> Result<bool>;
        fn distributed_init(backend: &str) -> Result<UniquePtr<Group>>;
        fn distributed_forget_groups() -> Result<()>;
        fn group_clone(group: &Group) -> Result<UniquePtr<Group>>;
        fn group_rank(group: &Group) -> Result<i32>;
        fn group_size(group: &Group) -> Result<i32>;
        fn distributed_all_sum(x: &Array, group: &Group) -> Result<UniquePtr<Array>>;
        fn distributed_all_gather(x: &Array, group: &Group) -> Result<UniquePtr<Array>>;
        fn distributed_send(x: &Array, dst: i32, group: &Group) -> Result<UniquePtr<Array>>;
        fn distributed_recv_like(x: &Array, src: i32, group: &Group) -> Result<UniquePtr<Array>>;
    }
}
