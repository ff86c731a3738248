//! Mistral and Mixtral: llama's pre-norm decoder (RMSNorm, SwiGLU, grouped-query attention,
//! rotary embeddings) where every layer may attend only to a sliding window of recent tokens
//! (`sliding_window`, 4,096 in Mistral 7B v0.1, absent from later releases), and, in Mixtral,
//! the feed-forward is a mixture of eight SwiGLU experts of which each token uses two.
//!
//! Mistral 3 checkpoints (`Mistral3ForConditionalGeneration`, Mistral Small 3.1) hold this
//! decoder as their `text_config` beside a Pixtral vision tower; the decoder loads from either
//! layout (`language_model.model.…` or `model.language_model.…`), and the vision tower and
//! projector are set aside until images reach the model (issue 21).
//!
//! References: transformers' `models/mistral/modeling_mistral.py`,
//! `models/mixtral/modeling_mixtral.py` and `models/mistral3` (5.24); Jiang et al.,
//! "Mistral 7B" (2023) and "Mixtral of Experts" (2024).

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
use crate::moe::{Moe, RouterScoring, StackedExperts};
use crate::rms_norm::RmsNorm;
use crate::rope::{Rope, RopeConfig};
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The hyperparameters of a Mistral or Mixtral model.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `model_type`.
    pub model_type: String,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `num_hidden_layers`.
    pub num_hidden_layers: usize,
    /// `intermediate_size`: the MLP's (or each expert's) width.
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
    /// `head_dim` (default `hidden_size / num_attention_heads`).
    pub head_dim: usize,
    /// The rotary embedding.
    pub rope: RopeConfig,
    /// `sliding_window`: every layer attends to at most this many positions.
    pub sliding_window: Option<usize>,
    /// `hidden_act`.
    pub hidden_act: String,
    /// Mixtral's experts: `num_local_experts` and `num_experts_per_tok`.
    pub experts: Option<(usize, usize)>,
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
        let (heads, kv_heads) = f.attention_heads()?;
        let head_dim = match f.bounded("head_dim", limits::HIDDEN)? {
            Some(d) => d,
            None if hidden_size % heads == 0 => hidden_size / heads,
            None => return Err(missing("head_dim")),
        };
        let experts = match f.bounded("num_local_experts", limits::EXPERTS)? {
            Some(experts) => {
                let top_k = f.required_usize("num_experts_per_tok")?;
                if top_k == 0 || top_k > experts {
                    return Err(Error::Config(format!(
                        "`num_experts_per_tok` = {top_k} must be between 1 and the {experts} \
                         experts"
                    )));
                }
                Some((experts, top_k))
            }
            None if model_type == "mixtral" => return Err(missing("num_local_experts")),
            None => None,
        };
        Ok(Config {
            model_type,
            hidden_size,
            num_hidden_layers: f.required_bounded("num_hidden_layers", limits::LAYERS)?,
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
            sliding_window: f.bounded("sliding_window", limits::POSITIONS)?,
            hidden_act: f.str("hidden_act").unwrap_or("silu").to_string(),
            experts,
        })
    }

    /// What the engine needs to know of the model.
    pub fn spec(&self) -> ModelSpec {
        ModelSpec {
            model_type: self.model_type.clone(),
            vocab_size: self.vocab_size,
            context_length: self.max_position_embeddings,
            layers: vec![
                LayerState::Attention {
                    kv_heads: self.num_key_value_heads,
                    head_dim: self.head_dim,
                    window: self.sliding_window,
                };
                self.num_hidden_layers
            ],
        }
    }
}

/// A layer's feed-forward block.
enum FeedForward {
    /// Mistral's `mlp`.
    Dense(Mlp),
    /// Mixtral's `block_sparse_moe`: router `gate`, experts `experts.N.{w1, w3, w2}`.
    Sparse(Moe),
}

/// One decoder layer: pre-norm attention and pre-norm feed-forward, each added to the
/// residual stream.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    feed_forward: FeedForward,
}

/// A Mistral or Mixtral model.
pub struct Mistral {
    spec: ModelSpec,
    config: Config,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl Mistral {
    /// Builds the model from transformers-named weights.
    pub fn new(config: Config, weights: &mut Weights) -> Result<Mistral> {
        let hidden = dim(config.hidden_size, "hidden_size")?;
        let vocab = dim(config.vocab_size, "vocab_size")?;
        let inter = dim(config.intermediate_size, "intermediate_size")?;
        let eps = config.rms_norm_eps;
        let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(weights.dense(name, &[hidden])?, eps))
        };
        // The decoder's prefix and its head's name, by checkpoint layout.
        let (root, head) = [
            ("model", "lm_head"),
            ("language_model.model", "language_model.lm_head"),
            ("model.language_model", "lm_head"),
        ]
        .into_iter()
        .find(|(root, _)| weights.contains(&format!("{root}.embed_tokens.weight")))
        .unwrap_or(("model", "lm_head"));
        for tower in [
            "vision_tower.",
            "multi_modal_projector.",
            "model.vision_tower.",
            "model.multi_modal_projector.",
        ] {
            weights.set_aside(tower);
        }
        let embed_name = format!("{root}.embed_tokens.weight");
        let embed_weight = weights.table(&embed_name)?;
        check_matrix(&embed_name, &embed_weight, vocab, hidden)?;
        let embed_tokens = Embedding::new(embed_weight).with_packed(weights.packed(&embed_name)?);
        let activation = Activation::from_name(&config.hidden_act)?;
        let rope = Rope::new(&config.rope)?;

        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("{root}.layers.{i}");
            let feed_forward = match config.experts {
                Some((experts, top_k)) => {
                    let q = format!("{p}.block_sparse_moe");
                    let experts_at = format!("{q}.experts");
                    let stacked = |weights: &mut Weights, which: &str, out: i32, inp: i32| {
                        StackedExperts::load(weights, &experts_at, which, experts, out, inp)
                    };
                    FeedForward::Sparse(Moe::new(
                        weights.matrix(&format!("{q}.gate"), dim(experts, "experts")?, hidden)?,
                        stacked(weights, "w1", inter, hidden)?,
                        stacked(weights, "w3", inter, hidden)?,
                        stacked(weights, "w2", hidden, inter)?,
                        top_k,
                        true,
                        RouterScoring::Softmax,
                        activation,
                    )?)
                }
                None => FeedForward::Dense(Mlp::load(
                    weights,
                    &format!("{p}.mlp"),
                    inter,
                    hidden,
                    activation,
                )?),
            };
            layers.push(DecoderLayer {
                input_layernorm: norm(weights, &format!("{p}.input_layernorm.weight"))?,
                self_attn: attention(&config, weights, &format!("{p}.self_attn"), &rope)?,
                post_attention_layernorm: norm(
                    weights,
                    &format!("{p}.post_attention_layernorm.weight"),
                )?,
                feed_forward,
            });
        }
        let final_norm = norm(weights, &format!("{root}.norm.weight"))?;
        let lm_head =
            embed_tokens.output_head(weights, config.tie_word_embeddings, head, vocab, hidden)?;
        Ok(Mistral {
            spec: config.spec(),
            config,
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
        })
    }
}

/// The attention block (`self_attn`): grouped-query attention without biases.
fn attention(c: &Config, weights: &mut Weights, p: &str, rope: &Rope) -> Result<Attention> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let heads = dim(c.num_attention_heads, "num_attention_heads")?;
    let kv_heads = dim(c.num_key_value_heads, "num_key_value_heads")?;
    let head_dim = dim(c.head_dim, "head_dim")?;
    Ok(
        AttentionParts::load(weights, p, hidden, (heads, kv_heads, head_dim))?
            .with_rope(rope.clone())
            .build(),
    )
}

impl Model for Mistral {
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
        let logical = match self.config.sliding_window {
            Some(window) => LogicalMask::SlidingWindow(window),
            None => LogicalMask::Causal,
        };
        let mut h = self.embed_tokens.forward(&batch.tokens)?;
        for (i, layer) in self.layers.iter().enumerate().take(layers) {
            let x = layer.input_layernorm.forward(&h)?;
            let projected = layer.self_attn.project(&x, positions.rope())?;
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
