//! A GGUF file seen as a Hugging Face checkpoint: HF tensor names, an HF-style config, and
//! tensors with llama.cpp's converter-side changes undone.
//!
//! Two changes are undone so the tensors equal what the HF checkpoint holds (up to
//! quantization): the Q/K row permutation of llama-family files (rows only, so quantized
//! weights stay quantized), and the `+1` that llama.cpp's Gemma converters add to every norm
//! weight (HF Gemma computes `x · (1 + w)`, llama.cpp `x · w`).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use mlx::quantized::Quantized;

use crate::gguf_config::{gguf_family, hf_config};
use crate::gguf_delta_net::{DeltaNetHeads, undo_delta_net};
use crate::gguf_names::hf_tensor_name;
use crate::gguf_recurrent::{a_log_of, unsqueezed_kernel};
use crate::gguf_tensor::{gguf_packed_16, gguf_tensor};
use crate::rope_permutation::{qk_rows_permuted, unpermute_qk_rows};
use crate::tensor::Tensor;
use crate::{Error, Result};
use crate::{GgufFile, GgufTensorInfo, MetaValue};

/// A GGUF file with HF names.
#[derive(Debug)]
pub struct GgufCheckpoint {
    file: GgufFile,
    architecture: String,
    config: Value,
    /// The delta nets' head layout, for Qwen3.5's and Qwen3-Next's converter changes.
    delta_net: Option<DeltaNetHeads>,
    /// HF name (or the GGUF name, when unmapped) → index into the file's tensors.
    names: BTreeMap<String, usize>,
}

/// The tensor of per-frequency rope divisors llama.cpp's converter writes for Llama 3's
/// scaling and Gemma 4's proportional rope: read into the config, not handed to the model.
const ROPE_FREQS: &str = "rope_freqs.weight";

/// The divisors of `rope_freqs.weight` (a short f32 vector: one per rotated pair).
fn rope_frequency_factors(file: &GgufFile, index: usize) -> Result<Vec<f32>> {
    let info = &file.tensors()[index];
    if info.shape.len() != 1 || info.shape[0] > 1 << 16 {
        return Err(Error::Config(format!(
            "{ROPE_FREQS} has shape {:?}, expected one factor per rotated pair",
            info.shape
        )));
    }
    let tensor = gguf_tensor(
        ROPE_FREQS,
        info.ggml_type,
        &info.shape,
        file.tensor_bytes(info)?,
    )?;
    match tensor {
        Tensor::Dense(array) => Ok(array.astype(mlx::Dtype::F32)?.to_vec::<f32>()?),
        Tensor::Quantized(_) | Tensor::KBlocks(_) => Err(Error::Unsupported {
            name: ROPE_FREQS.into(),
            what: "quantized rope frequency factors".into(),
        }),
    }
}

/// Puts rope divisors where the family's config reader looks for scaling: Gemma 4's full
/// layers (its sliding ones rotate plainly), everyone else's `rope_scaling`.
fn apply_rope_factors(
    path: &Path,
    config: &mut Value,
    family: &str,
    factors: Vec<f32>,
) -> Result<()> {
    let factors: Vec<f64> = factors.into_iter().map(f64::from).collect();
    let scaling = |mut params: serde_json::Map<String, Value>| {
        params.insert("rope_type".into(), "gguf_rope_freqs".into());
        params.insert("frequency_factors".into(), factors.clone().into());
        Value::Object(params)
    };
    let Some(object) = config.as_object_mut() else {
        return Ok(());
    };
    if family == "gemma4" {
        let full = object
            .get_mut("rope_parameters")
            .and_then(|rope| rope.get_mut("full_attention"))
            .ok_or_else(|| Error::malformed(path, "rope_freqs without a full-attention rope"))?;
        let params = full.as_object().cloned().unwrap_or_default();
        *full = scaling(params);
        return Ok(());
    }
    if object.contains_key("rope_scaling") {
        return Err(Error::malformed(
            path,
            "the file carries both rope_freqs and rope.scaling keys",
        ));
    }
    object.insert("rope_scaling".into(), scaling(serde_json::Map::new()));
    Ok(())
}

/// A deepseek2 file whose queries pass through a low-rank bottleneck must say how wide it is:
/// without `attention.q_lora_rank` the queries are read as projected directly (`attn_q`), as
/// in the lite models, which llama.cpp tells apart by their layer count instead.
fn check_query_rank(path: &Path, file: &GgufFile, names: &BTreeMap<String, usize>) -> Result<()> {
    let key = "deepseek2.attention.q_lora_rank";
    let low_rank = names
        .keys()
        .any(|name| name.ends_with(".self_attn.q_a_proj.weight"));
    if low_rank && file.get(key).is_none() {
        return Err(Error::malformed(
            path,
            format!("the file holds q_a_proj tensors (low-rank queries) but no {key}"),
        ));
    }
    Ok(())
}

/// Whether llama.cpp's converter for `architecture` adds 1 to norm weights.
fn norms_shifted(architecture: &str) -> bool {
    matches!(
        architecture,
        "gemma" | "gemma2" | "gemma3" | "gemma-embedding" | "qwen35" | "qwen35moe" | "qwen3next"
    )
}

impl GgufCheckpoint {
    /// Opens and validates a GGUF file.
    pub fn open(path: &Path) -> Result<GgufCheckpoint> {
        let file = GgufFile::open(path)?;
        let architecture = file.architecture().unwrap_or_default().to_string();
        let mut config = hf_config(file.metadata(), file.tensors());
        let family = gguf_family(&architecture, file.tensors());
        let mut names = BTreeMap::new();
        for (index, info) in file.tensors().iter().enumerate() {
            let name = hf_tensor_name(family, &info.name).unwrap_or_else(|| info.name.clone());
            if names.insert(name.clone(), index).is_some() {
                return Err(Error::malformed(
                    path,
                    format!("two tensors map onto the name {name:?}"),
                ));
            }
        }
        if architecture == "deepseek2" {
            check_query_rank(path, &file, &names)?;
        }
        if let Some(index) = names.remove(ROPE_FREQS) {
            let factors = rope_frequency_factors(&file, index)?;
            apply_rope_factors(path, &mut config, family, factors)?;
        }
        let delta_net = matches!(architecture.as_str(), "qwen35" | "qwen35moe" | "qwen3next")
            .then(|| DeltaNetHeads::from_metadata(file.metadata(), &architecture))
            .flatten();
        Ok(GgufCheckpoint {
            file,
            architecture,
            config,
            delta_net,
            names,
        })
    }

    /// The underlying file, for raw metadata (tokenizer, chat template) and GGUF names.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The HF-style config translated from the metadata.
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// HF tensor names (GGUF names where no mapping exists).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(String::as_str)
    }

    /// Whether a tensor of this HF name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    /// The logical shape of tensor `name`, without loading it.
    pub fn shape(&self, name: &str) -> Result<Vec<i32>> {
        let &index = self
            .names
            .get(name)
            .ok_or_else(|| Error::MissingTensor(name.to_string()))?;
        Ok(self.file.tensors()[index].shape.clone())
    }

    /// The GGUF type tensor `name` is stored as.
    pub fn stored_as(&self, name: &str) -> Result<crate::create::Stored> {
        Ok(crate::create::Stored::Gguf(self.info(name)?.ggml_type))
    }

    /// Tensor `name` (HF name) as the HF checkpoint would hold it.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        self.undo_converter(name, self.raw_tensor(name)?)
    }

    /// The packed decode form of tensor `name` when its type has 16-element groups (see
    /// [`gguf_packed_16`]), with the same converter changes undone as [`GgufCheckpoint::tensor`].
    pub fn packed_16(&self, name: &str) -> Result<Option<Quantized>> {
        let info = self.info(name)?;
        let packed = self.file.read_tensor(info, |bytes| {
            gguf_packed_16(name, info.ggml_type, &info.shape, bytes)
        })?;
        let Some(packed) = packed else {
            return Ok(None);
        };
        match self.undo_converter(name, Tensor::Quantized(packed))? {
            Tensor::Quantized(q) => Ok(Some(q)),
            Tensor::Dense(_) | Tensor::KBlocks(_) => Ok(None),
        }
    }

    /// Undoes what llama.cpp's converter changed in tensor `name`.
    fn undo_converter(&self, name: &str, tensor: Tensor) -> Result<Tensor> {
        if self.architecture == "lfm2"
            && name.ends_with(".conv.conv.weight")
            && let Tensor::Dense(kernel) = &tensor
            && kernel.ndim() == 2
        {
            return Ok(Tensor::Dense(unsqueezed_kernel(kernel)?));
        }
        let mamba2 = match self.architecture.as_str() {
            "nemotron_h" | "nemotron_h_moe" => Some(".mixer."),
            "granitehybrid" => Some(".mamba."),
            _ => None,
        };
        if let Some(module) = mamba2
            && name.contains(module)
            && let Tensor::Dense(t) = &tensor
        {
            // The converter's Mamba-2 changes: `A = -exp(A_log)` and `D` stored as columns,
            // the gated norm split per group, the convolution kernels squeezed.
            if name.ends_with(".A_log") {
                return Ok(Tensor::Dense(a_log_of(t)?));
            }
            if name.ends_with(".D") || name.ends_with(".norm.weight") {
                return Ok(Tensor::Dense(t.reshape(&[-1])?));
            }
            if name.ends_with(".conv1d.weight") && t.ndim() == 2 {
                return Ok(Tensor::Dense(unsqueezed_kernel(t)?));
            }
        }
        if qk_rows_permuted(&self.architecture) {
            let heads_key = if name.contains(".q_proj.") {
                Some("attention.head_count")
            } else if name.contains(".k_proj.") {
                Some("attention.head_count_kv")
            } else {
                None
            };
            if let Some(key) = heads_key {
                let heads = self.head_count(key, name)?;
                return unpermute_qk_rows(&tensor, heads);
            }
        }
        if let Some(heads) = self.delta_net
            && name.contains(".linear_attn.")
        {
            // Its gated norm is stored as is, unlike the model's other norms.
            return undo_delta_net(name, tensor, heads);
        }
        if norms_shifted(&self.architecture) && name.ends_with("norm.weight") {
            let Tensor::Dense(weight) = tensor else {
                return Err(Error::Unsupported {
                    name: name.to_string(),
                    what: "a quantized norm weight".into(),
                });
            };
            return Ok(Tensor::Dense(weight.subtract(1.0f32)?));
        }
        Ok(tensor)
    }

    /// Tensor `name` (HF name) exactly as stored, without undoing converter changes.
    pub fn raw_tensor(&self, name: &str) -> Result<Tensor> {
        let info = self.info(name)?;
        self.file.read_tensor(info, |bytes| {
            gguf_tensor(name, info.ggml_type, &info.shape, bytes)
        })
    }

    fn info(&self, name: &str) -> Result<&GgufTensorInfo> {
        let &index = self
            .names
            .get(name)
            .ok_or_else(|| Error::MissingTensor(name.to_string()))?;
        Ok(&self.file.tensors()[index])
    }

    fn head_count(&self, key: &str, tensor: &str) -> Result<usize> {
        let full = format!("{}.{key}", self.architecture);
        // A per-layer count (hybrids: 0 on layers without attention) is read at the tensor's
        // layer.
        let layer = tensor
            .split('.')
            .skip_while(|part| *part != "layers")
            .nth(1)
            .and_then(|i| i.parse::<usize>().ok());
        let value = self
            .file
            .get(&full)
            .or_else(|| {
                // `head_count_kv` defaults to `head_count`.
                self.file
                    .get(&format!("{}.attention.head_count", self.architecture))
            })
            .and_then(|v| match v {
                MetaValue::Array(counts) => counts.get(layer?).and_then(MetaValue::as_u64),
                one => one.as_u64(),
            })
            .ok_or_else(|| {
                Error::Config(format!("{full} is missing, needed to load {tensor:?}"))
            })?;
        usize::try_from(value).map_err(|_| Error::Config(format!("{full} {value} is too large")))
    }
}
