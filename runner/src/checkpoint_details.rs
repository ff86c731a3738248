//! What a checkpoint is, read once at import (or when Ollama's store is read): its format,
//! family, size, quantization, context and capabilities, checking on the way that an
//! architecture we support can run it.

use std::path::{Path, PathBuf};

use crate::store::manifest::{Details, Format};

/// Why a checkpoint cannot be described.
#[derive(Debug, thiserror::Error)]
pub enum DescribeError {
    /// The checkpoint could not be read.
    #[error("reading {path}: {source}")]
    Checkpoint {
        /// The path.
        path: PathBuf,
        /// Why.
        source: quant::Error,
    },
    /// The architecture cannot be run.
    #[error("{path}: {source}")]
    Model {
        /// The path.
        path: PathBuf,
        /// Why.
        source: nn::Error,
    },
    /// The checkpoint's chat template does not compile or render.
    #[error("{path}: its chat template is unusable: {source}")]
    Template {
        /// The path.
        path: PathBuf,
        /// Why.
        source: tokenizer::Error,
    },
    /// A GGUF file without a vocabulary its tokenizer can be built from (a GGUF names its
    /// tokenizer in `tokenizer.ggml.model`; a folder may still get `tokenizer.json` later).
    #[error("{path}: no usable vocabulary: {source}")]
    Vocabulary {
        /// The path.
        path: PathBuf,
        /// Why.
        source: tokenizer::Error,
    },
}

/// Reads what a checkpoint is, checking that an architecture we support can run it.
pub fn describe(path: &Path) -> Result<(Format, Details), DescribeError> {
    let checkpoint = quant::Checkpoint::open(path).map_err(|source| DescribeError::Checkpoint {
        path: path.to_path_buf(),
        source,
    })?;
    let model_err = |source| DescribeError::Model {
        path: path.to_path_buf(),
        source,
    };
    if nn::audio::whisper_model::is_whisper(checkpoint.config()) {
        return describe_whisper(&checkpoint).map_err(model_err);
    }
    if nn::arch::gemma4_assistant::is_assistant(checkpoint.config()) {
        return describe_drafter(&checkpoint, "gemma4_assistant").map_err(model_err);
    }
    if nn::arch::dflash::is_dflash(checkpoint.config()) {
        return describe_drafter(&checkpoint, "dflash").map_err(model_err);
    }
    let spec = nn::registry::describe(checkpoint.config()).map_err(model_err)?;
    let mut inputs = crate::capabilities::Inputs {
        vision: nn::registry::image_input(checkpoint.config())
            .map_err(model_err)?
            .is_some(),
        audio: nn::registry::audio_input(checkpoint.config())
            .map_err(model_err)?
            .is_some(),
        insert: false,
    };
    // The chat template, when the checkpoint carries a readable tokenizer.
    let tokenizer = match checkpoint.format() {
        quant::Format::Gguf => tokenizer::Tokenizer::from_gguf_file(path),
        quant::Format::Safetensors => tokenizer::Tokenizer::from_hf_dir(path),
    };
    let tokenizer = match (tokenizer, checkpoint.format()) {
        (Err(source), quant::Format::Gguf) => {
            return Err(DescribeError::Vocabulary {
                path: path.to_path_buf(),
                source,
            });
        }
        (tokenizer, _) => tokenizer.ok(),
    };
    inputs.insert = tokenizer
        .as_ref()
        .is_some_and(|t| tokenizer::FillInMiddle::of(t).is_some());
    let template = tokenizer.and_then(|t| t.chat_template().map(str::to_string));
    if let Some(source) = &template {
        tokenizer::ChatTemplate::check(source).map_err(|source| DescribeError::Template {
            path: path.to_path_buf(),
            source,
        })?;
    }
    let format = match checkpoint.format() {
        quant::Format::Gguf => Format::Gguf,
        quant::Format::Safetensors => Format::Safetensors,
    };
    let quantization = quantization_level(&checkpoint);
    let parameters = checkpoint
        .parameters()
        .map_err(|source| DescribeError::Checkpoint {
            path: path.to_path_buf(),
            source,
        })?;
    Ok((
        format,
        Details {
            family: spec.model_type.clone(),
            parameter_size: human_count(parameters),
            quantization_level: quantization,
            context_length: spec.context_length,
            capabilities: crate::capabilities::of_model(template.as_deref(), inputs),
            model_info: match checkpoint.gguf() {
                Some(gguf) => crate::model_info::of_gguf(gguf.metadata(), parameters),
                None => crate::model_info::of_config(
                    checkpoint.config(),
                    Some(parameters),
                    spec.context_length,
                ),
            },
        },
    ))
}

/// A Whisper checkpoint: a speech recognizer, whose one capability is transcription; its
/// context is the decoder's `max_target_positions`.
fn describe_whisper(checkpoint: &quant::Checkpoint) -> Result<(Format, Details), nn::Error> {
    let config = checkpoint.config();
    let parameters = nn::audio::whisper_model::parameter_count(config)?;
    let decoder = nn::audio::whisper_decoder::DecoderConfig::from_json(config)?;
    let format = match checkpoint.format() {
        quant::Format::Gguf => {
            return Err(nn::Error::Config(
                "a Whisper checkpoint is read from safetensors, not GGUF".into(),
            ));
        }
        quant::Format::Safetensors => Format::Safetensors,
    };
    Ok((
        format,
        Details {
            family: "whisper".into(),
            parameter_size: human_count(parameters),
            quantization_level: quantization_level(checkpoint),
            context_length: decoder.max_target_positions,
            capabilities: crate::capabilities::of_transcriber(),
            model_info: crate::model_info::of_config(
                config,
                Some(parameters),
                decoder.max_target_positions,
            ),
        },
    ))
}

/// A drafter that serves only beside a target (a Gemma 4 assistant, a DFlash block drafter):
/// its one capability is drafting (it is checked against its target when paired), its family
/// `family`, its context its (text) config's.
fn describe_drafter(
    checkpoint: &quant::Checkpoint,
    family: &str,
) -> Result<(Format, Details), nn::Error> {
    let config = checkpoint.config();
    if checkpoint.format() != quant::Format::Safetensors {
        return Err(nn::Error::Config(format!(
            "a `{family}` drafter is read from safetensors, not GGUF"
        )));
    }
    let parameters = checkpoint
        .parameters()
        .map_err(|e| nn::Error::Weights(e.to_string()))?;
    let context = config
        .pointer("/text_config/max_position_embeddings")
        .or_else(|| config.get("max_position_embeddings"))
        .and_then(serde_json::Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0);
    Ok((
        Format::Safetensors,
        Details {
            family: family.into(),
            parameter_size: human_count(parameters),
            quantization_level: quantization_level(checkpoint),
            context_length: context,
            capabilities: crate::capabilities::of_drafter(),
            model_info: crate::model_info::of_config(config, Some(parameters), context),
        },
    ))
}

/// How a checkpoint's weights are stored, as `details.quantization_level` says it: mlx-lm's
/// default layout (`affine4`), a GGUF file type (`Q4_K_M`) or the float dtype.
pub fn quantization_level(checkpoint: &quant::Checkpoint) -> String {
    checkpoint
        .config()
        .get("quantization")
        .map(|q| {
            format!(
                "{}{}",
                q.get("mode").and_then(|m| m.as_str()).unwrap_or("affine"),
                q.get("bits").and_then(|b| b.as_u64()).unwrap_or(0)
            )
        })
        .or_else(|| {
            checkpoint
                .gguf()
                .and_then(|g| g.get("general.file_type"))
                .and_then(|t| t.as_u64())
                .map(gguf_file_type_name)
        })
        .unwrap_or_else(|| {
            checkpoint
                .config()
                .get("torch_dtype")
                .or_else(|| checkpoint.config().get("dtype"))
                .and_then(|d| d.as_str())
                .unwrap_or("unknown")
                .to_uppercase()
        })
}

/// llama.cpp's name of a GGUF `general.file_type` (the predominant tensor type).
fn gguf_file_type_name(file_type: u64) -> String {
    let name = match file_type {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        other => return format!("GGUF type {other}"),
    };
    name.to_string()
}

/// `135M`, `1.2B`.
pub fn human_count(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1}B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.0}M", n / 1e6)
    } else {
        format!("{:.0}K", n / 1e3)
    }
}
