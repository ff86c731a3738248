//! What every family's config reader shares: typed access to `config.json` that names the
//! field at fault (`Fields`), bounds on sizes (`limits`), and the keys several families
//! spell alike (rotary embeddings in transformers 4's `rope_theta` and `rope_scaling` or 5's
//! `rope_parameters`, `layer_types`, `sliding_window`, `tie_word_embeddings`). A field that
//! changes the numbers — the rope base above all — is never defaulted silently: its absence is
//! an error naming it.

use serde_json::Value;

use crate::rope::{RopeConfig, RopeScaling};
use crate::{Error, Result};

/// Typed access to a JSON object that names what is missing or wrong; every family's config
/// reader uses it.
pub(crate) struct Fields<'a> {
    pub(crate) object: &'a Value,
}

impl<'a> Fields<'a> {
    /// The model's own section of a config: `text_config` for a multimodal checkpoint, the
    /// whole config otherwise.
    pub(crate) fn text_section(config: &'a Value) -> Fields<'a> {
        let root = Fields { object: config };
        Fields {
            object: root.get("text_config").unwrap_or(config),
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.object.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    Error::Config(format!("`{key}` must be a non-negative integer, got {v}"))
                }),
        }
    }

    pub(crate) fn required_usize(&self, key: &str) -> Result<usize> {
        self.usize(key)?.ok_or_else(|| missing(key))
    }

    /// A size no larger than `limit`: checked before anything is allocated from it, so a config
    /// that claims 10¹⁵ layers is refused by name instead of aborting the process.
    pub(crate) fn bounded(&self, key: &str, limit: usize) -> Result<Option<usize>> {
        match self.usize(key)? {
            Some(n) if n > limit => Err(Error::Config(format!(
                "`{key}` = {n} is beyond any model this runtime loads (at most {limit})"
            ))),
            n => Ok(n),
        }
    }

    pub(crate) fn required_bounded(&self, key: &str, limit: usize) -> Result<usize> {
        self.bounded(key, limit)?.ok_or_else(|| missing(key))
    }

    /// `num_attention_heads` and `num_key_value_heads` (multi-head attention, transformers'
    /// own default, when the latter is absent), checked to share evenly.
    pub(crate) fn attention_heads(&self) -> Result<(usize, usize)> {
        let heads = self.required_bounded("num_attention_heads", limits::HEADS)?;
        let kv_heads = self
            .bounded("num_key_value_heads", limits::HEADS)?
            .unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(Error::Config(format!(
                "{heads} attention heads cannot share {kv_heads} key/value heads"
            )));
        }
        Ok((heads, kv_heads))
    }

    /// `hidden_size / heads`, for families whose heads always split the residual width.
    pub(crate) fn even_head_dim(hidden_size: usize, heads: usize) -> Result<usize> {
        if !hidden_size.is_multiple_of(heads) {
            return Err(Error::Config(format!(
                "{heads} attention heads do not split a hidden size of {hidden_size}"
            )));
        }
        Ok(hidden_size / heads)
    }

    /// `layer_types`: whether each of the model's `layers` layers attends to a sliding window
    /// (`sliding_attention`) rather than to everything (`full_attention`); `None` when the
    /// config does not list them.
    pub(crate) fn layer_types(&self, layers: usize) -> Result<Option<Vec<bool>>> {
        let Some(types) = self.get("layer_types") else {
            return Ok(None);
        };
        let list = types
            .as_array()
            .ok_or_else(|| Error::Config("`layer_types` must be a list".into()))?;
        if list.len() != layers {
            return Err(Error::Config(format!(
                "`layer_types` lists {} layers, the model has {layers}",
                list.len()
            )));
        }
        list.iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(Error::Config(format!("unsupported layer type {t}"))),
            })
            .collect::<Result<_>>()
            .map(Some)
    }

    /// Each layer's attention window: `sliding_window` on the layers that slide, `None` on the
    /// others; a sliding layer without a window is an error naming the field.
    pub(crate) fn layer_windows(&self, sliding: &[bool]) -> Result<Vec<Option<usize>>> {
        let window = self.bounded("sliding_window", limits::POSITIONS)?;
        sliding
            .iter()
            .map(|&slides| match (slides, window) {
                (true, None) => Err(missing("sliding_window")),
                (slides, window) => Ok(window.filter(|_| slides)),
            })
            .collect()
    }

    pub(crate) fn f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| Error::Config(format!("`{key}` must be a number, got {v}"))),
        }
    }

    pub(crate) fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| Error::Config(format!("`{key}` must be true or false, got {v}"))),
        }
    }

    pub(crate) fn str(&self, key: &str) -> Option<&'a str> {
        self.get(key).and_then(Value::as_str)
    }
}

/// Upper bounds on sizes read from a config, each well above the largest published model's
/// (hidden 18,432 and 163,840-entry vocabularies at the time of writing; 512 experts) so that
/// no real checkpoint is refused, while a lying config cannot size an allocation.
pub(crate) mod limits {
    /// Decoder layers.
    pub const LAYERS: usize = 1024;
    /// Residual width, and head width.
    pub const HIDDEN: usize = 1 << 17;
    /// Attention heads (query or key/value).
    pub const HEADS: usize = 1024;
    /// Feed-forward width (dense or per expert).
    pub const INTERMEDIATE: usize = 1 << 20;
    /// Vocabulary entries.
    pub const VOCAB: usize = 1 << 22;
    /// Experts per MoE layer.
    pub const EXPERTS: usize = 1 << 14;
    /// Positions: the longest context, sliding windows.
    pub const POSITIONS: usize = 1 << 30;
}

/// A size from a config as the `i32` MLX shapes take, or an error naming the field.
pub(crate) fn dim(value: usize, name: &str) -> Result<i32> {
    i32::try_from(value).map_err(|_| Error::Config(format!("`{name}` = {value} is too large")))
}

/// `tie_word_embeddings` of the text section, else of the whole config (where multimodal
/// checkpoints may keep it); `None` when both are silent.
pub(crate) fn tie_word_embeddings(config: &Value) -> Result<Option<bool>> {
    let key = "tie_word_embeddings";
    let text = Fields::text_section(config).bool(key)?;
    Ok(text.or(Fields { object: config }.bool(key)?))
}

/// The family a config names: its text section's `model_type`, else the top level's.
pub fn model_type(config: &Value) -> Result<String> {
    let text = Fields::text_section(config);
    let root = Fields { object: config };
    text.str("model_type")
        .or_else(|| root.str("model_type"))
        .map(str::to_string)
        .ok_or_else(|| missing("model_type"))
}

pub(crate) fn missing(key: &str) -> Error {
    Error::Config(format!("required field `{key}` is missing"))
}

/// Reads the global and (for models with two) local rotary embeddings.
pub(crate) fn read_rope(f: &Fields<'_>, dims: i32) -> Result<(RopeConfig, Option<RopeConfig>)> {
    if let Some(params) = f.get("rope_parameters") {
        let params_fields = Fields { object: params };
        // transformers 5 nests per-layer-type parameters for models with two kinds of layers.
        if let Some(full) = params_fields.get("full_attention") {
            let global = rope_from_parameters(full, dims)?;
            let local = params_fields
                .get("sliding_attention")
                .map(|p| rope_from_parameters(p, dims))
                .transpose()?;
            return Ok((global, local));
        }
        return Ok((rope_from_parameters(params, dims)?, None));
    }
    let base = f.f64("rope_theta")?.ok_or_else(|| missing("rope_theta"))?;
    let scaling = match f.get("rope_scaling") {
        Some(s) => read_scaling(s)?,
        None => RopeScaling::None,
    };
    Ok((
        RopeConfig {
            base,
            dims,
            traditional: false,
            scaling,
        },
        None,
    ))
}

pub(crate) fn rope_from_parameters(params: &Value, dims: i32) -> Result<RopeConfig> {
    let p = Fields { object: params };
    let base = p
        .f64("rope_theta")?
        .ok_or_else(|| missing("rope_parameters.rope_theta"))?;
    Ok(RopeConfig {
        base,
        dims,
        traditional: false,
        scaling: read_scaling(params)?,
    })
}

pub(crate) fn read_scaling(value: &Value) -> Result<RopeScaling> {
    let s = Fields { object: value };
    let kind = s
        .str("rope_type")
        .or_else(|| s.str("type"))
        .unwrap_or("default");
    let factor = || {
        s.f64("factor")?
            .ok_or_else(|| missing("rope_scaling.factor"))
    };
    let original = || {
        s.f64("original_max_position_embeddings")?
            .ok_or_else(|| missing("rope_scaling.original_max_position_embeddings"))
    };
    Ok(match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "llama3" => RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: s
                .f64("low_freq_factor")?
                .ok_or_else(|| missing("rope_scaling.low_freq_factor"))?,
            high_freq_factor: s
                .f64("high_freq_factor")?
                .ok_or_else(|| missing("rope_scaling.high_freq_factor"))?,
            original_max_position_embeddings: original()?,
        },
        "yarn" => RopeScaling::Yarn {
            factor: factor()?,
            original_max_position_embeddings: original()?,
            beta_fast: s.f64("beta_fast")?.unwrap_or(32.0),
            beta_slow: s.f64("beta_slow")?.unwrap_or(1.0),
            mscale: s.f64("mscale")?.unwrap_or(1.0),
            mscale_all_dim: s.f64("mscale_all_dim")?.unwrap_or(0.0),
            truncate: s.bool("truncate")?.unwrap_or(true),
        },
        "gguf_rope_freqs" => {
            let factors = s
                .get("frequency_factors")
                .and_then(Value::as_array)
                .ok_or_else(|| missing("rope_scaling.frequency_factors"))?;
            RopeScaling::Factors(
                factors
                    .iter()
                    .map(|f| {
                        f.as_f64().ok_or_else(|| {
                            Error::Config(format!(
                                "a rope frequency factor must be a number, got {f}"
                            ))
                        })
                    })
                    .collect::<Result<_>>()?,
            )
        }
        "proportional" => RopeScaling::Proportional {
            rotated_fraction: s.f64("partial_rotary_factor")?.unwrap_or(1.0),
            factor: s.f64("factor")?.unwrap_or(1.0),
        },
        other => return Err(Error::Config(format!("unsupported rope scaling `{other}`"))),
    })
}
