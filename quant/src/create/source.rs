//! The *read* and *classify* phases: what a checkpoint holds, tensor by tensor, without loading
//! any data, and what kind of source it is.

use mlx::Dtype;
use mlx::quantized::{QuantMode, QuantSpec};
use serde_json::Value;

use crate::{Checkpoint, Error, Format, GgmlType, Result};

/// How one tensor is stored in the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// A plain array of this dtype.
    Float(Dtype),
    /// An MLX-quantized matrix (an mlx-lm folder).
    Mlx(QuantSpec),
    /// A GGUF tensor of this type.
    Gguf(GgmlType),
    /// FP8 (E4M3) with scales beside it, as HF and compressed-tensors publish it.
    Fp8,
    /// NVFP4 with a per-tensor scale (ModelOpt, compressed-tensors), which MLX's layout does
    /// not hold (one whose scale is 1 is [`Stored::Mlx`]).
    Nvfp4,
}

impl Stored {
    /// A short label: `BF16`, `int4/64`, `Q4_1`.
    pub fn label(self) -> String {
        match self {
            Stored::Float(dtype) => format!("{dtype:?}").to_uppercase(),
            Stored::Mlx(spec) => super::target::spec_label(spec),
            Stored::Gguf(ty) => ty.to_string(),
            Stored::Fp8 => "F8_E4M3".into(),
            Stored::Nvfp4 => "NVFP4+g".into(),
        }
    }
}

/// One tensor of the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTensor {
    /// Its name in transformers' naming (GGUF names are translated).
    pub name: String,
    /// Its logical shape (a packed matrix unpacked).
    pub shape: Vec<i32>,
    /// How it is stored.
    pub stored: Stored,
}

/// What kind of checkpoint the source is, as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// Floating-point weights (the dtype most of its matrices have).
    Float(Dtype),
    /// Already quantized in MLX's layout (an mlx-lm folder).
    MlxQuantized,
    /// A GGUF file, quantized or not.
    Gguf,
    /// FP8 weights with block, row or tensor scales (HF fine-grained or compressed-tensors);
    /// the float dtype is the one its other tensors have.
    Fp8(Dtype),
    /// NVFP4 weights (ModelOpt or compressed-tensors), and that float dtype.
    Nvfp4(Dtype),
}

/// A model part other than the language model, which the policy leaves at source precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tower {
    /// An image encoder (`vision_config`).
    Vision,
    /// An audio encoder (`audio_config`).
    Audio,
}

/// The read and classified source.
#[derive(Debug, Clone)]
pub struct Source {
    /// The file format.
    pub format: Format,
    /// The architecture (`architectures[0]` or `model_type`).
    pub architecture: String,
    /// The source's precision.
    pub precision: Precision,
    /// Encoders beside the language model, from the config.
    pub towers: Vec<Tower>,
    /// Whether the output head shares the embedding's weights.
    pub tied_embeddings: bool,
    /// Every tensor, by name.
    pub tensors: Vec<SourceTensor>,
}

impl Source {
    /// Reads `checkpoint`'s tensor list and config. Quantized sources whose scheme MLX does not
    /// hold (FP8 with block scales, ModelOpt or compressed-tensors NVFP4, GPTQ, AWQ …) are
    /// refused by name rather than misread.
    pub fn read(checkpoint: &Checkpoint) -> Result<Source> {
        let config = checkpoint.config();
        if let Some(section) = config.get("quantization_config")
            && let Some(method) = section.get("quant_method").and_then(Value::as_str)
        {
            let format = section.get("format").and_then(Value::as_str);
            let algorithm = section.get("quant_algo").and_then(Value::as_str);
            let readable = method == "fp8"
                || (method == "modelopt" && algorithm == Some("NVFP4"))
                || (method == "compressed-tensors"
                    && matches!(format, Some("float-quantized" | "nvfp4-pack-quantized")));
            if !readable {
                let what = format.map_or(method.to_string(), |f| format!("{method} ({f})"));
                return Err(Error::Config(format!(
                    "the source is quantized with `{what}`, which create cannot read yet \
                     (it reads floating-point, FP8, GGUF and MLX-quantized checkpoints)"
                )));
            }
        }
        let mut tensors = Vec::new();
        for name in checkpoint.names() {
            let shape = checkpoint.shape(&name)?;
            let stored = checkpoint.stored_as(&name)?;
            tensors.push(SourceTensor {
                name,
                shape,
                stored,
            });
        }
        let precision = match checkpoint.format() {
            Format::Gguf => Precision::Gguf,
            Format::Safetensors if tensors.iter().any(|t| matches!(t.stored, Stored::Mlx(_))) => {
                Precision::MlxQuantized
            }
            Format::Safetensors if tensors.iter().any(|t| t.stored == Stored::Fp8) => {
                Precision::Fp8(dominant_float(&tensors))
            }
            Format::Safetensors
                if tensors.iter().any(|t| {
                    t.stored == Stored::Nvfp4
                        || matches!(t.stored, Stored::Mlx(s) if s.mode == QuantMode::Nvfp4)
                }) =>
            {
                Precision::Nvfp4(dominant_float(&tensors))
            }
            Format::Safetensors => Precision::Float(dominant_float(&tensors)),
        };
        let text_config = config.get("text_config").unwrap_or(config);
        let tied_embeddings = [config, text_config].iter().any(|c| {
            c.get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false)
        }) || !tensors.iter().any(|t| t.name == "lm_head.weight");
        let mut towers = Vec::new();
        if config.get("vision_config").is_some() {
            towers.push(Tower::Vision);
        }
        if config.get("audio_config").is_some() {
            towers.push(Tower::Audio);
        }
        let architecture = config
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .or_else(|| config.get("model_type").and_then(Value::as_str))
            .unwrap_or("unknown")
            .to_string();
        Ok(Source {
            format: checkpoint.format(),
            architecture,
            precision,
            towers,
            tied_embeddings,
            tensors,
        })
    }

    /// The dtype quantization runs in and kept tensors are written in: the source's own for
    /// floating-point sources (mlx-lm's choice: bf16 weights get bf16 scales), f16 for GGUF and
    /// MLX-quantized ones (GGUF keeps its scales in f16).
    pub fn compute_dtype(&self) -> Dtype {
        match self.precision {
            Precision::Float(dtype) | Precision::Fp8(dtype) | Precision::Nvfp4(dtype) => dtype,
            Precision::MlxQuantized | Precision::Gguf => Dtype::F16,
        }
    }

    /// The precision as a label: `BF16`, `MLX-quantized`, `GGUF`.
    pub fn precision_label(&self) -> String {
        match self.precision {
            Precision::Float(dtype) => format!("{dtype:?}").to_uppercase(),
            Precision::MlxQuantized => "MLX-quantized".into(),
            Precision::Gguf => "GGUF".into(),
            Precision::Fp8(_) => "FP8".into(),
            Precision::Nvfp4(_) => "NVFP4".into(),
        }
    }

    /// The target a create without `--quantize` gets: FP8 sources become `mxfp8` and NVFP4
    /// ones `nvfp4` (the nearest MLX layouts; kept as they are they would load as full-width
    /// floats), others none.
    pub fn default_target(&self) -> Option<super::Target> {
        match self.precision {
            Precision::Fp8(_) => Some(super::Target::Mxfp8),
            Precision::Nvfp4(_) => Some(super::Target::Nvfp4),
            _ => None,
        }
    }
}

/// The float dtype holding the most elements (f32 when there are none).
fn dominant_float(tensors: &[SourceTensor]) -> Dtype {
    let mut totals: Vec<(Dtype, u64)> = Vec::new();
    for t in tensors {
        if let Stored::Float(dtype) = t.stored
            && dtype.is_float()
        {
            let n = t
                .shape
                .iter()
                .map(|&d| u64::try_from(d).unwrap_or(0))
                .product::<u64>();
            match totals.iter_mut().find(|(d, _)| *d == dtype) {
                Some((_, total)) => *total += n,
                None => totals.push((dtype, n)),
            }
        }
    }
    totals
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map_or(Dtype::F32, |(dtype, _)| dtype)
}
