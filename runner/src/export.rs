//! Writing a stored model out as a transformers / mlx-lm folder.
//!
//! The folder is what both mlx-lm and `mlxkit create` load: `config.json` in transformers'
//! key names (with `torch_dtype`, and mlx-lm's `quantization` section for a quantized export),
//! one `model.safetensors` with transformers' tensor names, and the vocabulary as
//! `tokenizer.json` + `tokenizer_config.json` + `generation_config.json`. Exporting the same
//! weights for both engines is what lets `bench/compare` measure engine overhead alone
//! (issue 11).
//!
//! Tensors come from [`quant::Checkpoint`], which already maps GGUF names to transformers'
//! names and undoes llama.cpp's converter changes (the Q/K row permutation, Gemma's `+1` norm
//! offset), so the folder holds what the original transformers checkpoint held up to
//! quantization.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx::Dtype;
use mlx::quantized::QuantSpec;
use serde_json::{Map, Value, json};
use tokenizer::Tokenizer;

use crate::engine::from_store::weights_path;
use crate::model_name::ModelName;
use crate::store::{Format, Store, StoreError};

/// What went wrong while exporting.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The model is not in the store, or its files are not as its manifest says.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The manifest names no weights file.
    #[error("model `{0}` has no weights file")]
    NoWeights(String),
    /// The checkpoint could not be read.
    #[error("reading the weights: {0}")]
    Checkpoint(#[from] quant::Error),
    /// MLX failed converting a tensor.
    #[error("converting tensor `{name}`: {source}")]
    Tensor {
        /// The tensor.
        name: String,
        /// Why.
        source: mlx::Error,
    },
    /// A tensor cannot be written in mlx-lm's layout.
    #[error("tensor `{name}` cannot be exported: {what}")]
    Unsupported {
        /// The tensor.
        name: String,
        /// Why.
        what: String,
    },
    /// The vocabulary could not be read or serialized.
    #[error("the vocabulary: {0}")]
    Tokenizer(String),
    /// Writing the folder failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, ExportError>;

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ExportError + '_ {
    move |source| ExportError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// How the weights are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportOptions {
    /// The dtype of dense weights and of quantization scales and biases.
    pub dtype: Dtype,
    /// Keep quantized matrices quantized (mlx-lm's `*.weight/*.scales/*.biases` layout)
    /// instead of dequantizing them.
    pub quantized: bool,
    /// Keep only the first this many decoder layers (with the embedding, final norm and
    /// head): a truncated copy with the same vocabulary, to serve as a draft model.
    pub layers: Option<usize>,
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSummary {
    /// Tensors in `model.safetensors`, quantization companions included.
    pub tensors: usize,
    /// Matrices written quantized.
    pub quantized: usize,
    /// Bytes of `model.safetensors`.
    pub bytes: u64,
}

/// transformers' name of a dtype (`torch_dtype`); `None` for dtypes an export does not write.
fn torch_dtype_name(dtype: Dtype) -> Option<&'static str> {
    match dtype {
        Dtype::F32 => Some("float32"),
        Dtype::Bf16 => Some("bfloat16"),
        Dtype::F16 => Some("float16"),
        _ => None,
    }
}

/// Writes model `name` from `store` into `dir` (created if missing; files of the same names
/// are replaced).
pub fn export(
    store: &Store,
    name: &ModelName,
    dir: &Path,
    options: ExportOptions,
) -> Result<ExportSummary> {
    let dtype_name = torch_dtype_name(options.dtype).ok_or_else(|| ExportError::Unsupported {
        name: "*".into(),
        what: format!("{:?} is not a floating-point dtype", options.dtype),
    })?;
    let entry = store.get(name)?;
    let view = store.materialize(&entry.manifest)?;
    let weights = weights_path(&view, &entry.manifest)
        .ok_or_else(|| ExportError::NoWeights(name.to_string()))?;
    let checkpoint = quant::Checkpoint::open(&weights)?;
    let total_layers = checkpoint
        .config()
        .get("num_hidden_layers")
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok());
    let keep_layers = match (options.layers, total_layers) {
        (None, _) => None,
        (Some(n), Some(total)) if (1..=total).contains(&n) => Some(n),
        (Some(n), total) => {
            return Err(ExportError::Unsupported {
                name: "model.layers".into(),
                what: match total {
                    Some(total) => format!("cannot keep {n} of the model's {total} layers"),
                    None => "the config names no `num_hidden_layers` to cut".into(),
                },
            });
        }
    };
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;

    let mut tensors: Vec<(String, mlx::Array)> = Vec::new();
    // Module path → spec of every matrix kept quantized, for the config's section.
    let mut specs: BTreeMap<String, QuantSpec> = BTreeMap::new();
    for tensor_name in checkpoint.names() {
        if let (Some(keep), Some(layer)) = (keep_layers, layer_of(&tensor_name))
            && layer >= keep
        {
            continue;
        }
        let tensor = checkpoint.tensor(&tensor_name)?;
        let tensor_err = |source| ExportError::Tensor {
            name: tensor_name.clone(),
            source,
        };
        match tensor {
            quant::Tensor::Quantized(q) if options.quantized => {
                let module = tensor_name.strip_suffix(".weight").ok_or_else(|| {
                    ExportError::Unsupported {
                        name: tensor_name.clone(),
                        what: "mlx-lm stores only `<module>.weight` matrices quantized".into(),
                    }
                })?;
                // The microscaling modes store byte-coded scales; only affine ones are floats
                // to cast.
                let cast = |a: &mlx::Array| -> std::result::Result<mlx::Array, mlx::Error> {
                    if a.dtype().is_float() {
                        a.astype(options.dtype)
                    } else {
                        Ok(a.clone())
                    }
                };
                tensors.push((
                    format!("{module}.scales"),
                    cast(&q.scales).map_err(tensor_err)?,
                ));
                if let Some(biases) = &q.biases {
                    tensors.push((
                        format!("{module}.biases"),
                        cast(biases).map_err(tensor_err)?,
                    ));
                }
                tensors.push((tensor_name.clone(), q.weights.clone()));
                specs.insert(module.to_string(), q.spec);
            }
            other => {
                let dense = other.into_dense(Some(options.dtype))?;
                tensors.push((tensor_name.clone(), dense));
            }
        }
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let weights_file = dir.join("model.safetensors");
    let bytes = write_safetensors(&weights_file, &tensors)?;

    let mut config = checkpoint.config().clone();
    if let Some(object) = config.as_object_mut() {
        // A dense export of an MLX-quantized folder is no longer quantized.
        object.remove("quantization");
        object.remove("quantization_config");
        object.insert("torch_dtype".into(), json!(dtype_name));
        if let Some(section) = quant::create::quantization_section(&specs) {
            object.insert("quantization".into(), section);
        }
        if let (Some(keep), Some(total)) = (keep_layers, total_layers) {
            object.insert("num_hidden_layers".into(), json!(keep));
            // Per-layer lists (`layer_types`) describe the layers kept.
            for value in object.values_mut() {
                if let Value::Array(items) = value
                    && items.len() == total
                {
                    items.truncate(keep);
                }
            }
        }
    }
    write_json(&dir.join("config.json"), &config)?;

    match entry.manifest.format {
        Format::Gguf => write_gguf_vocabulary(&weights, dir, &config)?,
        Format::Safetensors => copy_vocabulary(&view, dir)?,
    }
    Ok(ExportSummary {
        tensors: tensors.len(),
        quantized: specs.len(),
        bytes,
    })
}

/// The decoder layer a tensor belongs to (`model.layers.<n>.…`), if any.
fn layer_of(tensor: &str) -> Option<usize> {
    tensor
        .strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// Writes `tensors` as one safetensors file; returns its size.
fn write_safetensors(path: &Path, tensors: &[(String, mlx::Array)]) -> Result<u64> {
    let mut writer = quant::SafetensorsWriter::create(path)?;
    for (name, array) in tensors {
        writer.add(name, array)?;
    }
    Ok(writer.finish()?)
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| ExportError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    text.push('\n');
    std::fs::write(path, text).map_err(io_err(path))
}

/// The vocabulary of a GGUF file as `tokenizer.json`, `tokenizer_config.json` and
/// `generation_config.json`.
pub(crate) fn write_gguf_vocabulary(gguf: &Path, dir: &Path, config: &Value) -> Result<()> {
    let tok = Tokenizer::from_gguf_file(gguf).map_err(|e| ExportError::Tokenizer(e.to_string()))?;
    let text = tok
        .hf()
        .to_string(false)
        .map_err(|e| ExportError::Tokenizer(e.to_string()))?;
    let mut tokenizer_json: Value =
        serde_json::from_str(&text).map_err(|e| ExportError::Tokenizer(e.to_string()))?;
    let specials = tok.special_tokens();
    let token_text = |id: Option<u32>| id.and_then(|id| tok.id_to_token(id));
    let bos = token_text(specials.bos);
    let eos = token_text(specials.eos.first().copied());
    // A GGUF vocabulary adds BOS/EOS in our encoder, a tokenizer.json in its post-processor:
    // move the flags into one so the folder encodes plain text as the GGUF file did.
    let mut template: Vec<Value> = Vec::new();
    let mut special_map = Map::new();
    let mut add_special = |text: &Option<String>, id: Option<u32>, template: &mut Vec<Value>| {
        if let (Some(text), Some(id)) = (text, id) {
            template.push(json!({"SpecialToken": {"id": text, "type_id": 0}}));
            special_map.insert(
                text.clone(),
                json!({"id": text, "ids": [id], "tokens": [text]}),
            );
        }
    };
    if specials.add_bos {
        add_special(&bos, specials.bos, &mut template);
    }
    template.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    if specials.add_eos {
        add_special(&eos, specials.eos.first().copied(), &mut template);
    }
    if specials.add_bos || specials.add_eos {
        let mut pair = template.clone();
        pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));
        let processor = json!({
            "type": "TemplateProcessing",
            "single": template,
            "pair": pair,
            "special_tokens": special_map,
        });
        let existing = tokenizer_json
            .get("post_processor")
            .cloned()
            .unwrap_or(Value::Null);
        let combined = if existing.is_null() {
            processor
        } else {
            json!({"type": "Sequence", "processors": [existing, processor]})
        };
        if let Some(object) = tokenizer_json.as_object_mut() {
            object.insert("post_processor".into(), combined);
        }
    }
    write_json(&dir.join("tokenizer.json"), &tokenizer_json)?;

    let mut tokenizer_config = Map::new();
    tokenizer_config.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
    tokenizer_config.insert("bos_token".into(), json!(bos));
    tokenizer_config.insert("eos_token".into(), json!(eos));
    if let Some(pad) = token_text(specials.pad) {
        tokenizer_config.insert("pad_token".into(), json!(pad));
    }
    if let Some(unk) = token_text(specials.unk) {
        tokenizer_config.insert("unk_token".into(), json!(unk));
    }
    tokenizer_config.insert("add_bos_token".into(), json!(specials.add_bos));
    tokenizer_config.insert("add_eos_token".into(), json!(specials.add_eos));
    tokenizer_config.insert("clean_up_tokenization_spaces".into(), json!(false));
    if let Some(length) = config.get("max_position_embeddings") {
        tokenizer_config.insert("model_max_length".into(), length.clone());
    }
    if let Some(template) = tok.chat_template() {
        tokenizer_config.insert("chat_template".into(), json!(template));
    }
    write_json(
        &dir.join("tokenizer_config.json"),
        &Value::Object(tokenizer_config),
    )?;

    let mut generation = Map::new();
    if let Some(id) = specials.bos {
        generation.insert("bos_token_id".into(), json!(id));
    }
    generation.insert(
        "eos_token_id".into(),
        json!(specials.eos.iter().collect::<Vec<_>>()),
    );
    write_json(
        &dir.join("generation_config.json"),
        &Value::Object(generation),
    )
}

/// Copies the vocabulary and template files of a transformers folder unchanged.
pub(crate) fn copy_vocabulary(source: &Path, dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(source).map_err(io_err(source))?;
    for entry in entries {
        let entry = entry.map_err(io_err(source))?;
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let is_vocabulary = file_name.starts_with("tokenizer")
            || file_name == "special_tokens_map.json"
            || file_name == "generation_config.json"
            || file_name.ends_with(".jinja");
        if is_vocabulary {
            let target = dir.join(&file_name);
            std::fs::copy(entry.path(), &target).map_err(io_err(&target))?;
        }
    }
    Ok(())
}
