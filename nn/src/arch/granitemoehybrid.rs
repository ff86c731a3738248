//! Granite 4.0 hybrids (IBM, `granitemoehybrid`): Mamba-2 mixers and attention, each layer
//! followed by a mixture of experts beside a shared MLP, with μP multipliers.
//!
//! Most layers mix tokens with a Mamba-2 mixer ([`crate::mamba2`]); the others attend, with
//! rotary embeddings only when `position_embedding_type` is `rope` (the released hybrids use
//! none). Every layer's feed-forward sums a routed mixture of SwiGLU experts (top-k by router
//! logit, softmax over those k) and a shared SwiGLU MLP (`input_linear` holds gate then up).
//! The multipliers: embeddings times `embedding_multiplier`, each residual branch times
//! `residual_multiplier`, attention logits scaled by `attention_multiplier` instead of
//! `head_dim^-½`, output logits divided by `logits_scaling`.
//!
//! Reference: transformers' `models/granitemoehybrid/modeling_granitemoehybrid.py` (5.24).

use kvcache::{LayerCache, LogicalMask};
use mlx::Array;
use serde_json::Value;

use crate::activation::Activation;
use crate::attention::{Attention, AttentionParts};
use crate::cached_attention::{BatchPositions, attend_cached, check_cache_sets};
use crate::config::{Fields, dim, limits, missing, read_rope};
use crate::embedding::Embedding;
use crate::linear::Linear;
use crate::mamba2::{Mamba2Config, Mamba2Mixer};
use crate::mlp::Mlp;
use crate::model::{Batch, Forward, LayerState, Model, ModelSpec, check_depth};
use crate::moe::{Moe, RouterScoring, StackedExperts};
use crate::rms_norm::RmsNorm;
use crate::rope::{Rope, RopeConfig};
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The hyperparameters of a Granite 4.0 hybrid.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `model_type`.
    pub model_type: String,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size`: each expert's width.
    pub intermediate_size: usize,
    /// `shared_intermediate_size`.
    pub shared_intermediate_size: usize,
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f32,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `tie_word_embeddings`; `None` when silent (no `lm_head` then means tied).
    pub tie_word_embeddings: Option<bool>,
    /// `layer_types` (or `layers_block_type`): which layers are Mamba mixers.
    pub mamba_layers: Vec<bool>,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `num_key_value_heads`.
    pub num_key_value_heads: usize,
    /// `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    /// The rotary embedding, when `position_embedding_type` is `rope`.
    pub rope: Option<RopeConfig>,
    /// `attention_bias`.
    pub attention_bias: bool,
    /// `num_local_experts` (0: only the shared MLP) and `num_experts_per_tok`.
    pub experts: (usize, usize),
    /// `embedding_multiplier`.
    pub embedding_multiplier: f32,
    /// `residual_multiplier`.
    pub residual_multiplier: f32,
    /// `attention_multiplier`.
    pub attention_multiplier: f32,
    /// `logits_scaling`.
    pub logits_scaling: f32,
    /// The Mamba-2 mixers.
    pub mamba: Mamba2Config,
}

impl Config {
    /// Reads the config.
    pub fn from_json(config: &Value) -> Result<Config> {
        let f = Fields::text_section(config);
        let model_type = f
            .str("model_type")
            .ok_or_else(|| missing("model_type"))?
            .to_string();
        let hidden_size = f.required_bounded("hidden_size", limits::HIDDEN)?;
        let layers = f.required_bounded("num_hidden_layers", limits::LAYERS)?;
        let (heads, kv_heads) = f.attention_heads()?;
        let head_dim = Fields::even_head_dim(hidden_size, heads)?;
        let types = f
            .get("layer_types")
            .or_else(|| f.get("layers_block_type"))
            .ok_or_else(|| missing("layer_types"))?
            .as_array()
            .ok_or_else(|| Error::Config("`layer_types` must be a list".into()))?;
        if types.len() != layers {
            return Err(Error::Config(format!(
                "`layer_types` lists {} layers, the model has {layers}",
                types.len()
            )));
        }
        let mamba_layers = types
            .iter()
            .map(|t| match t.as_str() {
                Some("mamba" | "linear_attention") => Ok(true),
                Some("attention" | "full_attention") => Ok(false),
                _ => Err(Error::Config(format!("unsupported layer type {t}"))),
            })
            .collect::<Result<Vec<_>>>()?;
        let rope = match f.str("position_embedding_type") {
            Some("rope") => Some(read_rope(&f, dim(head_dim, "head_dim")?)?.0),
            _ => None,
        };
        let experts = f
            .bounded("num_local_experts", limits::EXPERTS)?
            .unwrap_or(0);
        let top_k = if experts > 0 {
            let k = f.required_usize("num_experts_per_tok")?;
            if k == 0 || k > experts {
                return Err(Error::Config(format!(
                    "`num_experts_per_tok` = {k} must be between 1 and the {experts} experts"
                )));
            }
            k
        } else {
            0
        };
        let rms_norm_eps = f
            .f64("rms_norm_eps")?
            .ok_or_else(|| missing("rms_norm_eps"))? as f32;
        let mamba_heads = f.required_bounded("mamba_n_heads", limits::HEADS)?;
        let expand = f.bounded("mamba_expand", 16)?.unwrap_or(2);
        let inner = expand * hidden_size;
        let mamba_head_dim = match f.bounded("mamba_d_head", limits::HIDDEN)? {
            Some(d) => d,
            None if mamba_heads > 0 && inner % mamba_heads == 0 => inner / mamba_heads,
            None => return Err(missing("mamba_d_head")),
        };
        if mamba_heads * mamba_head_dim != inner {
            return Err(Error::Config(format!(
                "{mamba_heads} Mamba heads of {mamba_head_dim} do not fill mamba_expand · \
                 hidden_size = {inner}"
            )));
        }
        let mamba = Mamba2Config {
            hidden_size,
            heads: mamba_heads,
            head_dim: mamba_head_dim,
            groups: f.bounded("mamba_n_groups", limits::HEADS)?.unwrap_or(1),
            state_size: f.required_bounded("mamba_d_state", limits::HIDDEN)?,
            conv_kernel: f.bounded("mamba_d_conv", 64)?.unwrap_or(4),
            conv_bias: f.bool("mamba_conv_bias")?.unwrap_or(true),
            projection_bias: f.bool("mamba_proj_bias")?.unwrap_or(false),
            norm_eps: rms_norm_eps,
            dt_limit: read_limit(&f)?,
        };
        mamba.check()?;
        let multiplier = |key: &str| -> Result<f32> { Ok(f.f64(key)?.unwrap_or(1.0) as f32) };
        Ok(Config {
            model_type,
            hidden_size,
            intermediate_size: f.required_bounded("intermediate_size", limits::INTERMEDIATE)?,
            shared_intermediate_size: f
                .required_bounded("shared_intermediate_size", limits::INTERMEDIATE)?,
            vocab_size: f.required_bounded("vocab_size", limits::VOCAB)?,
            rms_norm_eps,
            max_position_embeddings: f
                .bounded("max_position_embeddings", limits::POSITIONS)?
                .ok_or_else(|| missing("max_position_embeddings"))?,
            tie_word_embeddings: f.bool("tie_word_embeddings")?,
            mamba_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rope,
            attention_bias: f.bool("attention_bias")?.unwrap_or(false),
            experts: (experts, top_k),
            embedding_multiplier: multiplier("embedding_multiplier")?,
            residual_multiplier: multiplier("residual_multiplier")?,
            attention_multiplier: multiplier("attention_multiplier")?,
            logits_scaling: multiplier("logits_scaling")?,
            mamba,
        })
    }

    /// What the engine needs to know of the model.
    pub fn spec(&self) -> ModelSpec {
        ModelSpec {
            model_type: self.model_type.clone(),
            vocab_size: self.vocab_size,
            context_length: self.max_position_embeddings,
            layers: self
                .mamba_layers
                .iter()
                .map(|&m| {
                    if m {
                        LayerState::Recurrent {
                            state: self.mamba.recurrent(),
                        }
                    } else {
                        LayerState::Attention {
                            kv_heads: self.num_key_value_heads,
                            head_dim: self.head_dim,
                            window: None,
                        }
                    }
                })
                .collect(),
        }
    }
}

/// `time_step_limit`: `[low, high]`, each a number or transformers' spelling of infinity
/// (`{"__float__": "Infinity"}`); `(0, ∞)` when absent.
fn read_limit(f: &Fields<'_>) -> Result<(f32, f32)> {
    let Some(limit) = f.get("time_step_limit") else {
        return Ok((0.0, f32::INFINITY));
    };
    let bound = |v: &Value| -> Result<f32> {
        if let Some(n) = v.as_f64() {
            return Ok(n as f32);
        }
        match v.get("__float__").and_then(Value::as_str) {
            Some("Infinity" | "inf") => Ok(f32::INFINITY),
            _ => Err(Error::Config(format!("`time_step_limit` holds {v}"))),
        }
    };
    match limit.as_array().map(Vec::as_slice) {
        Some([low, high]) => Ok((bound(low)?, bound(high)?)),
        _ => Err(Error::Config("`time_step_limit` must be a pair".into())),
    }
}

/// How a layer mixes tokens.
enum Mixer {
    /// `mamba`.
    Mamba(Box<Mamba2Mixer>),
    /// `self_attn`.
    Attention(Box<Attention>),
}

/// One decoder layer.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    mixer: Mixer,
    post_attention_layernorm: RmsNorm,
    /// `block_sparse_moe`, when the model has experts.
    block_sparse_moe: Option<Moe>,
    shared_mlp: Mlp,
}

/// A Granite 4.0 hybrid.
pub struct GraniteMoeHybrid {
    spec: ModelSpec,
    config: Config,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl GraniteMoeHybrid {
    /// Builds the model from transformers-named weights.
    pub fn new(config: Config, weights: &mut Weights) -> Result<GraniteMoeHybrid> {
        let hidden = dim(config.hidden_size, "hidden_size")?;
        let vocab = dim(config.vocab_size, "vocab_size")?;
        let eps = config.rms_norm_eps;
        let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(weights.dense(name, &[hidden])?, eps))
        };
        let embed_name = "model.embed_tokens.weight";
        let embed_weight = weights.table(embed_name)?;
        check_matrix(embed_name, &embed_weight, vocab, hidden)?;
        let embed_tokens = Embedding::new(embed_weight).with_packed(weights.packed(embed_name)?);
        let rope = config.rope.as_ref().map(Rope::new).transpose()?;

        let mut layers = Vec::with_capacity(config.mamba_layers.len());
        for (i, &mamba) in config.mamba_layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let mixer = if mamba {
                Mixer::Mamba(Box::new(Mamba2Mixer::new(
                    &config.mamba,
                    weights,
                    &format!("{p}.mamba"),
                )?))
            } else {
                Mixer::Attention(Box::new(attention(
                    &config,
                    weights,
                    &format!("{p}.self_attn"),
                    rope.clone(),
                )?))
            };
            let shared = dim(config.shared_intermediate_size, "shared_intermediate_size")?;
            layers.push(DecoderLayer {
                input_layernorm: norm(weights, &format!("{p}.input_layernorm.weight"))?,
                mixer,
                post_attention_layernorm: norm(
                    weights,
                    &format!("{p}.post_attention_layernorm.weight"),
                )?,
                block_sparse_moe: experts(&config, weights, &format!("{p}.block_sparse_moe"))?,
                shared_mlp: shared_mlp(weights, &format!("{p}.shared_mlp"), shared, hidden)?,
            });
        }
        let final_norm = norm(weights, "model.norm.weight")?;
        let lm_head = embed_tokens.output_head(
            weights,
            config.tie_word_embeddings,
            "lm_head",
            vocab,
            hidden,
        )?;
        Ok(GraniteMoeHybrid {
            spec: config.spec(),
            config,
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
        })
    }
}

/// The attention of an attention layer, its logits scaled by `attention_multiplier`.
fn attention(c: &Config, weights: &mut Weights, p: &str, rope: Option<Rope>) -> Result<Attention> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let heads = dim(c.num_attention_heads, "num_attention_heads")?;
    let kv_heads = dim(c.num_key_value_heads, "num_key_value_heads")?;
    let head_dim = dim(c.head_dim, "head_dim")?;
    let projection = |weights: &mut Weights, name: &str, out: i32, inp: i32| {
        weights.projection(&format!("{p}.{name}"), out, inp, c.attention_bias)
    };
    Ok(AttentionParts::new(
        projection(weights, "q_proj", heads * head_dim, hidden)?,
        projection(weights, "k_proj", kv_heads * head_dim, hidden)?,
        projection(weights, "v_proj", kv_heads * head_dim, hidden)?,
        projection(weights, "o_proj", hidden, heads * head_dim)?,
        heads,
        kv_heads,
        head_dim,
    )
    .with_rope(rope)
    .with_scale(c.attention_multiplier)
    .build())
}

/// The shared MLP under `p`: `input_linear` (gate rows first) and `output_linear`, or gate and
/// up apart (`gate_proj`, `up_proj`: a GGUF file, whose converter splits them).
fn shared_mlp(weights: &mut Weights, p: &str, width: i32, hidden: i32) -> Result<Mlp> {
    let down = weights.matrix(&format!("{p}.output_linear"), hidden, width)?;
    if weights.contains(&format!("{p}.input_linear.weight")) {
        let gate_up = weights.matrix(&format!("{p}.input_linear"), 2 * width, hidden)?;
        return Mlp::from_fused(gate_up, down, Activation::Silu);
    }
    Mlp::new(
        weights.matrix(&format!("{p}.gate_proj"), width, hidden)?,
        weights.matrix(&format!("{p}.up_proj"), width, hidden)?,
        down,
        Activation::Silu,
    )
}

/// The routed experts under `p` (`router.layer`, `input_linear` `[E, 2I, H]` with gate rows
/// first, `output_linear` `[E, H, I]`); `None` for a model without experts.
fn experts(c: &Config, weights: &mut Weights, p: &str) -> Result<Option<Moe>> {
    let (count, top_k) = c.experts;
    if count == 0 {
        return Ok(None);
    }
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let experts = dim(count, "num_local_experts")?;
    let inter = dim(c.intermediate_size, "intermediate_size")?;
    let router = weights.matrix(&format!("{p}.router.layer"), experts, hidden)?;
    if !weights.contains(&format!("{p}.input_linear.weight")) {
        // Gate and up stacks apart (a GGUF file: llama.cpp's converter splits them).
        let stacked = |weights: &mut Weights, which: &str| {
            StackedExperts::load(
                weights,
                &format!("{p}.experts"),
                which,
                count,
                inter,
                hidden,
            )
        };
        let down = StackedExperts::load(weights, p, "output_linear", count, hidden, inter)?;
        return Ok(Some(Moe::new(
            router,
            stacked(weights, "gate_proj")?,
            stacked(weights, "up_proj")?,
            down,
            top_k,
            false,
            RouterScoring::SoftmaxOverTopK,
            Activation::Silu,
        )?));
    }
    let gate_up = weights.weight(&format!("{p}.input_linear.weight"))?;
    let down = weights.weight(&format!("{p}.output_linear.weight"))?;
    for (name, tensor, shape) in [
        ("input_linear", &gate_up, [experts, 2 * inter, hidden]),
        ("output_linear", &down, [experts, hidden, inter]),
    ] {
        if let crate::linear::Tensor::Dense(a) = tensor
            && a.shape() != shape
        {
            return Err(Error::Weights(format!(
                "`{p}.{name}.weight` has shape {:?}, expected {shape:?}",
                a.shape()
            )));
        }
    }
    Ok(Some(Moe::from_fused(
        router,
        StackedExperts::new(gate_up),
        StackedExperts::new(down),
        top_k,
        false,
        RouterScoring::SoftmaxOverTopK,
        Activation::Silu,
    )?))
}

impl Model for GraniteMoeHybrid {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// A Mamba layer's state cannot rewind past a forward; `slack` only concerns sliding
    /// windows, which this family has none of.
    fn forward_rows(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        self.forward_rows_through(batch, caches, self.layers.len())
    }

    fn forward_rows_through(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
        layers: usize,
    ) -> Result<Forward> {
        check_depth(layers, self.layers.len())?;
        check_cache_sets(batch, caches, self.layers.len())?;
        let positions = BatchPositions::new(batch)?;
        let residual = self.config.residual_multiplier;
        let mut h = self
            .embed_tokens
            .forward(&batch.tokens)?
            .multiply(self.config.embedding_multiplier)?;
        for (i, layer) in self.layers.iter().enumerate().take(layers) {
            let x = layer.input_layernorm.forward(&h)?;
            let mixed = match &layer.mixer {
                Mixer::Mamba(mixer) => mixer.forward(&x, caches, i)?,
                Mixer::Attention(attention) => {
                    let projected = attention.project(&x, positions.rope())?;
                    attend_cached(
                        attention,
                        &projected,
                        caches,
                        i,
                        &batch.positions,
                        LogicalMask::Causal,
                    )?
                }
            };
            h = h.add(&mixed.multiply(residual)?)?;
            let x = layer.post_attention_layernorm.forward(&h)?;
            let mut ff = layer.shared_mlp.forward(&x)?;
            if let Some(moe) = &layer.block_sparse_moe {
                ff = ff.add(&moe.forward(&x)?)?;
            }
            h = h.add(&ff.multiply(residual)?)?;
        }
        Ok(Forward {
            hidden: self.norm.forward(&h)?,
            conditioning: None,
        })
    }

    fn unembed(&self, hidden: &Array) -> Result<Array> {
        Ok(self
            .lm_head
            .forward(hidden)?
            .divide(self.config.logits_scaling)?)
    }

    fn parameters(&self) -> Vec<Array> {
        let mut out = Vec::new();
        self.embed_tokens.collect_arrays(&mut out);
        for layer in &self.layers {
            layer.input_layernorm.collect_arrays(&mut out);
            match &layer.mixer {
                Mixer::Mamba(mixer) => mixer.collect_arrays(&mut out),
                Mixer::Attention(attention) => attention.collect_arrays(&mut out),
            }
            layer.post_attention_layernorm.collect_arrays(&mut out);
            if let Some(moe) = &layer.block_sparse_moe {
                moe.collect_arrays(&mut out);
            }
            layer.shared_mlp.collect_arrays(&mut out);
        }
        self.norm.collect_arrays(&mut out);
        self.lm_head.collect_arrays(&mut out);
        out
    }
}
