//! Reading a model's `config.json` into the hyperparameters the architectures need.
//!
//! Both transformers 4 and 5 spellings are accepted (`rope_theta` or `rope_parameters`,
//! `num_experts` or `num_local_experts`, `sliding_window_pattern` or `_sliding_window_pattern`
//! or `layer_types`). A field that changes the numbers — the rope base above all — is never
//! defaulted silently: its absence is an error naming it.

use serde_json::Value;

use crate::rope::{RopeConfig, RopeScaling};
use crate::{Error, Result};

/// Whether a layer attends to everything before it or to a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerAttention {
    /// Causal attention over the whole history.
    Full,
    /// Causal attention over the last `window` positions.
    Sliding,
}

/// Mixture-of-experts hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Experts per MoE layer.
    pub num_experts: usize,
    /// Experts each token is routed to.
    pub experts_per_token: usize,
    /// Hidden size of each expert.
    pub expert_intermediate_size: usize,
    /// Renormalize the top-k router probabilities to sum to one.
    pub normalize_top_k: bool,
    /// Layers `i` with `(i + 1) % step == 0` are MoE layers.
    pub decoder_sparse_step: usize,
    /// Layers that keep a dense MLP.
    pub mlp_only_layers: Vec<usize>,
}

impl MoeConfig {
    /// Whether layer `layer` routes to experts (or keeps a dense MLP).
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer)
            && (layer + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

/// The hyperparameters of a decoder-only text model.
#[derive(Debug, Clone, PartialEq)]
pub struct TextConfig {
    /// The architecture family (`llama`, `qwen2`, `qwen3`, `qwen3_moe`, `gemma3_text`, …).
    pub model_type: String,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than query heads).
    pub num_kv_heads: usize,
    /// Features per head.
    pub head_dim: usize,
    /// Hidden size of the dense MLP.
    pub intermediate_size: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Norm epsilon.
    pub rms_norm_eps: f32,
    /// Longest context the model supports.
    pub max_position_embeddings: usize,
    /// Whether the output head reuses the embedding table; `None` when the config is silent
    /// (then the checkpoint decides: no `lm_head` means tied).
    pub tie_word_embeddings: Option<bool>,
    /// Rotary embedding of full-attention layers.
    pub rope: RopeConfig,
    /// Rotary embedding of sliding-window layers, when it differs (Gemma 3's local base).
    pub rope_local: Option<RopeConfig>,
    /// Attention kind per layer.
    pub layer_attention: Vec<LayerAttention>,
    /// The window of sliding layers.
    pub sliding_window: Option<usize>,
    /// Attention scale is `query_pre_attn_scalar^-0.5` instead of `head_dim^-0.5`.
    pub query_pre_attn_scalar: Option<f64>,
    /// `tanh` soft cap of attention logits.
    pub attn_logit_softcapping: Option<f32>,
    /// `tanh` soft cap of output logits.
    pub final_logit_softcapping: Option<f32>,
    /// The MLP activation (`silu` or `gelu_pytorch_tanh`, …).
    pub hidden_act: String,
    /// Mixture-of-experts settings, for MoE models.
    pub moe: Option<MoeConfig>,
}

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

pub(crate) fn missing(key: &str) -> Error {
    Error::Config(format!("required field `{key}` is missing"))
}

impl TextConfig {
    /// Parses a transformers `config.json` (text models, or the `text_config` of a multimodal
    /// one).
    pub fn from_json(value: &Value) -> Result<TextConfig> {
        let root = Fields { object: value };
        let value = root.get("text_config").unwrap_or(value);
        let f = Fields { object: value };
        let model_type = f
            .str("model_type")
            .or_else(|| root.str("model_type"))
            .ok_or_else(|| missing("model_type"))?
            .to_string();

        let hidden_size = f.required_bounded("hidden_size", limits::HIDDEN)?;
        let num_layers = f.required_bounded("num_hidden_layers", limits::LAYERS)?;
        let num_heads = f.required_bounded("num_attention_heads", limits::HEADS)?;
        // transformers' own default for an absent value: multi-head attention.
        let num_kv_heads = f
            .bounded("num_key_value_heads", limits::HEADS)?
            .unwrap_or(num_heads);
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(Error::Config(format!(
                "{num_heads} attention heads cannot share {num_kv_heads} key/value heads"
            )));
        }
        let head_dim = match f.bounded("head_dim", limits::HIDDEN)? {
            Some(d) => d,
            None if hidden_size % num_heads == 0 => hidden_size / num_heads,
            None => return Err(missing("head_dim")),
        };
        let vocab_size = f.required_bounded("vocab_size", limits::VOCAB)?;
        let intermediate_size = f.required_bounded("intermediate_size", limits::INTERMEDIATE)?;
        let rms_norm_eps = f
            .f64("rms_norm_eps")?
            .or(f.f64("layer_norm_eps")?)
            .ok_or_else(|| missing("rms_norm_eps"))? as f32;
        let max_position_embeddings = f
            .bounded("max_position_embeddings", limits::POSITIONS)?
            .unwrap_or(4096);

        let rotary_dims = match f.f64("partial_rotary_factor")? {
            Some(factor) if factor > 0.0 && factor <= 1.0 => {
                ((head_dim as f64 * factor) as i32) & !1
            }
            Some(factor) => {
                return Err(Error::Config(format!(
                    "`partial_rotary_factor` must be in (0, 1], got {factor}"
                )));
            }
            None => head_dim as i32,
        };
        let (rope, rope_local) = read_rope(&f, rotary_dims)?;

        let layer_attention = read_layer_types(&f, num_layers)?;
        let sliding_window = f.bounded("sliding_window", limits::POSITIONS)?;
        let uses_sliding = layer_attention.contains(&LayerAttention::Sliding);
        if uses_sliding && sliding_window.is_none() {
            return Err(missing("sliding_window"));
        }
        let rope_local = if uses_sliding {
            match rope_local {
                Some(local) => Some(local),
                None => match f.f64("rope_local_base_freq")? {
                    Some(base) => Some(RopeConfig {
                        base,
                        dims: rotary_dims,
                        traditional: false,
                        scaling: RopeScaling::None,
                    }),
                    None if model_type.starts_with("gemma3") => {
                        return Err(missing("rope_local_base_freq"));
                    }
                    None => None,
                },
            }
        } else {
            None
        };

        let moe = read_moe(&f, &model_type)?;
        let hidden_act = f
            .str("hidden_act")
            .or_else(|| f.str("hidden_activation"))
            .unwrap_or("silu")
            .to_string();

        Ok(TextConfig {
            model_type,
            hidden_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            intermediate_size,
            vocab_size,
            rms_norm_eps,
            max_position_embeddings,
            tie_word_embeddings: f
                .bool("tie_word_embeddings")?
                .or(root.bool("tie_word_embeddings")?),
            rope,
            rope_local,
            layer_attention,
            sliding_window: if uses_sliding { sliding_window } else { None },
            query_pre_attn_scalar: f.f64("query_pre_attn_scalar")?,
            attn_logit_softcapping: f.f64("attn_logit_softcapping")?.map(|v| v as f32),
            final_logit_softcapping: f.f64("final_logit_softcapping")?.map(|v| v as f32),
            hidden_act,
            moe,
        })
    }
}

impl TextConfig {
    /// What the engine needs to know of a decoder with these hyperparameters.
    pub fn spec(&self) -> crate::model::ModelSpec {
        use crate::model::LayerState;
        crate::model::ModelSpec {
            model_type: self.model_type.clone(),
            vocab_size: self.vocab_size,
            context_length: self.max_position_embeddings,
            parameters: self.parameter_count(),
            layers: (0..self.num_layers)
                .map(|i| LayerState::Attention {
                    kv_heads: self.num_kv_heads,
                    head_dim: self.head_dim,
                    window: match self.layer_attention.get(i) {
                        Some(LayerAttention::Sliding) => self.sliding_window,
                        _ => None,
                    },
                })
                .collect(),
        }
    }

    /// The number of parameters these hyperparameters describe (norms included, biases not).
    pub fn parameter_count(&self) -> u64 {
        let h = self.hidden_size as u64;
        let q = (self.num_heads * self.head_dim) as u64;
        let kv = (self.num_kv_heads * self.head_dim) as u64;
        let attention = h * q * 2 + h * kv * 2 + 2 * self.head_dim as u64;
        let dense = 3 * h * self.intermediate_size as u64;
        let layers: u64 = (0..self.num_layers)
            .map(|i| {
                let ff = match &self.moe {
                    Some(moe) if moe.is_moe_layer(i) => {
                        moe.num_experts as u64 * 3 * h * moe.expert_intermediate_size as u64
                            + h * moe.num_experts as u64
                    }
                    _ => dense,
                };
                attention + ff + 4 * h
            })
            .sum();
        let embedding = self.vocab_size as u64 * h;
        let head = if self.tie_word_embeddings == Some(true) {
            0
        } else {
            embedding
        };
        embedding + layers + h + head
    }
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
        "proportional" => RopeScaling::Proportional {
            rotated_fraction: s.f64("partial_rotary_factor")?.unwrap_or(1.0),
            factor: s.f64("factor")?.unwrap_or(1.0),
        },
        other => return Err(Error::Config(format!("unsupported rope scaling `{other}`"))),
    })
}

fn read_layer_types(f: &Fields<'_>, num_layers: usize) -> Result<Vec<LayerAttention>> {
    if let Some(sliding) = f.layer_types(num_layers)? {
        return Ok(sliding
            .into_iter()
            .map(|slides| {
                if slides {
                    LayerAttention::Sliding
                } else {
                    LayerAttention::Full
                }
            })
            .collect());
    }
    let pattern = match f.usize("sliding_window_pattern")? {
        Some(p) => Some(p),
        None => f.usize("_sliding_window_pattern")?,
    };
    Ok(match pattern {
        // Every `pattern`-th layer is global, the others slide.
        Some(p) if p > 0 => (0..num_layers)
            .map(|i| {
                if (i + 1) % p == 0 {
                    LayerAttention::Full
                } else {
                    LayerAttention::Sliding
                }
            })
            .collect(),
        _ => vec![LayerAttention::Full; num_layers],
    })
}

fn read_moe(f: &Fields<'_>, model_type: &str) -> Result<Option<MoeConfig>> {
    let num_experts = match f.bounded("num_experts", limits::EXPERTS)? {
        Some(n) => Some(n),
        None => f.bounded("num_local_experts", limits::EXPERTS)?,
    };
    let Some(num_experts) = num_experts.filter(|&n| n > 0) else {
        if model_type.contains("moe") {
            return Err(missing("num_experts"));
        }
        return Ok(None);
    };
    let mlp_only_layers = match f.get("mlp_only_layers") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .ok_or_else(|| Error::Config("`mlp_only_layers` must be a list".into()))?
            .iter()
            .map(|x| {
                x.as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| Error::Config("`mlp_only_layers` must hold integers".into()))
            })
            .collect::<Result<_>>()?,
    };
    let experts_per_token = f.required_usize("num_experts_per_tok")?;
    if experts_per_token == 0 || experts_per_token > num_experts {
        return Err(Error::Config(format!(
            "`num_experts_per_tok` = {experts_per_token} must be between 1 and the {num_experts} experts"
        )));
    }
    Ok(Some(MoeConfig {
        num_experts,
        experts_per_token,
        expert_intermediate_size: f
            .required_bounded("moe_intermediate_size", limits::INTERMEDIATE)?,
        normalize_top_k: f.bool("norm_topk_prob")?.unwrap_or(false),
        decoder_sparse_step: f.usize("decoder_sparse_step")?.unwrap_or(1).max(1),
        mlp_only_layers,
    }))
}
