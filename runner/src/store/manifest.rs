//! What the store records of a model: its files (as blobs), its settings and what its
//! checkpoint is. A leaf: the store, the importer and the reader of Ollama's store all speak
//! these types, and this file uses none of theirs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The checkpoint format of a model's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// One GGUF file.
    Gguf,
    /// A transformers / mlx-lm folder of safetensors and JSON files.
    Safetensors,
}

/// One file of a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layer {
    /// The file's name within the model (`model.gguf`, `config.json`, …).
    pub path: String,
    /// `sha256:<hex>` of its content.
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
}

/// What a model is, for listings: read once at import so listing never opens weights.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Details {
    /// The architecture family (`llama`, `gemma3`, …).
    pub family: String,
    /// Parameters, human-readable (`135M`).
    pub parameter_size: String,
    /// How the weights are stored (`Q4_1`, `F32`, `affine4`, …).
    pub quantization_level: String,
    /// The context length.
    pub context_length: usize,
    /// What it can be asked to do (see [`crate::capabilities`]); empty in manifests written
    /// before it was recorded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// `show`'s `model_info`, in Ollama's GGUF-key shape (see [`crate::model_info`]); empty in
    /// manifests written before it was recorded.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub model_info: BTreeMap<String, serde_json::Value>,
}

/// Which blobs make up a model, and the settings it was created with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The weights' format.
    pub format: Format,
    /// The files.
    pub layers: Vec<Layer>,
    /// Default generation options (`PARAMETER` lines of a Modelfile).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, serde_json::Value>,
    /// A chat template overriding the checkpoint's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// A default system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// A draft model (Modelfile `DRAFT`), by its name in the store: loaded beside this one
    /// to draft for speculative decoding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<String>,
    /// Where the model came from (a catalog package, a path, another model).
    #[serde(default)]
    pub source: String,
    /// What the model is, read from its checkpoint at import.
    #[serde(default)]
    pub details: Details,
    /// When the manifest was written, RFC 3339.
    pub created_at: String,
}

impl Manifest {
    /// Total bytes of the model's files.
    pub fn size(&self) -> u64 {
        self.layers.iter().map(|l| l.size).sum()
    }

    /// A digest identifying this exact manifest.
    pub fn digest(&self) -> String {
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        format!("sha256:{}", hex(&Sha256::digest(&bytes)))
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}
