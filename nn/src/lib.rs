//! Layers, the model contract and architectures, built on MLX.
//!
//! Layers (one per file) are built from checkpoint tensors and know nothing of architectures;
//! architectures (`arch/`, one file each) assemble layers and decide their conventions.
//!
//! - [`config`]: `config.json` → [`TextConfig`], accepting transformers 4 and 5 spellings and
//!   refusing a config without a field that changes the numbers.
//! - [`weights`]: [`Weights`], named tensors handed to layers in the compute dtype.
//! - Layers: [`linear`], [`embedding`], [`rms_norm`], [`layer_norm`], [`conv1d`], [`rope`]
//!   (default, linear, llama3, yarn; partial; traditional), [`attention`] (GQA, q/k norms,
//!   soft-capping), [`activation`] (fused gated activations), [`mlp`], [`moe`].
//! - [`model`]: the [`Model`] contract, [`Batch`], [`Forward`].
//! - [`arch`]: `llama`, `qwen2`, `qwen3`, `qwen3_moe`, `gemma3` over a shared [`arch::decoder`].
//! - [`registry`]: architecture by name, compute dtype per device, [`build_model`].
//! - [`load`]: opening a checkpoint directory or GGUF file into a ready model.

pub mod activation;
pub mod arch;
pub mod attention;
pub mod config;
pub mod conv1d;
pub mod embedding;
mod error;
pub mod layer_norm;
pub mod linear;
pub mod load;
pub mod mlp;
pub mod model;
pub mod moe;
pub mod registry;
pub mod rms_norm;
pub mod rope;
pub mod weights;

pub use config::TextConfig;
pub use error::{Error, Result};
pub use model::{Batch, Forward, Model};
pub use registry::build_model;
pub use weights::Weights;
