//! `Checkpoint`: one view over every checkpoint format model code reads.

use std::path::Path;

use mlx::Dtype;
use mlx::quantized::Quantized;
use serde_json::Value;

use crate::GgufFile;
use crate::gguf_checkpoint::GgufCheckpoint;
use crate::safetensors_dir::{SafetensorsDir, read_json};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Which format a checkpoint was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// An HF-style directory of safetensors (possibly MLX-quantized).
    Safetensors,
    /// A GGUF file.
    Gguf,
}

/// A checkpoint opened for reading: its config and its tensors by HF name.
///
/// Both formats look the same from here: `config()` is an HF-style `config.json` (translated
/// from GGUF metadata for GGUF files), names are HF names, and tensors equal what the HF
/// checkpoint holds up to quantization. Tensors load lazily, one `tensor()` call at a time.
#[derive(Debug)]
pub struct Checkpoint {
    source: Source,
}

#[derive(Debug)]
enum Source {
    Safetensors(SafetensorsDir),
    Gguf(GgufCheckpoint),
}

impl Checkpoint {
    /// Opens a checkpoint directory (with `config.json`), a GGUF file (by its `.gguf`
    /// extension or, for stores that name files by digest, by its magic bytes), or a single
    /// `.safetensors` file whose directory holds `config.json`.
    pub fn open(path: &Path) -> Result<Checkpoint> {
        let source = if path.is_dir() {
            Source::Safetensors(SafetensorsDir::open(path)?)
        } else if has_extension(path, "gguf") || gguf::is_gguf_file(path) {
            Source::Gguf(GgufCheckpoint::open(path)?)
        } else if has_extension(path, "safetensors") {
            let dir = path.parent().unwrap_or(Path::new("."));
            let config = read_json(&dir.join("config.json"))?;
            let quantization = crate::mlx_quantization::QuantizationConfig::from_config(&config)?;
            Source::Safetensors(SafetensorsDir::with_single_file(
                path,
                config,
                quantization,
            )?)
        } else if !path.exists() {
            return Err(Error::io(
                path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
            ));
        } else {
            return Err(Error::NotACheckpoint(path.to_path_buf()));
        };
        Ok(Checkpoint { source })
    }

    /// Opens one safetensors file that carries its own config, as JSON in its `__metadata__`
    /// under `config` (quantization included), so it needs no folder around it: a store keeps
    /// it as one blob. A drafter head trained apart from its model ships this way.
    pub fn open_self_described(path: &Path) -> Result<Checkpoint> {
        let file = crate::SafetensorsFile::open(path)?;
        let text = file
            .metadata()
            .get("config")
            .ok_or_else(|| Error::malformed(path, "its metadata has no `config`"))?;
        let config: Value = serde_json::from_str(text)
            .map_err(|e| Error::malformed(path, format!("its `config` is not JSON: {e}")))?;
        let quantization = crate::mlx_quantization::QuantizationConfig::from_config(&config)?;
        Ok(Checkpoint {
            source: Source::Safetensors(SafetensorsDir::with_single_file(
                path,
                config,
                quantization,
            )?),
        })
    }

    /// The format read.
    pub fn format(&self) -> Format {
        match self.source {
            Source::Safetensors(_) => Format::Safetensors,
            Source::Gguf(_) => Format::Gguf,
        }
    }

    /// The HF-style model config.
    pub fn config(&self) -> &Value {
        match &self.source {
            Source::Safetensors(dir) => dir.config(),
            Source::Gguf(gguf) => gguf.config(),
        }
    }

    /// `generation_config.json`, for safetensors directories that have one.
    pub fn generation_config(&self) -> Option<&Value> {
        match &self.source {
            Source::Safetensors(dir) => dir.generation_config(),
            Source::Gguf(_) => None,
        }
    }

    /// The GGUF file behind a GGUF checkpoint: raw metadata (tokenizer, chat template) and
    /// llama.cpp tensor names.
    pub fn gguf(&self) -> Option<&GgufFile> {
        match &self.source {
            Source::Gguf(gguf) => Some(gguf.file()),
            Source::Safetensors(_) => None,
        }
    }

    /// The safetensors directory behind a safetensors checkpoint.
    pub fn safetensors(&self) -> Option<&SafetensorsDir> {
        match &self.source {
            Source::Safetensors(dir) => Some(dir),
            Source::Gguf(_) => None,
        }
    }

    /// Every logical tensor name, sorted (quantization companions such as `.scales` are
    /// folded into their weight).
    pub fn names(&self) -> Vec<String> {
        match &self.source {
            Source::Safetensors(dir) => dir.names(),
            Source::Gguf(gguf) => gguf.names().map(str::to_string).collect(),
        }
    }

    /// Whether tensor `name` exists.
    pub fn contains(&self, name: &str) -> bool {
        match &self.source {
            Source::Safetensors(dir) => dir.contains(name),
            Source::Gguf(gguf) => gguf.contains(name),
        }
    }

    /// The logical shape of tensor `name` (a quantized matrix unpacked), without loading it.
    pub fn shape(&self, name: &str) -> Result<Vec<i32>> {
        match &self.source {
            Source::Safetensors(dir) => dir.shape(name),
            Source::Gguf(gguf) => gguf.shape(name),
        }
    }

    /// Parameters the checkpoint holds: the elements of every logical tensor, a quantized
    /// matrix counted unpacked (as many as its dense form has), read without loading a tensor.
    pub fn parameters(&self) -> Result<u64> {
        self.names().iter().try_fold(0u64, |total, name| {
            let elements = self
                .shape(name)?
                .iter()
                .map(|&d| u64::try_from(d).unwrap_or(0))
                .product::<u64>();
            Ok(total.saturating_add(elements))
        })
    }

    /// How tensor `name` is stored, without loading it.
    pub fn stored_as(&self, name: &str) -> Result<crate::create::Stored> {
        match &self.source {
            Source::Safetensors(dir) => dir.stored_as(name),
            Source::Gguf(gguf) => gguf.stored_as(name),
        }
    }

    /// Loads tensor `name`; [`Error::MissingTensor`] names it if absent.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        match &self.source {
            Source::Safetensors(dir) => dir.tensor(name),
            Source::Gguf(gguf) => gguf.tensor(name),
        }
    }

    /// The packed decode form of tensor `name` when it has one apart from [`Checkpoint::tensor`]:
    /// GGUF types with 16-element groups, which load dense (see [`crate::gguf_packed_16`]), and
    /// the same forms in a folder `create` converted from a GGUF ([`crate::PACKED_16`]).
    pub fn packed_16(&self, name: &str) -> Result<Option<Quantized>> {
        match &self.source {
            Source::Safetensors(dir) => dir.packed_16(name),
            Source::Gguf(gguf) => gguf.packed_16(name),
        }
    }

    /// Loads tensor `name` with its floating-point parts in `dtype` (see [`Tensor::to_dtype`]).
    pub fn tensor_as(&self, name: &str, dtype: Dtype) -> Result<Tensor> {
        self.tensor(name)?.to_dtype(dtype)
    }

    /// Loads tensor `name` if it exists.
    pub fn optional_tensor(&self, name: &str) -> Result<Option<Tensor>> {
        if self.contains(name) {
            self.tensor(name).map(Some)
        } else {
            Ok(None)
        }
    }
}

fn has_extension(path: &Path, extension: &str) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case(extension))
}
