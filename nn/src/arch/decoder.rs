//! The pre-norm decoder that the dense and MoE transformer families share: embedding, a stack
//! of attention + feed-forward layers over KV caches, a final norm and an output head. Each
//! architecture file decides the options (norm convention, extra norms, biases, MoE layers,
//! sliding windows, scaling) and builds one of these.

use kvcache::{KvCache, LayerCache, LogicalMask, RotatingConfig, RotatingKvCache};
use mlx::Array;

use crate::activation::Activation;
use crate::attention::{Attention, AttentionParts};
use crate::cached_attention::{BatchPositions, attend_cached, check_cache_sets};
use crate::config::{LayerAttention, MoeConfig, TextConfig, dim};
use crate::embedding::Embedding;
use crate::linear::Linear;
use crate::mlp::Mlp;
use crate::model::{Batch, Forward, Model, ModelSpec, check_depth};
use crate::moe::{Moe, RouterScoring, StackedExperts};
use crate::rms_norm::RmsNorm;
use crate::rope::Rope;
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The feed-forward block of a layer.
#[derive(Debug, Clone)]
pub enum FeedForward {
    /// A gated MLP.
    Dense(Mlp),
    /// A routed mixture of experts.
    Experts(Moe),
}

impl FeedForward {
    fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            FeedForward::Dense(mlp) => mlp.forward(x),
            FeedForward::Experts(moe) => moe.forward(x),
        }
    }

    fn collect_arrays(&self, out: &mut Vec<Array>) {
        match self {
            FeedForward::Dense(mlp) => mlp.collect_arrays(out),
            FeedForward::Experts(moe) => moe.collect_arrays(out),
        }
    }
}

/// One decoder layer.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    /// Norm before attention.
    pub input_norm: RmsNorm,
    /// The attention block.
    pub attention: Attention,
    /// Norm of the attention output before the residual add (Gemma).
    pub post_attention_norm: Option<RmsNorm>,
    /// Norm before the feed-forward block.
    pub pre_feedforward_norm: RmsNorm,
    /// The feed-forward block.
    pub feedforward: FeedForward,
    /// Norm of the feed-forward output before the residual add (Gemma).
    pub post_feedforward_norm: Option<RmsNorm>,
    /// Full or sliding-window attention.
    pub kind: LayerAttention,
}

/// A decoder-only transformer.
pub struct Decoder {
    /// The hyperparameters.
    pub config: TextConfig,
    /// What the engine needs to know of it.
    pub spec: ModelSpec,
    /// Token embedding.
    pub embedding: Embedding,
    /// Multiplier of embeddings (Gemma: `√hidden`).
    pub embedding_scale: Option<f32>,
    /// The layers.
    pub layers: Vec<DecoderLayer>,
    /// The final norm.
    pub norm: RmsNorm,
    /// The output head (the embedding table when tied).
    pub lm_head: Linear,
}

impl Decoder {
    fn window(&self) -> Result<usize> {
        self.config
            .sliding_window
            .ok_or_else(|| Error::Config("a sliding layer needs `sliding_window`".into()))
    }
}

impl Model for Decoder {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    fn new_caches_rewindable(&self, slack: usize) -> Result<Vec<Option<LayerCache>>> {
        self.layers
            .iter()
            .map(|layer| {
                Ok(Some(match (layer.kind, self.config.sliding_window) {
                    (LayerAttention::Sliding, Some(window)) => {
                        LayerCache::Rotating(RotatingKvCache::new(RotatingConfig {
                            window,
                            keep: 0,
                            rewind_slack: slack,
                        })?)
                    }
                    _ => LayerCache::Kv(KvCache::new()),
                }))
            })
            .collect()
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

        let mut h = self.embedding.forward(&batch.tokens)?;
        if let Some(scale) = self.embedding_scale {
            h = h.multiply(scale)?;
        }
        for (i, layer) in self.layers.iter().enumerate().take(layers) {
            let x = layer.input_norm.forward(&h)?;
            let projected = layer.attention.project(&x, positions.rope())?;
            let logical = match layer.kind {
                LayerAttention::Full => LogicalMask::Causal,
                LayerAttention::Sliding => LogicalMask::SlidingWindow(self.window()?),
            };
            let mut attended = attend_cached(
                &layer.attention,
                &projected,
                caches,
                i,
                &batch.positions,
                logical,
            )?;
            if let Some(norm) = &layer.post_attention_norm {
                attended = norm.forward(&attended)?;
            }
            h = h.add(&attended)?;
            let mut ff = layer
                .feedforward
                .forward(&layer.pre_feedforward_norm.forward(&h)?)?;
            if let Some(norm) = &layer.post_feedforward_norm {
                ff = norm.forward(&ff)?;
            }
            h = h.add(&ff)?;
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
        self.embedding.collect_arrays(&mut out);
        for layer in &self.layers {
            layer.input_norm.collect_arrays(&mut out);
            layer.attention.collect_arrays(&mut out);
            layer.pre_feedforward_norm.collect_arrays(&mut out);
            layer.feedforward.collect_arrays(&mut out);
            for norm in [&layer.post_attention_norm, &layer.post_feedforward_norm]
                .into_iter()
                .flatten()
            {
                norm.collect_arrays(&mut out);
            }
        }
        self.norm.collect_arrays(&mut out);
        self.lm_head.collect_arrays(&mut out);
        out
    }
}

/// The choices that distinguish one family's decoder from another's.
#[derive(Debug, Clone, Copy, Default)]
pub struct DecoderOptions {
    /// Norm weights are stored as `w − 1` (Gemma's transformers checkpoints).
    pub norm_unit_offset: bool,
    /// Layers carry post-attention and post-feed-forward norms (Gemma 2/3).
    pub sandwich_norms: bool,
    /// Embeddings are multiplied by `√hidden` (Gemma).
    pub scale_embeddings: bool,
}

/// Builds a [`Decoder`] from HF-named weights (`model.layers.N.self_attn.q_proj.weight`, …).
pub fn build_decoder(
    config: TextConfig,
    weights: &mut Weights,
    options: DecoderOptions,
) -> Result<Decoder> {
    let hidden = dim(config.hidden_size, "hidden_size")?;
    let vocab = dim(config.vocab_size, "vocab_size")?;
    let head_dim = dim(config.head_dim, "head_dim")?;
    let heads = dim(config.num_heads, "num_attention_heads")?;
    let kv_heads = dim(config.num_kv_heads, "num_key_value_heads")?;
    let eps = config.rms_norm_eps;
    let activation = Activation::from_name(&config.hidden_act)?;

    let norm = |weights: &mut Weights, name: &str, size: i32| -> Result<RmsNorm> {
        let w = weights.dense(name, &[size])?;
        if options.norm_unit_offset {
            RmsNorm::with_unit_offset(w, eps)
        } else {
            Ok(RmsNorm::new(w, eps))
        }
    };

    let embed_weight = weights.weight("model.embed_tokens.weight")?;
    check_matrix("model.embed_tokens.weight", &embed_weight, vocab, hidden)?;
    let embedding =
        Embedding::new(embed_weight).with_packed(weights.packed("model.embed_tokens.weight")?);

    let global_rope = Rope::new(&config.rope)?;
    let local_rope = config.rope_local.as_ref().map(Rope::new).transpose()?;
    let scale = match config.query_pre_attn_scalar {
        Some(s) if s > 0.0 => (1.0 / s.sqrt()) as f32,
        Some(s) => {
            return Err(Error::Config(format!(
                "query_pre_attn_scalar must be positive, got {s}"
            )));
        }
        None => 1.0 / (head_dim as f32).sqrt(),
    };

    let mut layers = Vec::with_capacity(config.num_layers);
    for i in 0..config.num_layers {
        let p = format!("model.layers.{i}");
        let kind = config
            .layer_attention
            .get(i)
            .copied()
            .unwrap_or(LayerAttention::Full);
        let rope = match (kind, &local_rope) {
            (LayerAttention::Sliding, Some(local)) => local.clone(),
            _ => global_rope.clone(),
        };
        let qk_norm = |weights: &mut Weights, which: &str| -> Result<Option<RmsNorm>> {
            let name = format!("{p}.self_attn.{which}.weight");
            if weights.contains(&name) {
                norm(weights, &name, head_dim).map(Some)
            } else {
                Ok(None)
            }
        };
        let attention = Attention::new(AttentionParts {
            q_proj: weights.linear(&format!("{p}.self_attn.q_proj"), heads * head_dim, hidden)?,
            k_proj: weights.linear(
                &format!("{p}.self_attn.k_proj"),
                kv_heads * head_dim,
                hidden,
            )?,
            v_proj: weights.linear(
                &format!("{p}.self_attn.v_proj"),
                kv_heads * head_dim,
                hidden,
            )?,
            o_proj: weights.linear(&format!("{p}.self_attn.o_proj"), hidden, heads * head_dim)?,
            q_norm: qk_norm(weights, "q_norm")?,
            k_norm: qk_norm(weights, "k_norm")?,
            rope: Some(rope),
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            scale,
            logit_softcap: config.attn_logit_softcapping,
            output_gate: false,
            qk_norm_across_heads: false,
            sinks: None,
        });
        let feedforward = match &config.moe {
            Some(moe) if moe.is_moe_layer(i) => {
                FeedForward::Experts(build_moe(weights, &p, moe, hidden, activation)?)
            }
            _ => {
                let inter = dim(config.intermediate_size, "intermediate_size")?;
                let mlp = Mlp::load(weights, &format!("{p}.mlp"), inter, hidden, activation)?;
                FeedForward::Dense(mlp)
            }
        };
        let (post_attention_norm, pre_feedforward_norm, post_feedforward_norm) =
            if options.sandwich_norms {
                (
                    Some(norm(
                        weights,
                        &format!("{p}.post_attention_layernorm.weight"),
                        hidden,
                    )?),
                    norm(
                        weights,
                        &format!("{p}.pre_feedforward_layernorm.weight"),
                        hidden,
                    )?,
                    Some(norm(
                        weights,
                        &format!("{p}.post_feedforward_layernorm.weight"),
                        hidden,
                    )?),
                )
            } else {
                (
                    None,
                    norm(
                        weights,
                        &format!("{p}.post_attention_layernorm.weight"),
                        hidden,
                    )?,
                    None,
                )
            };
        layers.push(DecoderLayer {
            input_norm: norm(weights, &format!("{p}.input_layernorm.weight"), hidden)?,
            attention,
            post_attention_norm,
            pre_feedforward_norm,
            feedforward,
            post_feedforward_norm,
            kind,
        });
    }
    let final_norm = norm(weights, "model.norm.weight", hidden)?;
    let lm_head = embedding.output_head(
        weights,
        config.tie_word_embeddings,
        "lm_head",
        vocab,
        hidden,
    )?;
    Ok(Decoder {
        embedding_scale: options
            .scale_embeddings
            .then(|| (config.hidden_size as f32).sqrt()),
        spec: config.spec(),
        config,
        embedding,
        layers,
        norm: final_norm,
        lm_head,
    })
}

fn build_moe(
    weights: &mut Weights,
    p: &str,
    moe: &MoeConfig,
    hidden: i32,
    activation: Activation,
) -> Result<Moe> {
    let experts = dim(moe.num_experts, "num_experts")?;
    let inter = dim(moe.expert_intermediate_size, "moe_intermediate_size")?;
    let router = weights.linear(&format!("{p}.mlp.gate"), experts, hidden)?;
    let experts_at = format!("{p}.mlp.experts");
    let stacked = |weights: &mut Weights, which: &str, out: i32, inp: i32| {
        StackedExperts::load(weights, &experts_at, which, moe.num_experts, out, inp)
    };
    Moe::new(
        router,
        stacked(weights, "gate_proj", inter, hidden)?,
        stacked(weights, "up_proj", inter, hidden)?,
        stacked(weights, "down_proj", hidden, inter)?,
        moe.experts_per_token,
        moe.normalize_top_k,
        RouterScoring::Softmax,
        activation,
    )
}
