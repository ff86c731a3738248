//! Gemma 4 (text): Gemma's sandwich-normed decoder, with
//!
//! - sliding-window and full layers of different head widths (`per_layer_config`, published
//!   configs' `global_head_dim`) and rotary embeddings: plain rope on sliding layers,
//!   "proportional" rope on full ones (a share of the frequencies turns, at the rates a
//!   full-width rotation gives them);
//! - unscaled attention over q/k-normed heads, values normed without a scale, and on full
//!   layers optionally keys reused as values (`attention_k_eq_v`);
//! - the last `num_kv_shared_layers` layers computing no keys or values: each attends over
//!   those of the last earlier layer of its kind, and so keeps no cache (their MLPs may be
//!   twice as wide, `use_double_wide_mlp`);
//! - per-layer inputs ("PLE", the small models): a second embedding of every token, one slice
//!   per layer, mixed with a projection of the first and fed into each layer through a gated
//!   bottleneck;
//! - optionally a mixture of experts beside each dense MLP (`enable_moe_block`), routed on a
//!   normalized copy of the residual, each chosen expert's weight scaled by its own factor;
//! - a learned scalar on each layer's output, embeddings scaled by `√hidden`, a soft cap on
//!   the output logits. Norms multiply by their weight as stored (not `1 + w` as Gemma 2–3).
//!
//! References: transformers' `models/gemma4/modeling_gemma4.py` and
//! `configuration_gemma4.py` (5.24); Google DeepMind, "Gemma 4" model card (2026).

use kvcache::{LayerCache, LogicalMask};
use mlx::Array;
use mlx::fast::RopeOffset;
use serde_json::Value;

use crate::activation::Activation;
use crate::cached_attention::{
    BatchPositions, RowHistories, append_to_caches, attend_histories, check_cache_sets,
};
use crate::config::{Fields, dim, limits, missing, rope_from_parameters};
use crate::embedding::Embedding;
use crate::linear::{Linear, Tensor};
use crate::mlp::Mlp;
use crate::model::{Batch, Forward, InputEmbeddings, LayerState, Model, ModelSpec, check_depth};
use crate::moe::{Moe, RouterScoring, StackedExperts};
use crate::rms_norm::RmsNorm;
use crate::rope::{Rope, RopeConfig};
use crate::sdpa::ScaledDotProduct;
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The hyperparameters of a Gemma 4 text model.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `model_type`.
    pub model_type: String,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f32,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// Each layer, in order.
    pub layers: Vec<LayerConfig>,
    /// `sliding_window`.
    pub sliding_window: usize,
    /// `rope_parameters.sliding_attention`, over the sliding layers' heads.
    pub rope_sliding: RopeConfig,
    /// `rope_parameters.full_attention`, over the full layers' heads.
    pub rope_full: RopeConfig,
    /// `final_logit_softcapping`.
    pub final_logit_softcapping: Option<f32>,
    /// `hidden_activation`.
    pub hidden_activation: String,
    /// `attention_bias`.
    pub attention_bias: bool,
    /// `tie_word_embeddings` (`None` when the config is silent).
    pub tie_word_embeddings: Option<bool>,
    /// `hidden_size_per_layer_input` and `vocab_size_per_layer_input`, when the model has
    /// per-layer inputs.
    pub per_layer_input: Option<PerLayerInputConfig>,
    /// The experts beside each MLP, when `enable_moe_block`.
    pub experts: Option<ExpertsConfig>,
}

/// One layer's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerConfig {
    /// `layer_types[i]` is `sliding_attention`.
    pub sliding: bool,
    /// Features per head (`global_head_dim` on full layers).
    pub head_dim: usize,
    /// Key/value heads (`num_global_key_value_heads` on full layers that reuse keys as values).
    pub kv_heads: usize,
    /// The values are the keys' projection (`attention_k_eq_v`, full layers only).
    pub keys_as_values: bool,
    /// Where the keys and values it attends over come from.
    pub kv: KvSource,
    /// The MLP's width (`intermediate_size`, doubled on sharing layers under
    /// `use_double_wide_mlp`).
    pub intermediate_size: usize,
}

/// Where a layer's keys and values come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvSource {
    /// It computes and caches its own.
    Own,
    /// Those of this earlier layer, the last of its kind that keeps its own (the last
    /// `num_kv_shared_layers` layers).
    Layer(usize),
    /// Those of the target's last cache-keeping layer of its kind: every layer of a Gemma 4
    /// assistant ([`super::gemma4_assistant`]).
    Target,
}

impl KvSource {
    /// Whether the layer computes no keys or values of its own.
    pub fn is_shared(self) -> bool {
        self != KvSource::Own
    }
}

/// Per-layer inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerLayerInputConfig {
    /// `hidden_size_per_layer_input`: each layer's slice.
    pub hidden: usize,
    /// `vocab_size_per_layer_input`: rows of the per-layer table.
    pub vocab: usize,
}

/// The mixture of experts beside each MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertsConfig {
    /// `num_experts`.
    pub num_experts: usize,
    /// `top_k_experts`.
    pub top_k: usize,
    /// `moe_intermediate_size`.
    pub intermediate_size: usize,
}

impl Config {
    /// Reads the config (`text_config` of a multimodal checkpoint), in transformers 5.24's
    /// spelling (`per_layer_config`) or the published one (`global_head_dim`,
    /// `num_global_key_value_heads`).
    pub fn from_json(config: &Value) -> Result<Config> {
        Config::read(config, false)
    }

    /// Reads an assistant's `text_config`, whose every layer attends over its target's keys
    /// and values ([`KvSource::Target`]).
    pub fn for_assistant(config: &Value) -> Result<Config> {
        Config::read(config, true)
    }

    fn read(config: &Value, assistant: bool) -> Result<Config> {
        let f = Fields::text_section(config);
        let model_type = f
            .str("model_type")
            .ok_or_else(|| missing("model_type"))?
            .to_string();
        let num_layers = f.required_bounded("num_hidden_layers", limits::LAYERS)?;
        let (heads, kv_heads) = f.attention_heads()?;
        let head_dim = f.required_bounded("head_dim", limits::HIDDEN)?;
        let intermediate_size = f.required_bounded("intermediate_size", limits::INTERMEDIATE)?;
        let mut sliding = f
            .layer_types(num_layers)?
            .ok_or_else(|| missing("layer_types"))?;
        // The reference forces the last layer to attend fully (with a warning); so do we.
        if let Some(last) = sliding.last_mut() {
            *last = false;
        }
        let keys_as_values = f.bool("attention_k_eq_v")?.unwrap_or(false);
        let shapes = read_head_shapes(&f, &sliding, (head_dim, kv_heads), keys_as_values)?;
        let shares = read_kv_sharing(&f, &sliding, assistant)?;
        let double_wide = f.bool("use_double_wide_mlp")?.unwrap_or(false);
        let mut layers = Vec::with_capacity(num_layers);
        for (i, &slides) in sliding.iter().enumerate() {
            let (head_dim, kv_heads) = shapes[i];
            if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
                return Err(Error::Config(format!(
                    "layer {i}: {heads} attention heads cannot share {kv_heads} key/value heads"
                )));
            }
            let widen = if double_wide && shares[i].is_shared() {
                2
            } else {
                1
            };
            layers.push(LayerConfig {
                sliding: slides,
                head_dim,
                kv_heads,
                keys_as_values: keys_as_values && !slides,
                kv: shares[i],
                intermediate_size: intermediate_size * widen,
            });
        }
        let head_dim_of = |slides: bool| {
            layers
                .iter()
                .find(|l| l.sliding == slides)
                .map_or(head_dim, |l| l.head_dim)
        };
        let rope = f
            .get("rope_parameters")
            .ok_or_else(|| missing("rope_parameters"))?;
        let rope_of = |kind: &str, head_dim: usize| -> Result<RopeConfig> {
            let params = rope
                .get(kind)
                .ok_or_else(|| missing(&format!("rope_parameters.{kind}")))?;
            rope_from_parameters(params, dim(head_dim, "head_dim")?)
        };
        let per_layer_hidden = f
            .bounded("hidden_size_per_layer_input", limits::HIDDEN)?
            .unwrap_or(0);
        let per_layer_input = match per_layer_hidden {
            0 => None,
            hidden => Some(PerLayerInputConfig {
                hidden,
                vocab: f.required_bounded("vocab_size_per_layer_input", limits::VOCAB)?,
            }),
        };
        let experts = if f.bool("enable_moe_block")?.unwrap_or(false) {
            let num_experts = f.required_bounded("num_experts", limits::EXPERTS)?;
            let top_k = f.required_usize("top_k_experts")?;
            if top_k == 0 || top_k > num_experts {
                return Err(Error::Config(format!(
                    "`top_k_experts` = {top_k} must be between 1 and the {num_experts} experts"
                )));
            }
            Some(ExpertsConfig {
                num_experts,
                top_k,
                intermediate_size: f
                    .required_bounded("moe_intermediate_size", limits::INTERMEDIATE)?,
            })
        } else {
            None
        };
        let cap = f.f64("final_logit_softcapping")?.filter(|c| *c > 0.0);
        Ok(Config {
            model_type,
            hidden_size: f.required_bounded("hidden_size", limits::HIDDEN)?,
            vocab_size: f.required_bounded("vocab_size", limits::VOCAB)?,
            rms_norm_eps: f
                .f64("rms_norm_eps")?
                .ok_or_else(|| missing("rms_norm_eps"))? as f32,
            max_position_embeddings: f
                .bounded("max_position_embeddings", limits::POSITIONS)?
                .ok_or_else(|| missing("max_position_embeddings"))?,
            num_attention_heads: heads,
            sliding_window: f
                .bounded("sliding_window", limits::POSITIONS)?
                .ok_or_else(|| missing("sliding_window"))?,
            rope_sliding: rope_of("sliding_attention", head_dim_of(true))?,
            rope_full: rope_of("full_attention", head_dim_of(false))?,
            layers,
            final_logit_softcapping: cap.map(|c| c as f32),
            hidden_activation: f
                .str("hidden_activation")
                .or_else(|| f.str("hidden_act"))
                .unwrap_or("gelu_pytorch_tanh")
                .to_string(),
            attention_bias: f.bool("attention_bias")?.unwrap_or(false),
            tie_word_embeddings: f.bool("tie_word_embeddings")?,
            per_layer_input,
            experts,
        })
    }

    /// What the engine needs to know of the model.
    pub fn spec(&self) -> ModelSpec {
        ModelSpec {
            model_type: self.model_type.clone(),
            vocab_size: self.vocab_size,
            context_length: self.max_position_embeddings,
            layers: self
                .layers
                .iter()
                .map(|l| match l.kv {
                    KvSource::Layer(_) | KvSource::Target => LayerState::Stateless,
                    KvSource::Own => LayerState::Attention {
                        kv_heads: l.kv_heads,
                        head_dim: l.head_dim,
                        window: l.sliding.then_some(self.sliding_window),
                    },
                })
                .collect(),
        }
    }
}

/// Each layer's head width and key/value heads: the base ones, overridden per layer by
/// `per_layer_config` (`{"<layer>": {"head_dim": …, "num_key_value_heads": …}}`) or, in
/// published configs, on full layers by `global_head_dim` (and `num_global_key_value_heads`
/// where keys are reused as values, as the reference reads it).
fn read_head_shapes(
    f: &Fields<'_>,
    sliding: &[bool],
    (head_dim, kv_heads): (usize, usize),
    keys_as_values: bool,
) -> Result<Vec<(usize, usize)>> {
    let mut shapes = vec![(head_dim, kv_heads); sliding.len()];
    if let Some(overrides) = f.get("per_layer_config") {
        let overrides = overrides
            .as_object()
            .ok_or_else(|| Error::Config("`per_layer_config` must be an object".into()))?;
        for (key, value) in overrides {
            let layer = key
                .parse::<usize>()
                .ok()
                .filter(|&i| i < sliding.len())
                .ok_or_else(|| {
                    Error::Config(format!(
                        "`per_layer_config` names layer `{key}` of a {}-layer model",
                        sliding.len()
                    ))
                })?;
            let o = Fields { object: value };
            if let Some(d) = o.bounded("head_dim", limits::HIDDEN)? {
                shapes[layer].0 = d;
            }
            if let Some(k) = o.bounded("num_key_value_heads", limits::HEADS)? {
                shapes[layer].1 = k;
            }
        }
        return Ok(shapes);
    }
    if sliding.iter().all(|&s| s) {
        return Ok(shapes);
    }
    let global_head_dim = f.required_bounded("global_head_dim", limits::HIDDEN)?;
    let global_kv_heads = match keys_as_values {
        true => f.bounded("num_global_key_value_heads", limits::HEADS)?,
        false => None,
    };
    for (shape, &slides) in shapes.iter_mut().zip(sliding) {
        if !slides {
            *shape = (global_head_dim, global_kv_heads.unwrap_or(kv_heads));
        }
    }
    Ok(shapes)
}

/// `num_kv_shared_layers`: the layers from `layers − n` on reuse the keys and values of the
/// last earlier layer of their kind. An assistant's are all its target's.
fn read_kv_sharing(f: &Fields<'_>, sliding: &[bool], assistant: bool) -> Result<Vec<KvSource>> {
    let shared = f.usize("num_kv_shared_layers")?.unwrap_or(0);
    if assistant {
        if shared != sliding.len() {
            return Err(Error::Config(format!(
                "an assistant's layers all attend over its target's keys and values: \
                 `num_kv_shared_layers` must be its {} layers, not {shared}",
                sliding.len()
            )));
        }
        return Ok(vec![KvSource::Target; sliding.len()]);
    }
    if shared > sliding.len() {
        return Err(Error::Config(format!(
            "`num_kv_shared_layers` = {shared} is more than the {} layers",
            sliding.len()
        )));
    }
    let first_shared = sliding.len() - shared;
    let last_of_kind = |kind: bool| (0..first_shared).rev().find(|&i| sliding[i] == kind);
    (0..sliding.len())
        .map(|i| {
            if i < first_shared {
                return Ok(KvSource::Own);
            }
            let kind = if sliding[i] { "sliding" } else { "full" };
            last_of_kind(sliding[i])
                .map(KvSource::Layer)
                .ok_or_else(|| {
                    Error::Config(format!(
                        "layer {i} shares the keys and values of an earlier {kind} layer, \
                     but none computes its own"
                    ))
                })
        })
        .collect()
}

/// Keys and values a layer computes itself.
struct KeyValues {
    k_proj: Linear,
    /// `None` when the keys' projection doubles as the values' (`attention_k_eq_v`).
    v_proj: Option<Linear>,
    k_norm: RmsNorm,
}

/// The attention block (`self_attn`).
struct SelfAttention {
    q_proj: Linear,
    q_norm: RmsNorm,
    /// `None` on layers that attend over an earlier layer's keys and values.
    key_values: Option<KeyValues>,
    o_proj: Linear,
    rope: Rope,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    eps: f32,
    kernel: ScaledDotProduct,
}

impl SelfAttention {
    fn load(
        c: &Config,
        layer: &LayerConfig,
        weights: &mut Weights,
        p: &str,
        rope: &Rope,
    ) -> Result<SelfAttention> {
        let hidden = dim(c.hidden_size, "hidden_size")?;
        let heads = dim(c.num_attention_heads, "num_attention_heads")?;
        let kv_heads = dim(layer.kv_heads, "num_key_value_heads")?;
        let head_dim = dim(layer.head_dim, "head_dim")?;
        let eps = c.rms_norm_eps;
        let projection = |weights: &mut Weights, name: &str, out: i32, inp: i32| {
            weights.projection(&format!("{p}.{name}"), out, inp, c.attention_bias)
        };
        let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(
                weights.dense(&format!("{p}.{name}.weight"), &[head_dim])?,
                eps,
            ))
        };
        let key_values = match layer.kv {
            KvSource::Layer(_) | KvSource::Target => None,
            KvSource::Own => Some(KeyValues {
                k_proj: projection(weights, "k_proj", kv_heads * head_dim, hidden)?,
                v_proj: match layer.keys_as_values {
                    true => None,
                    false => Some(projection(weights, "v_proj", kv_heads * head_dim, hidden)?),
                },
                k_norm: norm(weights, "k_norm")?,
            }),
        };
        Ok(SelfAttention {
            q_proj: projection(weights, "q_proj", heads * head_dim, hidden)?,
            q_norm: norm(weights, "q_norm")?,
            key_values,
            o_proj: projection(weights, "o_proj", hidden, heads * head_dim)?,
            rope: rope.clone(),
            heads,
            kv_heads,
            head_dim,
            eps,
            // The q/k norms set the logits' scale: no `head_dim^-½`.
            kernel: ScaledDotProduct {
                scale: 1.0,
                logit_softcap: None,
                sinks: None,
            },
        })
    }

    /// `x: [rows, tokens, dim]` split into `n` heads of this layer's width.
    fn heads_of(&self, y: &Array, n: i32) -> Result<Array> {
        let (rows, tokens) = (y.dim(0)?, y.dim(1)?);
        Ok(y.reshape(&[rows, tokens, n, self.head_dim])?)
    }

    /// Normed, rotated queries, `[rows, heads, tokens, head_dim]`.
    fn queries(&self, x: &Array, offset: RopeOffset<'_>) -> Result<Array> {
        let q = self.heads_of(&self.q_proj.forward(x)?, self.heads)?;
        let q = self.q_norm.forward(&q)?.transpose(&[0, 2, 1, 3])?;
        self.rope.forward(&q, offset)
    }

    /// Normed, rotated keys and scale-free-normed values, `[rows, kv_heads, tokens,
    /// head_dim]`, of a layer that computes its own.
    fn key_values(&self, kv: &KeyValues, x: &Array, offset: RopeOffset<'_>) -> Result<[Array; 2]> {
        let k = self.heads_of(&kv.k_proj.forward(x)?, self.kv_heads)?;
        let v = match &kv.v_proj {
            Some(v_proj) => self.heads_of(&v_proj.forward(x)?, self.kv_heads)?,
            None => k.clone(),
        };
        let keys = kv.k_norm.forward(&k)?.transpose(&[0, 2, 1, 3])?;
        let values = mlx::fast::rms_norm(&v, None, self.eps)?.transpose(&[0, 2, 1, 3])?;
        Ok([self.rope.forward(&keys, offset)?, values])
    }

    /// The attended heads projected back to `[rows, tokens, dim]`.
    fn output(&self, heads: &Array) -> Result<Array> {
        let (rows, tokens) = (heads.dim(0)?, heads.dim(2)?);
        let merged =
            heads
                .transpose(&[0, 2, 1, 3])?
                .reshape(&[rows, tokens, self.heads * self.head_dim])?;
        self.o_proj.forward(&merged)
    }

    fn collect_arrays(&self, out: &mut Vec<Array>) {
        self.q_proj.collect_arrays(out);
        self.q_norm.collect_arrays(out);
        if let Some(kv) = &self.key_values {
            kv.k_proj.collect_arrays(out);
            if let Some(v_proj) = &kv.v_proj {
                v_proj.collect_arrays(out);
            }
            kv.k_norm.collect_arrays(out);
        }
        self.o_proj.collect_arrays(out);
    }
}

/// The experts beside a layer's MLP: routed on the normalized residual (times `router.scale`
/// and `hidden^-½`), run on the residual normed by `pre_feedforward_layernorm_2`, their sum
/// normed by `post_feedforward_layernorm_2`.
struct ExpertBlock {
    /// `router.scale · hidden^-½`, `[hidden]`.
    router_input_scale: Array,
    moe: Moe,
    pre_feedforward_layernorm_2: RmsNorm,
    post_feedforward_layernorm_1: RmsNorm,
    post_feedforward_layernorm_2: RmsNorm,
    eps: f32,
}

impl ExpertBlock {
    fn load(
        c: &Config,
        e: &ExpertsConfig,
        weights: &mut Weights,
        p: &str,
        activation: Activation,
    ) -> Result<ExpertBlock> {
        let hidden = dim(c.hidden_size, "hidden_size")?;
        let experts = dim(e.num_experts, "num_experts")?;
        let inter = dim(e.intermediate_size, "moe_intermediate_size")?;
        let eps = c.rms_norm_eps;
        let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(
                weights.dense(&format!("{p}.{name}.weight"), &[hidden])?,
                eps,
            ))
        };
        let router = weights.matrix(&format!("{p}.router.proj"), experts, hidden)?;
        let router_input_scale = weights
            .dense(&format!("{p}.router.scale"), &[hidden])?
            .multiply((c.hidden_size as f32).powf(-0.5))?;
        let per_expert_scale =
            weights.dense(&format!("{p}.router.per_expert_scale"), &[experts])?;
        let gate_up = weights.dense(
            &format!("{p}.experts.gate_up_proj"),
            &[experts, 2 * inter, hidden],
        )?;
        let down = weights.dense(&format!("{p}.experts.down_proj"), &[experts, hidden, inter])?;
        let moe = Moe::from_fused(
            router,
            StackedExperts::new(Tensor::Dense(gate_up)),
            StackedExperts::new(Tensor::Dense(down)),
            e.top_k,
            true,
            RouterScoring::Softmax,
            activation,
        )?
        .with_expert_scales(per_expert_scale)?;
        Ok(ExpertBlock {
            router_input_scale,
            moe,
            pre_feedforward_layernorm_2: norm(weights, "pre_feedforward_layernorm_2")?,
            post_feedforward_layernorm_1: norm(weights, "post_feedforward_layernorm_1")?,
            post_feedforward_layernorm_2: norm(weights, "post_feedforward_layernorm_2")?,
            eps,
        })
    }

    /// The dense MLP's output `dense` combined with the experts' over `residual`.
    fn combine(&self, dense: &Array, residual: &Array) -> Result<Array> {
        let route =
            mlx::fast::rms_norm(residual, None, self.eps)?.multiply(&self.router_input_scale)?;
        let routed = self
            .moe
            .forward_routed_by(&self.pre_feedforward_layernorm_2.forward(residual)?, &route)?;
        Ok(self
            .post_feedforward_layernorm_1
            .forward(dense)?
            .add(&self.post_feedforward_layernorm_2.forward(&routed)?)?)
    }

    fn collect_arrays(&self, out: &mut Vec<Array>) {
        out.push(self.router_input_scale.clone());
        self.moe.collect_arrays(out);
        for norm in [
            &self.pre_feedforward_layernorm_2,
            &self.post_feedforward_layernorm_1,
            &self.post_feedforward_layernorm_2,
        ] {
            norm.collect_arrays(out);
        }
    }
}

/// A layer's entry for its per-layer input: `x + norm(projection(act(gate · x) ⊙ input))`.
struct PerLayerInputGate {
    per_layer_input_gate: Linear,
    per_layer_projection: Linear,
    post_per_layer_input_norm: RmsNorm,
}

/// One decoder layer.
pub(super) struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: SelfAttention,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    mlp: Mlp,
    experts: Option<ExpertBlock>,
    post_feedforward_layernorm: RmsNorm,
    per_layer_input: Option<PerLayerInputGate>,
    /// `layer_scalar`, `[1]`.
    layer_scalar: Array,
    sliding: bool,
}

impl DecoderLayer {
    /// Reads layer `layer` of `c` under `p`; `per_layer_hidden` is the per-layer inputs'
    /// width, when the model has them.
    pub(super) fn load(
        c: &Config,
        layer: &LayerConfig,
        weights: &mut Weights,
        p: &str,
        rope: &Rope,
        per_layer_hidden: Option<i32>,
        activation: Activation,
    ) -> Result<DecoderLayer> {
        let hidden = dim(c.hidden_size, "hidden_size")?;
        let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(
                weights.dense(&format!("{p}.{name}.weight"), &[hidden])?,
                c.rms_norm_eps,
            ))
        };
        let inter = dim(layer.intermediate_size, "intermediate_size")?;
        let experts = c
            .experts
            .as_ref()
            .map(|e| ExpertBlock::load(c, e, weights, p, activation))
            .transpose()?;
        let per_layer_input = match per_layer_hidden {
            None => None,
            Some(width) => Some(PerLayerInputGate {
                per_layer_input_gate: weights.matrix(
                    &format!("{p}.per_layer_input_gate"),
                    width,
                    hidden,
                )?,
                per_layer_projection: weights.matrix(
                    &format!("{p}.per_layer_projection"),
                    hidden,
                    width,
                )?,
                post_per_layer_input_norm: norm(weights, "post_per_layer_input_norm")?,
            }),
        };
        Ok(DecoderLayer {
            input_layernorm: norm(weights, "input_layernorm")?,
            self_attn: SelfAttention::load(c, layer, weights, &format!("{p}.self_attn"), rope)?,
            post_attention_layernorm: norm(weights, "post_attention_layernorm")?,
            pre_feedforward_layernorm: norm(weights, "pre_feedforward_layernorm")?,
            mlp: Mlp::load(weights, &format!("{p}.mlp"), inter, hidden, activation)?,
            experts,
            post_feedforward_layernorm: norm(weights, "post_feedforward_layernorm")?,
            per_layer_input,
            layer_scalar: weights.dense(&format!("{p}.layer_scalar"), &[1])?,
            sliding: layer.sliding,
        })
    }

    /// The attention's input, `h` normed.
    pub(super) fn attention_input(&self, h: &Array) -> Result<Array> {
        self.input_layernorm.forward(h)
    }

    /// Normed, rotated queries of `x` (the attention's input).
    pub(super) fn queries(&self, x: &Array, offset: RopeOffset<'_>) -> Result<Array> {
        self.self_attn.queries(x, offset)
    }

    /// The queries attended over `history`: `[rows, heads, tokens, head_dim]`.
    pub(super) fn attend(&self, queries: &Array, history: &RowHistories) -> Result<Array> {
        attend_histories(&self.self_attn.kernel, queries, history)
    }

    /// Whether its attention is windowed.
    pub(super) fn sliding(&self) -> bool {
        self.sliding
    }

    /// The rest of the layer after attention: `h` plus the attended `heads`, the feed-forward
    /// block, the per-layer input (this layer's slice, when the model has them) and the
    /// layer's scalar.
    pub(super) fn after_attention(
        &self,
        h: &Array,
        heads: &Array,
        per_layer_input: Option<&Array>,
        activation: Activation,
    ) -> Result<Array> {
        let attended = self.self_attn.output(heads)?;
        let residual = h.add(&self.post_attention_layernorm.forward(&attended)?)?;
        let normed = self.pre_feedforward_layernorm.forward(&residual)?;
        let mut ff = self.mlp.forward(&normed)?;
        if let Some(experts) = &self.experts {
            ff = experts.combine(&ff, &residual)?;
        }
        let mut h = residual.add(&self.post_feedforward_layernorm.forward(&ff)?)?;
        if let (Some(gate), Some(input)) = (&self.per_layer_input, per_layer_input) {
            let gated = activation
                .apply(&gate.per_layer_input_gate.forward(&h)?)?
                .multiply(input)?;
            let back = gate.per_layer_projection.forward(&gated)?;
            h = h.add(&gate.post_per_layer_input_norm.forward(&back)?)?;
        }
        Ok(h.multiply(&self.layer_scalar)?)
    }

    pub(super) fn collect_arrays(&self, out: &mut Vec<Array>) {
        for norm in [
            &self.input_layernorm,
            &self.post_attention_layernorm,
            &self.pre_feedforward_layernorm,
            &self.post_feedforward_layernorm,
        ] {
            norm.collect_arrays(out);
        }
        self.self_attn.collect_arrays(out);
        self.mlp.collect_arrays(out);
        if let Some(experts) = &self.experts {
            experts.collect_arrays(out);
        }
        if let Some(gate) = &self.per_layer_input {
            gate.per_layer_input_gate.collect_arrays(out);
            gate.per_layer_projection.collect_arrays(out);
            gate.post_per_layer_input_norm.collect_arrays(out);
        }
        out.push(self.layer_scalar.clone());
    }
}

/// The model-level half of per-layer inputs: the per-layer table (`[vocab, layers · hidden]`)
/// and the projection of the token embeddings mixed into it.
struct PerLayerInputs {
    embed_tokens_per_layer: Embedding,
    per_layer_model_projection: Linear,
    per_layer_projection_norm: RmsNorm,
    hidden: i32,
}

/// A Gemma 4 text model.
pub struct Gemma4 {
    spec: ModelSpec,
    config: Config,
    embed_tokens: Embedding,
    per_layer_inputs: Option<PerLayerInputs>,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    /// `hidden_activation`, of the MLPs, the experts and the per-layer input gates.
    activation: Activation,
}

impl Gemma4 {
    /// Builds the model from transformers-named weights (`model.layers.N.…`, or
    /// `model.language_model.layers.N.…` in a multimodal checkpoint, whose vision and audio
    /// towers are set aside).
    pub fn new(config: Config, weights: &mut Weights) -> Result<Gemma4> {
        let hidden = dim(config.hidden_size, "hidden_size")?;
        let vocab = dim(config.vocab_size, "vocab_size")?;
        let eps = config.rms_norm_eps;
        let root = if weights.contains("model.language_model.embed_tokens.weight") {
            "model.language_model"
        } else {
            "model"
        };
        // Images and audio are issue 21's; a text load reads none of their weights.
        for tower in [
            "model.vision_tower.",
            "model.embed_vision.",
            "model.audio_tower.",
            "model.embed_audio.",
        ] {
            weights.set_aside(tower);
        }
        let norm = |weights: &mut Weights, name: &str, size: i32| -> Result<RmsNorm> {
            Ok(RmsNorm::new(weights.dense(name, &[size])?, eps))
        };
        let embed_name = format!("{root}.embed_tokens.weight");
        let embed_weight = weights.table(&embed_name)?;
        check_matrix(&embed_name, &embed_weight, vocab, hidden)?;
        let embed_tokens = Embedding::new(embed_weight).with_packed(weights.packed(&embed_name)?);
        let activation = Activation::from_name(&config.hidden_activation)?;
        let rope_sliding = Rope::new(&config.rope_sliding)?;
        let rope_full = Rope::new(&config.rope_full)?;
        let layer_count = dim(config.layers.len(), "num_hidden_layers")?;

        let per_layer_inputs = match config.per_layer_input {
            None => None,
            Some(ple) => {
                let width = dim(ple.hidden, "hidden_size_per_layer_input")?;
                let table_name = format!("{root}.embed_tokens_per_layer.weight");
                // Kept as stored (bf16 in the released checkpoints): rows are widened as they
                // are gathered.
                let table = weights.stored(&table_name)?;
                check_matrix(
                    &table_name,
                    &table,
                    dim(ple.vocab, "vocab_size_per_layer_input")?,
                    layer_count * width,
                )?;
                Some(PerLayerInputs {
                    embed_tokens_per_layer: Embedding::new(table),
                    per_layer_model_projection: weights.matrix(
                        &format!("{root}.per_layer_model_projection"),
                        layer_count * width,
                        hidden,
                    )?,
                    per_layer_projection_norm: norm(
                        weights,
                        &format!("{root}.per_layer_projection_norm.weight"),
                        width,
                    )?,
                    hidden: width,
                })
            }
        };

        let mut layers = Vec::with_capacity(config.layers.len());
        for (i, layer) in config.layers.iter().enumerate() {
            let rope = if layer.sliding {
                &rope_sliding
            } else {
                &rope_full
            };
            layers.push(DecoderLayer::load(
                &config,
                layer,
                weights,
                &format!("{root}.layers.{i}"),
                rope,
                per_layer_inputs.as_ref().map(|ple| ple.hidden),
                activation,
            )?);
        }
        let final_norm = norm(weights, &format!("{root}.norm.weight"), hidden)?;
        let lm_head = embed_tokens.output_head(
            weights,
            config.tie_word_embeddings,
            "lm_head",
            vocab,
            hidden,
        )?;
        Ok(Gemma4 {
            spec: config.spec(),
            config,
            embed_tokens,
            per_layer_inputs,
            layers,
            norm: final_norm,
            lm_head,
            activation,
        })
    }

    /// Every layer's per-layer input, `[rows, tokens, layers, per-layer hidden]`: the token's
    /// row of the per-layer table (scaled by `√width`) and the normed projection of its
    /// embedding, averaged in the reference's way (their sum times `2^-½`).
    fn per_layer_inputs(&self, tokens: &Array, embedded: &Array) -> Result<Option<Array>> {
        let Some(ple) = &self.per_layer_inputs else {
            return Ok(None);
        };
        let (rows, width) = (embedded.dim(0)?, embedded.dim(1)?);
        let layers = self.layers.len() as i32;
        let shape = [rows, width, layers, ple.hidden];
        let own = ple
            .embed_tokens_per_layer
            .forward(tokens)?
            .astype(embedded.dtype())?
            .multiply((ple.hidden as f32).sqrt())?
            .reshape(&shape)?;
        let projected = ple
            .per_layer_model_projection
            .forward(embedded)?
            .multiply((self.config.hidden_size as f32).powf(-0.5))?
            .reshape(&shape)?;
        let projected = ple.per_layer_projection_norm.forward(&projected)?;
        Ok(Some(projected.add(&own)?.multiply(0.5f32.sqrt())?))
    }

    /// The first `layers` layers and the final norm over `embedded`, the batch's input
    /// embeddings.
    fn run(
        &self,
        embedded: Array,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
        layers: usize,
    ) -> Result<Forward> {
        check_depth(layers, self.layers.len())?;
        check_cache_sets(batch, caches, self.layers.len())?;
        let positions = BatchPositions::new(batch)?;
        let tokens = batch.width()?;
        let per_layer_inputs = self.per_layer_inputs(&batch.tokens, &embedded)?;
        // The latest keys and values of each kind (sliding, full): a layer that shares keys
        // and values attends over its kind's, and only layers after every one that computes
        // its own share (the config reader checked it).
        let mut latest: [Option<RowHistories>; 2] = [None, None];
        let mut h = embedded;
        for (i, layer) in self.layers.iter().enumerate().take(layers) {
            let x = layer.attention_input(&h)?;
            let queries = layer.queries(&x, positions.rope())?;
            let (kind, logical) = match layer.sliding {
                true => (0, LogicalMask::SlidingWindow(self.config.sliding_window)),
                false => (1, LogicalMask::Causal),
            };
            let attn = &layer.self_attn;
            if let Some(kv) = &attn.key_values {
                let [keys, values] = attn.key_values(kv, &x, positions.rope())?;
                latest[kind] = Some(append_to_caches(
                    (&keys, &values),
                    caches,
                    i,
                    &batch.positions,
                    tokens,
                    logical,
                )?);
            }
            let history = latest[kind].as_ref().ok_or_else(|| {
                Error::InvalidInput(format!("layer {i} has no keys and values to attend over"))
            })?;
            let heads = layer.attend(&queries, history)?;
            let input = per_layer_inputs
                .as_ref()
                .map(|inputs| -> Result<Array> {
                    Ok(inputs
                        .slice_axis(2, i as i32, i as i32 + 1)?
                        .squeeze(&[2])?)
                })
                .transpose()?;
            h = layer.after_attention(&h, &heads, input.as_ref(), self.activation)?;
        }
        Ok(Forward {
            hidden: self.norm.forward(&h)?,
            conditioning: None,
        })
    }
}

impl InputEmbeddings for Gemma4 {
    /// The token embeddings scaled by `√hidden`, as the first layer takes them.
    fn embed(&self, tokens: &Array) -> Result<Array> {
        Ok(self
            .embed_tokens
            .forward(tokens)?
            .multiply((self.config.hidden_size as f32).sqrt())?)
    }

    fn forward_rows_embedded(
        &self,
        embedded: &Array,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        self.run(embedded.clone(), batch, caches, self.layers.len())
    }
}

impl Model for Gemma4 {
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
        let embedded = self.embed(&batch.tokens)?;
        self.run(embedded, batch, caches, layers)
    }

    fn input_embeddings(&self) -> Option<&dyn InputEmbeddings> {
        Some(self)
    }

    fn unembed(&self, hidden: &Array) -> Result<Array> {
        let logits = self.lm_head.forward(hidden)?;
        Ok(match self.config.final_logit_softcapping {
            Some(cap) => logits.divide(cap)?.tanh()?.multiply(cap)?,
            None => logits,
        })
    }

    fn parameters(&self) -> Vec<Array> {
        let mut out = Vec::new();
        self.embed_tokens.collect_arrays(&mut out);
        if let Some(ple) = &self.per_layer_inputs {
            ple.embed_tokens_per_layer.collect_arrays(&mut out);
            ple.per_layer_model_projection.collect_arrays(&mut out);
            ple.per_layer_projection_norm.collect_arrays(&mut out);
        }
        for layer in &self.layers {
            layer.collect_arrays(&mut out);
        }
        self.norm.collect_arrays(&mut out);
        self.lm_head.collect_arrays(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: serde_json::Value) -> Result<Config> {
        let mut base = serde_json::json!({
            "model_type": "gemma4_text",
            "hidden_size": 64, "intermediate_size": 96, "vocab_size": 512,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "global_head_dim": 32, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 256, "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1000000.0}
            }
        });
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        Config::from_json(&base)
    }

    #[test]
    fn sharing_layers_point_at_the_last_earlier_layer_of_their_kind() {
        let c = config(serde_json::json!({"num_kv_shared_layers": 2, "use_double_wide_mlp": true}))
            .unwrap();
        let shares: Vec<_> = c.layers.iter().map(|l| l.kv).collect();
        assert_eq!(
            shares,
            [
                KvSource::Own,
                KvSource::Own,
                KvSource::Layer(0),
                KvSource::Layer(1)
            ]
        );
        let widths: Vec<_> = c.layers.iter().map(|l| l.intermediate_size).collect();
        assert_eq!(widths, [96, 96, 192, 192]);
        let states = c.spec().layers;
        assert_eq!(states[2], LayerState::Stateless);
        assert!(matches!(
            states[1],
            LayerState::Attention { head_dim: 32, .. }
        ));
    }

    #[test]
    fn a_shared_kind_without_a_producer_is_refused() {
        let error = config(serde_json::json!({
            "num_kv_shared_layers": 2,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "full_attention"]
        }))
        .unwrap_err()
        .to_string();
        assert!(error.contains("none computes its own"), "{error}");
        let error = config(serde_json::json!({"num_kv_shared_layers": 9}))
            .unwrap_err()
            .to_string();
        assert!(error.contains("num_kv_shared_layers"), "{error}");
    }

    #[test]
    fn full_layers_take_the_global_head_shape_in_either_spelling() {
        let published = config(serde_json::json!({
            "attention_k_eq_v": true, "num_global_key_value_heads": 1
        }))
        .unwrap();
        let saved = config(serde_json::json!({
            "attention_k_eq_v": true,
            "per_layer_config": {"1": {"head_dim": 32, "num_key_value_heads": 1},
                                 "3": {"head_dim": 32, "num_key_value_heads": 1}}
        }))
        .unwrap();
        assert_eq!(published, saved);
        assert_eq!(
            (saved.layers[1].head_dim, saved.layers[1].kv_heads),
            (32, 1)
        );
        assert!(saved.layers[1].keys_as_values && !saved.layers[0].keys_as_values);
        assert_eq!(saved.rope_full.dims, 32);
        assert_eq!(saved.rope_sliding.dims, 16);

        let error = Config::from_json(&serde_json::json!({
            "model_type": "gemma4_text", "hidden_size": 64, "intermediate_size": 96,
            "vocab_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
            "head_dim": 16, "layer_types": ["sliding_attention", "full_attention"]
        }))
        .unwrap_err()
        .to_string();
        assert!(error.contains("global_head_dim"), "{error}");
    }
}
