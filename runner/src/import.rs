//! Importing weights into the store: a GGUF file or a transformers / mlx-lm folder.

use std::path::{Path, PathBuf};

use crate::model_name::ModelName;
use crate::store::{Details, Format, Layer, Manifest, Store, StoreError, StoreWriter};

/// What went wrong while importing.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The path is neither a GGUF file nor a folder with `config.json`.
    #[error("{0} is neither a .gguf file nor a folder with config.json and safetensors")]
    Unsupported(PathBuf),
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
    /// Writing to the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Listing the folder failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Progress of an import: `(file, bytes done, bytes total)`.
pub type Progress<'a> = &'a mut dyn FnMut(&str, u64, u64);

/// Files of a transformers folder worth keeping (weights, configs, vocabularies, templates).
fn keep_file(name: &str) -> bool {
    name.ends_with(".safetensors")
        || name.ends_with(".json")
        || name.ends_with(".jinja")
        || name == "tokenizer.model"
}

/// Reads what a checkpoint is, checking that an architecture we support can run it.
pub fn describe(path: &Path) -> Result<(Format, Details), ImportError> {
    let checkpoint = quant::Checkpoint::open(path).map_err(|source| ImportError::Checkpoint {
        path: path.to_path_buf(),
        source,
    })?;
    let model_err = |source| ImportError::Model {
        path: path.to_path_buf(),
        source,
    };
    if nn::audio::whisper_model::is_whisper(checkpoint.config()) {
        return describe_whisper(&checkpoint).map_err(model_err);
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
            return Err(ImportError::Vocabulary {
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
        tokenizer::ChatTemplate::check(source).map_err(|source| ImportError::Template {
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
        .map_err(|source| ImportError::Checkpoint {
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

/// How a checkpoint's weights are stored, as `details.quantization_level` says it: mlx-lm's
/// default layout (`affine4`), a GGUF file type (`Q4_K_M`) or the float dtype.
pub(crate) fn quantization_level(checkpoint: &quant::Checkpoint) -> String {
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

/// Imports the checkpoint at `path` as `name`, with `source` recorded in the manifest, under
/// the store's writer lock (waiting for it).
pub fn import_path(
    store: &Store,
    name: &ModelName,
    path: &Path,
    source: &str,
    progress: Progress<'_>,
) -> Result<Manifest, ImportError> {
    let writer = store.lock(&mut || {})?;
    let manifest = import_manifest(&writer, path, source, None, progress)?;
    writer.put_manifest(name, &manifest)?;
    Ok(manifest)
}

/// Stores the files of the checkpoint at `path` as blobs and returns its manifest, with
/// `source` recorded, not yet written: the caller completes and writes it. For a GGUF file,
/// `expected_digest` (`sha256:<hex>`) is what its content must hash to; it is checked on the
/// way in, before the blob reaches the store.
pub fn import_manifest(
    writer: &StoreWriter<'_>,
    path: &Path,
    source: &str,
    expected_digest: Option<&str>,
    progress: Progress<'_>,
) -> Result<Manifest, ImportError> {
    let (format, details) = describe(path)?;
    let mut files: Vec<(PathBuf, String)> = Vec::new();
    match format {
        Format::Gguf => files.push((path.to_path_buf(), "model.gguf".to_string())),
        Format::Safetensors => {
            let dir = if path.is_dir() {
                path.to_path_buf()
            } else {
                path.parent()
                    .map(Path::to_path_buf)
                    .ok_or_else(|| ImportError::Unsupported(path.to_path_buf()))?
            };
            let entries = std::fs::read_dir(&dir).map_err(|source| ImportError::Io {
                path: dir.clone(),
                source,
            })?;
            for entry in entries.flatten() {
                let file_name = entry.file_name().to_string_lossy().into_owned();
                if entry.path().is_file() && keep_file(&file_name) {
                    files.push((entry.path(), file_name));
                }
            }
            files.sort_by(|a, b| a.1.cmp(&b.1));
        }
    }
    let expected = match format {
        Format::Gguf => expected_digest,
        Format::Safetensors => None,
    };
    let mut layers: Vec<Layer> = Vec::with_capacity(files.len());
    for (file, path_in_model) in &files {
        let total = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
        let layer = writer.add_blob(file, path_in_model, expected, &mut |done| {
            progress(path_in_model, done, total)
        })?;
        layers.push(layer);
    }
    Ok(Manifest {
        format,
        layers,
        parameters: Default::default(),
        template: None,
        system: None,
        draft: None,
        source: source.to_string(),
        details,
        created_at: crate::timestamp::rfc3339(std::time::SystemTime::now()),
    })
}
