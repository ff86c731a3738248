//! Safe arrays and operations over Apple's MLX.
//!
//! [`Array`] owns a handle to an MLX array; every fallible call returns [`Result`] carrying
//! MLX's own message, so an exception inside MLX (including one raised while evaluating) is an
//! error, never an abort. Operations are lazy; [`eval`] or a typed read computes them.
//!
//! MLX keeps its default device and stream per thread and its graph is not safe to build from
//! several threads at once: mlxkit runs all MLX work on one thread (`mlx-thread`).
//!
//! - `array`: [`Array`], constructors from host data, typed readers.
//! - `dtype`: [`Dtype`] and the [`Element`] types that map onto it.
//! - `ops`: arithmetic, comparisons, activations, matmul, shapes, indexing, reductions,
//!   sorting (methods on [`Array`], plus [`concatenate`], [`stack`], [`r#where`]).
//! - [`fast`]: fused RMS/layer norm, rotary embedding, scaled dot-product attention.
//! - [`quantized`]: quantize/dequantize and quantized, gathered matmuls in every mode.
//! - [`random`]: keyed random numbers.
//! - [`compile()`]: Rust closures compiled into fused graphs.
//! - `conv`: [`conv1d`].
//! - `eval`: [`eval`], [`async_eval`].
//! - `device`: devices, streams, backend availability, [`version`].
//! - [`memory`]: active and peak memory, the buffer pool and its limits.
//! - `io`: [`load_safetensors`].
//! - [`distributed`]: MLX's distributed backends and groups, and collectives over them.

mod array;
mod compile;
mod conv;
mod device;
pub mod distributed;
mod dtype;
mod error;
mod eval;
pub mod fast;
mod io;
pub mod k_blocks;
mod list;
pub mod memory;
mod ops;
pub mod quantized;
pub mod random;

pub use array::Array;
pub use compile::{Compiled, compile};
pub use conv::conv1d;
pub use device::{
    CpuKernels, Device, Stream, blas_gemv_forwarding, blas_is_reference, blas_name,
    blas_parallel_calls, cpu_kernels, cpu_primitive_paths, cpu_primitives_enabled, cpu_threads,
    cuda_available, gpu_available, metal_available, set_cpu_kernels, set_cpu_primitives,
    set_cpu_threads, synchronize, version,
};
pub use dtype::{Dtype, Element};
pub use error::{Error, Result};
pub use eval::{async_eval, eval};
pub use io::load_safetensors;
pub use ops::{Operand, SliceSpec, concatenate, stack, r#where};
pub use quantized::{QuantMode, QuantSpec, Quantized};
