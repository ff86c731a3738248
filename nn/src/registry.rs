//! Picking an architecture by the names checkpoints use for it.

use mlx::Dtype;

use crate::arch::{gemma3, llama, qwen2, qwen3, qwen3_moe};
use crate::config::TextConfig;
use crate::model::Model;
use crate::weights::Weights;
use crate::{Error, Result};

/// Where a checkpoint's tensors came from; conventions differ (GGUF permutes llama Q/K rows
/// and bakes Gemma's norm offset in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A transformers / mlx-lm safetensors directory.
    Transformers,
    /// A llama.cpp GGUF file, tensors renamed to transformers names.
    Gguf,
}

type Builder = fn(TextConfig, &mut Weights, Source) -> Result<crate::arch::decoder::Decoder>;

/// Architecture names as configs spell them (`model_type`, `architectures[0]`, GGUF
/// `general.architecture`), and their builders.
const ARCHITECTURES: &[(&[&str], Builder)] = &[
    (
        &["llama", "LlamaForCausalLM", "mistral", "MistralForCausalLM"],
        llama::build,
    ),
    (&["qwen2", "Qwen2ForCausalLM"], qwen2::build),
    (&["qwen3", "Qwen3ForCausalLM"], qwen3::build),
    (
        &["qwen3_moe", "qwen3moe", "Qwen3MoeForCausalLM"],
        qwen3_moe::build,
    ),
    (
        &[
            "gemma3",
            "gemma3_text",
            "Gemma3ForCausalLM",
            "Gemma3ForConditionalGeneration",
        ],
        gemma3::build,
    ),
];

/// The names of every supported architecture.
pub fn supported() -> Vec<&'static str> {
    ARCHITECTURES.iter().map(|(names, _)| names[0]).collect()
}

/// The compute dtype for the default device: bf16 on a GPU, f32 on the CPU (where MLX's bf16
/// kernels are several times slower).
pub fn default_dtype() -> Result<Dtype> {
    Ok(if mlx::gpu_available()? {
        Dtype::Bf16
    } else {
        Dtype::F32
    })
}

/// Builds the model `config` describes from `weights`, evaluates every weight (so folds such
/// as fused gate/up projections are computed once, now) and releases MLX's buffer pool.
pub fn build_model(
    config: TextConfig,
    weights: &mut Weights,
    source: Source,
) -> Result<Box<dyn Model>> {
    let name = config.model_type.clone();
    let builder = ARCHITECTURES
        .iter()
        .find(|(names, _)| names.contains(&name.as_str()))
        .map(|(_, b)| *b)
        .ok_or(Error::UnsupportedArchitecture(name))?;
    let model = builder(config, weights, source)?;
    mlx::eval(&model.parameters())?;
    mlx::memory::clear_cache()?;
    Ok(Box::new(model))
}
