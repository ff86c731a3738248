//! Llama 4 (text): interleaved rotary and position-free attention layers, chunked local
//! attention, and a mixture of experts beside a shared expert.
//!
//! Three of every four layers (`no_rope_layers[i] = 1`) turn queries and keys with rotary
//! embeddings in interleaved pairs, normalize them (an RMS norm without weights: it commutes
//! with the rotation) and attend only within chunks of `attention_chunk_size` positions. The
//! fourth uses no positions, attends to everything before it, and sharpens its queries with
//! position (`1 + attn_scale · ln(1 + ⌊(p + 1) / floor_scale⌋)`). Feed-forward blocks are
//! either dense SwiGLU MLPs (`intermediate_size_mlp`) or, on `moe_layers`, experts chosen by
//! top-k router logit whose *inputs* are scaled by the sigmoid of that logit, summed with a
//! shared expert. Checkpoints store experts as `[experts, dim, 2 · hidden]` (gate columns
//! first); they are turned to `[out, in]` at load.
//!
//! References: transformers' `models/llama4/modeling_llama4.py` (5.24); Meta, "The Llama 4
//! herd" (2025). In `Llama4ForConditionalGeneration` checkpoints the vision tower and
//! projector are set aside until images reach the model (issue 21).

use kvcache::{LayerCache, LogicalMask};
use mlx::{Array, Dtype};
use serde_json::Value;

use crate::activation::Activation;
use crate::attention::{Attention, AttentionParts};
use crate::cached_attention::{BatchPositions, attend_cached, check_cache_sets};
use crate::config::{Fields, dim, limits, missing, read_rope};
use crate::embedding::Embedding;
use crate::linear::{Linear, Tensor};
use crate::mlp::Mlp;
use crate::model::{Batch, Forward, LayerState, Model, ModelSpec, check_depth};
use crate::moe::{Moe, RouterScoring, SharedExpert, StackedExperts};
use crate::rms_norm::RmsNorm;
use crate::rope::{Rope, RopeConfig};
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The hyperparameters of a Llama 4 text model.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `model_type`.
    pub model_type: String,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size`: each expert's (and the shared expert's) width.
    pub intermediate_size: usize,
    /// `intermediate_size_mlp`: the dense layers' width.
    pub intermediate_size_mlp: usize,
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f32,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `tie_word_embeddings`; `None` when silent (no `lm_head` then means tied).
    pub tie_word_embeddings: Option<bool>,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `num_key_value_heads`.
    pub num_key_value_heads: usize,
    /// `head_dim`.
    pub head_dim: usize,
    /// The rotary embedding of rotary layers (interleaved pairs).
    pub rope: RopeConfig,
    /// `no_rope_layers`: whether each layer turns its queries and keys.
    pub rope_layers: Vec<bool>,
    /// `layer_types`: whether each layer attends within chunks.
    pub chunked_layers: Vec<bool>,
    /// `attention_chunk_size`.
    pub attention_chunk_size: Option<usize>,
    /// `moe_layers` (or every `interleave_moe_layer_step`-th layer): which layers are sparse.
    pub moe_layers: Vec<bool>,
    /// `num_local_experts`.
    pub num_local_experts: usize,
    /// `num_experts_per_tok`.
    pub num_experts_per_tok: usize,
    /// `use_qk_norm`.
    pub use_qk_norm: bool,
    /// `attn_temperature_tuning`, with `attn_scale` and `floor_scale`.
    pub temperature_tuning: Option<(f32, f32)>,
    /// `attention_bias`.
    pub attention_bias: bool,
    /// `hidden_act`.
    pub hidden_act: String,
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
        let head_dim = match f.bounded("head_dim", limits::HIDDEN)? {
            Some(d) => d,
            None if hidden_size % heads == 0 => hidden_size / heads,
            None => return Err(missing("head_dim")),
        };
        let mut rope = read_rope(&f, dim(head_dim, "head_dim")?)?.0;
        rope.traditional = true;
        let flags = |key: &str| -> Result<Option<Vec<bool>>> {
            let Some(list) = f.get(key) else {
                return Ok(None);
            };
            let list = list
                .as_array()
                .ok_or_else(|| Error::Config(format!("`{key}` must be a list")))?;
            if list.len() != layers {
                return Err(Error::Config(format!(
                    "`{key}` lists {} layers, the model has {layers}",
                    list.len()
                )));
            }
            list.iter()
                .map(|v| {
                    v.as_u64()
                        .map(|n| n != 0)
                        .ok_or_else(|| Error::Config(format!("`{key}` holds {v}")))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some)
        };
        let interval = f
            .bounded("no_rope_layer_interval", limits::LAYERS)?
            .unwrap_or(4)
            .max(1);
        let rope_layers = match flags("no_rope_layers")? {
            Some(list) => list,
            None => (0..layers).map(|i| (i + 1) % interval != 0).collect(),
        };
        let attention_chunk_size = f.bounded("attention_chunk_size", limits::POSITIONS)?;
        let chunked_layers = match f.get("layer_types") {
            Some(types) => {
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
                        Some("chunked_attention") => Ok(true),
                        Some("full_attention") => Ok(false),
                        _ => Err(Error::Config(format!("unsupported layer type {t}"))),
                    })
                    .collect::<Result<Vec<_>>>()?
            }
            None => rope_layers
                .iter()
                .map(|&rotary| rotary && attention_chunk_size.is_some())
                .collect(),
        };
        if chunked_layers.contains(&true) && attention_chunk_size.is_none_or(|c| c == 0) {
            return Err(missing("attention_chunk_size"));
        }
        let moe_layers = match f.get("moe_layers") {
            Some(list) => {
                let indices = list
                    .as_array()
                    .ok_or_else(|| Error::Config("`moe_layers` must be a list".into()))?
                    .iter()
                    .map(|v| {
                        v.as_u64()
                            .map(|n| n as usize)
                            .ok_or_else(|| Error::Config(format!("`moe_layers` holds {v}")))
                    })
                    .collect::<Result<Vec<_>>>()?;
                (0..layers).map(|i| indices.contains(&i)).collect()
            }
            None => {
                let step = f
                    .bounded("interleave_moe_layer_step", limits::LAYERS)?
                    .unwrap_or(1)
                    .max(1);
                (0..layers).map(|i| (i + 1) % step == 0).collect()
            }
        };
        let experts = f.required_bounded("num_local_experts", limits::EXPERTS)?;
        let top_k = f.required_usize("num_experts_per_tok")?;
        if experts == 0 || top_k == 0 || top_k > experts {
            return Err(Error::Config(format!(
                "`num_experts_per_tok` = {top_k} must be between 1 and the {experts} experts"
            )));
        }
        let temperature_tuning = if f.bool("attn_temperature_tuning")?.unwrap_or(true) {
            let floor = f.f64("floor_scale")?.unwrap_or(8192.0);
            if floor <= 0.0 {
                return Err(Error::Config("`floor_scale` must be positive".into()));
            }
            Some((f.f64("attn_scale")?.unwrap_or(0.1) as f32, floor as f32))
        } else {
            None
        };
        Ok(Config {
            model_type,
            hidden_size,
            intermediate_size: f.required_bounded("intermediate_size", limits::INTERMEDIATE)?,
            intermediate_size_mlp: f
                .required_bounded("intermediate_size_mlp", limits::INTERMEDIATE)?,
            vocab_size: f.required_bounded("vocab_size", limits::VOCAB)?,
            rms_norm_eps: f
                .f64("rms_norm_eps")?
                .ok_or_else(|| missing("rms_norm_eps"))? as f32,
            max_position_embeddings: f
                .bounded("max_position_embeddings", limits::POSITIONS)?
                .ok_or_else(|| missing("max_position_embeddings"))?,
            tie_word_embeddings: f.bool("tie_word_embeddings")?,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rope,
            rope_layers,
            chunked_layers,
            attention_chunk_size,
            moe_layers,
            num_local_experts: experts,
            num_experts_per_tok: top_k,
            use_qk_norm: f.bool("use_qk_norm")?.unwrap_or(true),
            temperature_tuning,
            attention_bias: f.bool("attention_bias")?.unwrap_or(false),
            hidden_act: f.str("hidden_act").unwrap_or("silu").to_string(),
        })
    }

    /// What the engine needs to know of the model.
    pub fn spec(&self) -> ModelSpec {
        ModelSpec {
            model_type: self.model_type.clone(),
            vocab_size: self.vocab_size,
            context_length: self.max_position_embeddings,
            // A chunked layer still keeps every key: the chunk it attends to moves.
            layers: vec![
                LayerState::Attention {
                    kv_heads: self.num_key_value_heads,
                    head_dim: self.head_dim,
                    window: None,
                };
                self.moe_layers.len()
            ],
        }
    }
}

/// A layer's feed-forward block (`feed_forward`).
enum FeedForward {
    Dense(Mlp),
    Sparse(Moe),
}

/// One decoder layer.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    feed_forward: FeedForward,
    rotary: bool,
    chunked: bool,
}

/// A Llama 4 text model.
pub struct Llama4 {
    spec: ModelSpec,
    config: Config,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl Llama4 {
    /// Builds the model from transformers-named weights (`model.…`, or
    /// `language_model.model.…` in a multimodal checkpoint).
    pub fn new(config: Config, weights: &mut Weights) -> Result<Llama4> {
        let hidden = dim(config.hidden_size, "hidden_size")?;
        let vocab = dim(config.vocab_size, "vocab_size")?;
        let eps = config.rms_norm_eps;
        let (root, head) = [
            ("model", "lm_head"),
            ("language_model.model", "language_model.lm_head"),
            ("model.language_model", "lm_head"),
        ]
        .into_iter()
        .find(|(root, _)| weights.contains(&format!("{root}.embed_tokens.weight")))
        .unwrap_or(("model", "lm_head"));
        for tower in [
            "vision_model.",
            "multi_modal_projector.",
            "model.vision_model.",
            "model.multi_modal_projector.",
        ] {
            weights.set_aside(tower);
        }
        let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(weights.dense(name, &[hidden])?, eps))
        };
        let embed_name = format!("{root}.embed_tokens.weight");
        let embed_weight = weights.table(&embed_name)?;
        check_matrix(&embed_name, &embed_weight, vocab, hidden)?;
        let embed_tokens = Embedding::new(embed_weight).with_packed(weights.packed(&embed_name)?);
        let activation = Activation::from_name(&config.hidden_act)?;
        let rope = Rope::new(&config.rope)?;

        let mut layers = Vec::with_capacity(config.moe_layers.len());
        for (i, &sparse) in config.moe_layers.iter().enumerate() {
            let p = format!("{root}.layers.{i}");
            let rotary = config.rope_layers[i];
            let feed_forward = if sparse {
                FeedForward::Sparse(experts(
                    &config,
                    weights,
                    &format!("{p}.feed_forward"),
                    activation,
                )?)
            } else {
                let inter = dim(config.intermediate_size_mlp, "intermediate_size_mlp")?;
                FeedForward::Dense(Mlp::load(
                    weights,
                    &format!("{p}.feed_forward"),
                    inter,
                    hidden,
                    activation,
                )?)
            };
            layers.push(DecoderLayer {
                input_layernorm: norm(weights, &format!("{p}.input_layernorm.weight"))?,
                self_attn: attention(
                    &config,
                    weights,
                    &format!("{p}.self_attn"),
                    rotary.then(|| rope.clone()),
                )?,
                post_attention_layernorm: norm(
                    weights,
                    &format!("{p}.post_attention_layernorm.weight"),
                )?,
                feed_forward,
                rotary,
                chunked: config.chunked_layers[i],
            });
        }
        let final_norm = norm(weights, &format!("{root}.norm.weight"))?;
        let lm_head =
            embed_tokens.output_head(weights, config.tie_word_embeddings, head, vocab, hidden)?;
        Ok(Llama4 {
            spec: config.spec(),
            config,
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
        })
    }

    /// The query scale of a position-free layer for each row's tokens:
    /// `1 + attn_scale · ln(1 + ⌊(p + 1) / floor_scale⌋)`, `[rows, 1, tokens, 1]`.
    fn temperature(&self, batch: &Batch, scale: f32, floor: f32) -> Result<Array> {
        let tokens = batch.width()? as i32;
        let starts: Vec<f32> = batch.positions.iter().map(|&p| p as f32).collect();
        let starts = Array::from_slice(&starts, &[starts.len() as i32, 1])?;
        let offsets =
            Array::arange(0.0, f64::from(tokens), 1.0, Dtype::F32)?.reshape(&[1, tokens])?;
        let positions = starts.add(&offsets)?;
        let tuned = positions
            .add(1.0)?
            .divide(floor)?
            .floor()?
            .log1p()?
            .multiply(scale)?
            .add(1.0)?;
        Ok(tuned.expand_dims(&[1, 3])?)
    }
}

/// The sparse block under `p`: `router`, `experts.{gate_up_proj, down_proj}` stored
/// `[experts, in, out]` (or gate, up and down stacks `[experts, out, in]`), and
/// `shared_expert`.
fn experts(c: &Config, weights: &mut Weights, p: &str, activation: Activation) -> Result<Moe> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let experts = dim(c.num_local_experts, "num_local_experts")?;
    let inter = dim(c.intermediate_size, "intermediate_size")?;
    let (gate_up, down) = if weights.contains(&format!("{p}.experts.gate_up_proj")) {
        let gate_up = weights
            .dense(
                &format!("{p}.experts.gate_up_proj"),
                &[experts, hidden, 2 * inter],
            )?
            .swap_axes(1, 2)?;
        let down = weights
            .dense(&format!("{p}.experts.down_proj"), &[experts, inter, hidden])?
            .swap_axes(1, 2)?;
        (gate_up, down)
    } else {
        // Gate and up apart, each expert `[out, in]` (a GGUF file: llama.cpp's converter
        // splits and transposes them).
        let stack = |weights: &mut Weights, which: &str, out: i32, inp: i32| {
            weights.dense(&format!("{p}.experts.{which}.weight"), &[experts, out, inp])
        };
        let gate = stack(weights, "gate_proj", inter, hidden)?;
        let up = stack(weights, "up_proj", inter, hidden)?;
        (
            mlx::concatenate(&[gate, up], 1)?,
            stack(weights, "down_proj", hidden, inter)?,
        )
    };
    Ok(Moe::from_fused(
        weights.matrix(&format!("{p}.router"), experts, hidden)?,
        StackedExperts::new(Tensor::Dense(gate_up)),
        StackedExperts::new(Tensor::Dense(down)),
        c.num_experts_per_tok,
        false,
        // Chosen by logit (sigmoid is monotone), weighted by the sigmoid of it.
        RouterScoring::Sigmoid,
        activation,
    )?
    .with_scaled_inputs()
    .with_shared(SharedExpert {
        mlp: Mlp::load(
            weights,
            &format!("{p}.shared_expert"),
            inter,
            hidden,
            activation,
        )?,
        gate: None,
    }))
}

/// The attention block (`self_attn`): rotary layers turn and normalize queries and keys.
fn attention(c: &Config, weights: &mut Weights, p: &str, rope: Option<Rope>) -> Result<Attention> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let heads = dim(c.num_attention_heads, "num_attention_heads")?;
    let kv_heads = dim(c.num_key_value_heads, "num_key_value_heads")?;
    let head_dim = dim(c.head_dim, "head_dim")?;
    let projection = |weights: &mut Weights, name: &str, out: i32, inp: i32| {
        weights.projection(&format!("{p}.{name}"), out, inp, c.attention_bias)
    };
    // The weightless RMS norm of rotary layers (the reference's L2Norm).
    let qk_norm = (c.use_qk_norm && rope.is_some())
        .then(|| {
            // In the compute dtype: an f32 weight would promote bf16 keys to f32, apart from
            // their values.
            Array::ones(&[head_dim], weights.dtype()).map(|w| RmsNorm::new(w, c.rms_norm_eps))
        })
        .transpose()?;
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
    .with_qk_norms(qk_norm.clone(), qk_norm)
    .build())
}

impl Model for Llama4 {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

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
        let temperature = match self.config.temperature_tuning {
            Some((scale, floor)) if self.layers.iter().any(|l| !l.rotary) => {
                Some(self.temperature(batch, scale, floor)?)
            }
            _ => None,
        };
        let mut h = self.embed_tokens.forward(&batch.tokens)?;
        // Computed in f32; queries keep the model's dtype (an f32 factor would promote bf16
        // queries, and with them the attention output, to f32).
        let temperature = temperature.map(|t| t.astype(h.dtype())).transpose()?;
        for (i, layer) in self.layers.iter().enumerate().take(layers) {
            let x = layer.input_layernorm.forward(&h)?;
            let mut projected = layer.self_attn.project(&x, positions.rope())?;
            if let (false, Some(temperature)) = (layer.rotary, &temperature) {
                projected.queries = projected.queries.multiply(temperature)?;
            }
            let logical = match (layer.chunked, self.config.attention_chunk_size) {
                (true, Some(chunk)) => LogicalMask::Chunked(chunk),
                _ => LogicalMask::Causal,
            };
            let attended = attend_cached(
                &layer.self_attn,
                &projected,
                caches,
                i,
                &batch.positions,
                logical,
            )?;
            h = h.add(&attended)?;
            let x = layer.post_attention_layernorm.forward(&h)?;
            let ff = match &layer.feed_forward {
                FeedForward::Dense(mlp) => mlp.forward(&x)?,
                FeedForward::Sparse(moe) => moe.forward(&x)?,
            };
            h = h.add(&ff)?;
        }
        Ok(Forward {
            hidden: self.norm.forward(&h)?,
            conditioning: None,
        })
    }

    fn unembed(&self, hidden: &Array) -> Result<Array> {
        self.lm_head.forward(hidden)
    }

    fn parameters(&self) -> Vec<Array> {
        let mut out = Vec::new();
        self.embed_tokens.collect_arrays(&mut out);
        for layer in &self.layers {
            layer.input_layernorm.collect_arrays(&mut out);
            layer.self_attn.collect_arrays(&mut out);
            layer.post_attention_layernorm.collect_arrays(&mut out);
            match &layer.feed_forward {
                FeedForward::Dense(mlp) => mlp.collect_arrays(&mut out),
                FeedForward::Sparse(moe) => moe.collect_arrays(&mut out),
            }
        }
        self.norm.collect_arrays(&mut out);
        self.lm_head.collect_arrays(&mut out);
        out
    }
}
