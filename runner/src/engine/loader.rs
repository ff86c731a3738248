//! Loading a stored model: weights onto the MLX worker, vocabulary and chat template beside.

use std::path::Path;
use std::sync::OnceLock;

use grammar::GrammarCompiler;

use quant::Format as CheckpointFormat;
use tokenizer::{ChatTemplate, Family, Tokenizer};

use crate::engine::loaded::{LoadedModel, LoopConfig, StepError};
use crate::model_name::ModelName;
use crate::store::{Format, Manifest};

/// What went wrong while loading.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The weights could not be read or built.
    #[error("loading `{name}`: {source}")]
    Model {
        /// The model.
        name: String,
        /// Why.
        source: nn::Error,
    },
    /// The vocabulary or template could not be read.
    #[error("loading the tokenizer of `{name}`: {source}")]
    Tokenizer {
        /// The model.
        name: String,
        /// Why.
        source: tokenizer::Error,
    },
    /// The model's files are not as its manifest says.
    #[error("model `{0}` has no weights file")]
    NoWeights(String),
}

/// Everything request handlers need to know about the loaded model. Shared across threads;
/// the model itself stays on the MLX worker.
pub struct ModelInfo {
    /// Its name.
    pub name: ModelName,
    /// Its manifest.
    pub manifest: Manifest,
    /// Its vocabulary.
    pub tokenizer: Tokenizer,
    /// Its chat template (the manifest's override, the checkpoint's, or the family fallback).
    pub template: ChatTemplate,
    /// The output-parser family (thinking and tool-call syntax), when recognized.
    pub family: Option<Family>,
    /// The context length requests are held to.
    pub context_length: usize,
    /// The transformers-style config (for `show`).
    pub config: serde_json::Value,
    /// Compiles structured-output constraints for this vocabulary; built on first use
    /// (≈0.2 s), or why it cannot be.
    pub grammar_compiler: OnceLock<Result<GrammarCompiler, String>>,
}

/// The files of a model whose manifest has been materialized into `dir`.
pub fn weights_path(dir: &Path, manifest: &Manifest) -> Option<std::path::PathBuf> {
    match manifest.format {
        Format::Gguf => manifest
            .layers
            .iter()
            .find(|l| l.path.ends_with(".gguf"))
            .map(|l| dir.join(&l.path)),
        Format::Safetensors => Some(dir.to_path_buf()),
    }
}

/// Loads the model (on the calling thread, which must be the MLX worker) and its tokenizer,
/// ready to serve with `loop_config`.
pub fn load(
    name: &ModelName,
    manifest: &Manifest,
    dir: &Path,
    loop_config: LoopConfig,
) -> Result<(LoadedModel, ModelInfo), LoadError> {
    let weights =
        weights_path(dir, manifest).ok_or_else(|| LoadError::NoWeights(name.to_string()))?;
    let model_err = |source| LoadError::Model {
        name: name.to_string(),
        source,
    };
    let tok_err = |source| LoadError::Tokenizer {
        name: name.to_string(),
        source,
    };
    let loaded = nn::load::load(&weights, None).map_err(model_err)?;
    let tokenizer = match loaded.format {
        CheckpointFormat::Gguf => Tokenizer::from_gguf_file(&weights),
        CheckpointFormat::Safetensors => Tokenizer::from_hf_dir(&weights),
    }
    .map_err(tok_err)?;
    let template = match &manifest.template {
        Some(source) => ChatTemplate::new(
            source.clone(),
            tokenizer.bos_text().unwrap_or_default(),
            tokenizer.eos_text().unwrap_or_default(),
        ),
        None => ChatTemplate::for_tokenizer(&tokenizer),
    }
    .map_err(tok_err)?;
    let config = loaded.model.config().clone();
    let context_length = config.max_position_embeddings.max(1);
    let session =
        LoadedModel::new(loaded.model, context_length, loop_config).map_err(|e| match e {
            StepError::Model(source) => model_err(source),
            other => model_err(nn::Error::InvalidInput(other.to_string())),
        })?;
    Ok((
        session,
        ModelInfo {
            name: name.clone(),
            manifest: manifest.clone(),
            family: Family::detect(&tokenizer),
            tokenizer,
            template,
            context_length,
            config: loaded.config_json,
            grammar_compiler: OnceLock::new(),
        },
    ))
}
