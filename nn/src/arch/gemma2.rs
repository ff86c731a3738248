//! Gemma 2: sliding-window and global attention layers alternating, `tanh` soft caps on the
//! attention logits and on the output logits, sandwich norms (before and after attention and
//! MLP), GeGLU, embeddings scaled by `√hidden`, and attention scaled by
//! `query_pre_attn_scalar^-½` instead of `head_dim^-½`. Norms store `w − 1`.
//!
//! References: transformers' `models/gemma2/modeling_gemma2.py` (5.24); Gemma Team, "Gemma 2:
//! Improving Open Language Models at a Practical Size" (2024).

use kvcache::{LayerCache, LogicalMask};
use mlx::Array;
use serde_json::Value;

use crate::activation::Activation;
use crate::attention::{Attention, AttentionParts};
use crate::cached_attention::{BatchPositions, attend_cached, check_cache_sets};
use crate::config::{Fields, dim, limits, missing, read_rope};
use crate::embedding::Embedding;
use crate::linear::Linear;
use crate::mlp::Mlp;
use crate::model::{Batch, Forward, LayerState, Model, ModelSpec, check_depth};
use crate::rms_norm::RmsNorm;
use crate::rope::{Rope, RopeConfig};
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The hyperparameters of a Gemma 2 model.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `model_type`.
    pub model_type: String,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size`.
    pub intermediate_size: usize,
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f32,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `num_key_value_heads`.
    pub num_key_value_heads: usize,
    /// `head_dim`.
    pub head_dim: usize,
    /// The rotary embedding (one for both kinds of layer).
    pub rope: RopeConfig,
    /// `query_pre_attn_scalar`.
    pub query_pre_attn_scalar: f64,
    /// `sliding_window`.
    pub sliding_window: usize,
    /// `layer_types` (or every other layer sliding, from the first, as older configs leave
    /// implicit): whether each layer slides.
    pub sliding_layers: Vec<bool>,
    /// `attn_logit_softcapping`.
    pub attn_logit_softcapping: Option<f32>,
    /// `final_logit_softcapping`.
    pub final_logit_softcapping: Option<f32>,
    /// `hidden_activation` (or `hidden_act`).
    pub hidden_activation: String,
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
        let query_pre_attn_scalar = f
            .f64("query_pre_attn_scalar")?
            .ok_or_else(|| missing("query_pre_attn_scalar"))?;
        if query_pre_attn_scalar <= 0.0 {
            return Err(Error::Config(format!(
                "`query_pre_attn_scalar` must be positive, got {query_pre_attn_scalar}"
            )));
        }
        let sliding_layers = match f.layer_types(layers)? {
            Some(sliding) => sliding,
            None => (0..layers).map(|i| i % 2 == 0).collect(),
        };
        let cap = |key: &str| -> Result<Option<f32>> {
            Ok(f.f64(key)?.filter(|c| *c > 0.0).map(|c| c as f32))
        };
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
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rope: read_rope(&f, dim(head_dim, "head_dim")?)?.0,
            query_pre_attn_scalar,
            sliding_window: f
                .bounded("sliding_window", limits::POSITIONS)?
                .ok_or_else(|| missing("sliding_window"))?,
            sliding_layers,
            attn_logit_softcapping: cap("attn_logit_softcapping")?,
            final_logit_softcapping: cap("final_logit_softcapping")?,
            hidden_activation: f
                .str("hidden_activation")
                .or_else(|| f.str("hidden_act"))
                .unwrap_or("gelu_pytorch_tanh")
                .to_string(),
            attention_bias: f.bool("attention_bias")?.unwrap_or(false),
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

/// One decoder layer with sandwich norms.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    mlp: Mlp,
    post_feedforward_layernorm: RmsNorm,
    sliding: bool,
}

/// A Gemma 2 model (the output head is always the embedding table).
pub struct Gemma2 {
    spec: ModelSpec,
    config: Config,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl Gemma2 {
    /// Builds the model from transformers-named weights.
    pub fn new(config: Config, weights: &mut Weights) -> Result<Gemma2> {
        let hidden = dim(config.hidden_size, "hidden_size")?;
        let vocab = dim(config.vocab_size, "vocab_size")?;
        let inter = dim(config.intermediate_size, "intermediate_size")?;
        let eps = config.rms_norm_eps;
        let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
            RmsNorm::with_unit_offset(weights.dense(name, &[hidden])?, eps)
        };
        let embed_name = "model.embed_tokens.weight";
        let embed_weight = weights.table(embed_name)?;
        check_matrix(embed_name, &embed_weight, vocab, hidden)?;
        let embed_tokens = Embedding::new(embed_weight).with_packed(weights.packed(embed_name)?);
        let activation = Activation::from_name(&config.hidden_activation)?;
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
                pre_feedforward_layernorm: norm(
                    weights,
                    &format!("{p}.pre_feedforward_layernorm.weight"),
                )?,
                mlp: Mlp::load(weights, &format!("{p}.mlp"), inter, hidden, activation)?,
                post_feedforward_layernorm: norm(
                    weights,
                    &format!("{p}.post_feedforward_layernorm.weight"),
                )?,
                sliding,
            });
        }
        let final_norm = norm(weights, "model.norm.weight")?;
        // Gemma always ties; a checkpoint that carries a copy of the table still reads it.
        let _copy_of_the_table = weights.optional("lm_head.weight")?;
        let lm_head = embed_tokens.as_linear();
        Ok(Gemma2 {
            spec: config.spec(),
            config,
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
        })
    }
}

/// The attention block (`self_attn`): soft-capped logits scaled by `query_pre_attn_scalar^-½`.
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
    .with_scale((1.0 / c.query_pre_attn_scalar.sqrt()) as f32)
    .with_logit_softcap(c.attn_logit_softcapping)
    .build())
}

impl Model for Gemma2 {
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
        let mut h = self
            .embed_tokens
            .forward(&batch.tokens)?
            .multiply((self.config.hidden_size as f32).sqrt())?;
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
            h = h.add(&layer.post_attention_layernorm.forward(&attended)?)?;
            let ff = layer
                .mlp
                .forward(&layer.pre_feedforward_layernorm.forward(&h)?)?;
            h = h.add(&layer.post_feedforward_layernorm.forward(&ff)?)?;
        }
        Ok(Forward {
            hidden: self.norm.forward(&h)?,
            conditioning: None,
        })
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
        for layer in &self.layers {
            for norm in [
                &layer.input_layernorm,
                &layer.post_attention_layernorm,
                &layer.pre_feedforward_layernorm,
                &layer.post_feedforward_layernorm,
            ] {
                norm.collect_arrays(&mut out);
            }
            layer.self_attn.collect_arrays(&mut out);
            layer.mlp.collect_arrays(&mut out);
        }
        self.norm.collect_arrays(&mut out);
        self.lm_head.collect_arrays(&mut out);
        out
    }
}
