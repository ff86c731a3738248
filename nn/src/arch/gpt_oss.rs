//! gpt-oss (OpenAI): a mixture-of-experts decoder with attention sinks and alternating
//! sliding-window and full layers.
//!
//! Each attention head has a learned *sink* logit: one more column in its softmax that
//! attends to nothing, so the head can put weight nowhere. Layers alternate between a short
//! sliding window (128 in the released models) and full attention; every projection has a
//! bias; positions use YaRN without rounding the ramp's ends. The feed-forward routes each
//! token to the top-k experts by raw router logits, weighted by a softmax over those k; an
//! expert is a SwiGLU clamped at `swiglu_limit` (`(clip(up) + 1) · g · sigmoid(1.702 g)`), with
//! biases. Checkpoints store an expert's gate and up columns interleaved in one
//! `[dim, 2 · hidden]` matrix; they are separated at load.
//!
//! References: transformers' `models/gpt_oss/modeling_gpt_oss.py` (5.24); OpenAI, "gpt-oss-120b
//! & gpt-oss-20b model card" (2025). The MXFP4 expert blocks of OpenAI's original release are
//! a quantized source for `create` (issue 19); this reads the dequantized transformers layout.

use kvcache::{LayerCache, LogicalMask};
use mlx::Array;
use serde_json::Value;

use crate::activation::Activation;
use crate::attention::{Attention, AttentionParts};
use crate::cached_attention::{BatchPositions, attend_cached, check_cache_sets};
use crate::config::{Fields, dim, limits, missing, read_rope};
use crate::embedding::Embedding;
use crate::linear::{Linear, Tensor};
use crate::model::{Batch, Forward, LayerState, Model, ModelSpec, check_depth};
use crate::moe::{Moe, RouterScoring, StackedExperts};
use crate::rms_norm::RmsNorm;
use crate::rope::{Rope, RopeConfig};
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The hyperparameters of a gpt-oss model.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `model_type`.
    pub model_type: String,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size`: each expert's width.
    pub intermediate_size: usize,
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
    /// The rotary embedding.
    pub rope: RopeConfig,
    /// `sliding_window`.
    pub sliding_window: usize,
    /// `layer_types` (or sliding first and then alternating, as the reference defaults).
    pub sliding_layers: Vec<bool>,
    /// `num_local_experts`.
    pub num_local_experts: usize,
    /// `num_experts_per_tok`.
    pub num_experts_per_tok: usize,
    /// `swiglu_alpha`.
    pub swiglu_alpha: f32,
    /// `swiglu_limit`.
    pub swiglu_limit: f32,
    /// `attention_bias`.
    pub attention_bias: bool,
}

impl Config {
    /// Reads the config.
    pub fn from_json(config: &Value) -> Result<Config> {
        let f = Fields::text_section(config);
        let model_type = f
            .str("model_type")
            .ok_or_else(|| missing("model_type"))?
            .to_string();
        let layers = f.required_bounded("num_hidden_layers", limits::LAYERS)?;
        let (heads, kv_heads) = f.attention_heads()?;
        let head_dim = f.required_bounded("head_dim", limits::HIDDEN)?;
        let sliding_layers = match f.layer_types(layers)? {
            Some(sliding) => sliding,
            None => (0..layers).map(|i| i % 2 == 0).collect(),
        };
        let experts = f.required_bounded("num_local_experts", limits::EXPERTS)?;
        let top_k = f.required_usize("num_experts_per_tok")?;
        if experts == 0 || top_k == 0 || top_k > experts {
            return Err(Error::Config(format!(
                "`num_experts_per_tok` = {top_k} must be between 1 and the {experts} experts"
            )));
        }
        Ok(Config {
            model_type,
            hidden_size: f.required_bounded("hidden_size", limits::HIDDEN)?,
            intermediate_size: f.required_bounded("intermediate_size", limits::INTERMEDIATE)?,
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
            rope: read_rope(&f, dim(head_dim, "head_dim")?)?.0,
            sliding_window: f
                .bounded("sliding_window", limits::POSITIONS)?
                .ok_or_else(|| missing("sliding_window"))?,
            sliding_layers,
            num_local_experts: experts,
            num_experts_per_tok: top_k,
            swiglu_alpha: f.f64("swiglu_alpha")?.unwrap_or(1.702) as f32,
            swiglu_limit: f.f64("swiglu_limit")?.unwrap_or(7.0) as f32,
            attention_bias: f.bool("attention_bias")?.unwrap_or(true),
        })
    }

    /// What the engine needs to know of the model.
    pub fn spec(&self) -> ModelSpec {
        ModelSpec {
            model_type: self.model_type.clone(),
            vocab_size: self.vocab_size,
            context_length: self.max_position_embeddings,
            layers: self
                .sliding_layers
                .iter()
                .map(|&slides| LayerState::Attention {
                    kv_heads: self.num_key_value_heads,
                    head_dim: self.head_dim,
                    window: slides.then_some(self.sliding_window),
                })
                .collect(),
        }
    }
}

/// One decoder layer: pre-norm attention with sinks and a pre-norm mixture of experts.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Moe,
    sliding: bool,
}

/// A gpt-oss model.
pub struct GptOss {
    spec: ModelSpec,
    config: Config,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl GptOss {
    /// Builds the model from transformers-named weights.
    pub fn new(config: Config, weights: &mut Weights) -> Result<GptOss> {
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
        let rope = Rope::new(&config.rope)?;

        let mut layers = Vec::with_capacity(config.sliding_layers.len());
        for (i, &sliding) in config.sliding_layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            layers.push(DecoderLayer {
                input_layernorm: norm(weights, &format!("{p}.input_layernorm.weight"))?,
                self_attn: attention(&config, weights, &format!("{p}.self_attn"), &rope)?,
                post_attention_layernorm: norm(
                    weights,
                    &format!("{p}.post_attention_layernorm.weight"),
                )?,
                mlp: experts(&config, weights, &format!("{p}.mlp"))?,
                sliding,
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
        Ok(GptOss {
            spec: config.spec(),
            config,
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
        })
    }
}

/// The attention block (`self_attn`): biased projections and per-head `sinks`.
fn attention(c: &Config, weights: &mut Weights, p: &str, rope: &Rope) -> Result<Attention> {
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
    .with_rope(rope.clone())
    .with_sinks(weights.dense(&format!("{p}.sinks"), &[heads])?)
    .build())
}

/// The experts under `p`: `router` (with bias) and `experts.{gate_up_proj, down_proj}` with
/// their biases, the gate/up columns separated (even columns gate, odd up) and every matrix
/// turned to `[out, in]`.
fn experts(c: &Config, weights: &mut Weights, p: &str) -> Result<Moe> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let experts = dim(c.num_local_experts, "num_local_experts")?;
    let inter = dim(c.intermediate_size, "intermediate_size")?;
    let deinterleave = |a: &Array, leading: &[i32], trailing: &[i32]| -> Result<Array> {
        // `[.., 2 · inter, ..]` with gate and up alternating → gate rows, then up rows.
        let mut shape = leading.to_vec();
        shape.extend([inter, 2]);
        shape.extend_from_slice(trailing);
        let pairs = a.reshape(&shape)?;
        let axis = leading.len() as i32 + 1;
        let gate = pairs.slice_axis(axis, 0, 1)?.squeeze(&[axis])?;
        let up = pairs.slice_axis(axis, 1, 2)?.squeeze(&[axis])?;
        Ok(mlx::concatenate(&[gate, up], leading.len() as i32)?)
    };
    let (gate_up, gate_up_bias, down, down_bias) =
        if weights.contains(&format!("{p}.experts.gate_up_proj")) {
            let gate_up = weights
                .dense(
                    &format!("{p}.experts.gate_up_proj"),
                    &[experts, hidden, 2 * inter],
                )?
                .swap_axes(1, 2)?;
            let gate_up_bias = weights.dense(
                &format!("{p}.experts.gate_up_proj_bias"),
                &[experts, 2 * inter],
            )?;
            let down = weights
                .dense(&format!("{p}.experts.down_proj"), &[experts, inter, hidden])?
                .swap_axes(1, 2)?;
            (
                deinterleave(&gate_up, &[experts], &[hidden])?,
                deinterleave(&gate_up_bias, &[experts], &[])?,
                down,
                weights.dense(&format!("{p}.experts.down_proj_bias"), &[experts, hidden])?,
            )
        } else {
            // Gate and up apart, each expert `[out, in]` (a GGUF file: llama.cpp's converter
            // splits the interleaved columns).
            let stack = |weights: &mut Weights, which: &str, shape: &[i32]| {
                weights.dense(&format!("{p}.experts.{which}"), shape)
            };
            let gate = stack(weights, "gate_proj.weight", &[experts, inter, hidden])?;
            let up = stack(weights, "up_proj.weight", &[experts, inter, hidden])?;
            let gate_bias = stack(weights, "gate_proj.bias", &[experts, inter])?;
            let up_bias = stack(weights, "up_proj.bias", &[experts, inter])?;
            (
                mlx::concatenate(&[gate, up], 1)?,
                mlx::concatenate(&[gate_bias, up_bias], 1)?,
                stack(weights, "down_proj.weight", &[experts, hidden, inter])?,
                stack(weights, "down_proj.bias", &[experts, hidden])?,
            )
        };
    Ok(Moe::from_fused(
        weights.linear(&format!("{p}.router"), experts, hidden)?,
        StackedExperts::new(Tensor::Dense(gate_up)),
        StackedExperts::new(Tensor::Dense(down)),
        c.num_experts_per_tok,
        false,
        RouterScoring::SoftmaxOverTopK,
        Activation::ClampedSwiglu {
            alpha: c.swiglu_alpha,
            limit: c.swiglu_limit,
        },
    )?
    .with_expert_biases(gate_up_bias, down_bias))
}

impl Model for GptOss {
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
        let mut h = self.embed_tokens.forward(&batch.tokens)?;
        for (i, layer) in self.layers.iter().enumerate().take(layers) {
            let x = layer.input_layernorm.forward(&h)?;
            let projected = layer.self_attn.project(&x, positions.rope())?;
            let logical = if layer.sliding {
                LogicalMask::SlidingWindow(self.config.sliding_window)
            } else {
                LogicalMask::Causal
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
            h = h.add(
                &layer
                    .mlp
                    .forward(&layer.post_attention_layernorm.forward(&h)?)?,
            )?;
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
            layer.mlp.collect_arrays(&mut out);
        }
        self.norm.collect_arrays(&mut out);
        self.lm_head.collect_arrays(&mut out);
        out
    }
}
