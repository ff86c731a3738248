//! Picking an architecture by the names checkpoints use for it.

use mlx::Dtype;

use crate::arch::{gemma3, llama, qwen2, qwen3, qwen3_moe};
use crate::config::TextConfig;
use crate::model::Model;
use crate::weights::Weights;
use crate::{Error, Result};

/// Builds one architecture. Weights follow transformers' names and conventions whatever the
/// checkpoint's format: `quant` undoes llama.cpp's Q/K row permutation and Gemma norm offset.
type Builder = fn(TextConfig, &mut Weights) -> Result<crate::arch::decoder::Decoder>;

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

/// Whether an architecture is registered under `name`.
pub fn is_supported(name: &str) -> bool {
    ARCHITECTURES.iter().any(|(names, _)| names.contains(&name))
}

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
pub fn build_model(config: TextConfig, weights: &mut Weights) -> Result<Box<dyn Model>> {
    let name = config.model_type.clone();
    let builder = ARCHITECTURES
        .iter()
        .find(|(names, _)| names.contains(&name.as_str()))
        .map(|(_, b)| *b)
        .ok_or(Error::UnsupportedArchitecture(name))?;
    let model = builder(config, weights)?;
    mlx::eval(&model.parameters())?;
    mlx::memory::clear_cache()?;
    Ok(Box::new(model))
}
