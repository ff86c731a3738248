//! OLMo 2 (AI2): llama's blocks with the norms moved after them. Each layer adds
//! `post_attention_layernorm(attention(x))` and then `post_feedforward_layernorm(mlp(x))` to the
//! residual stream, with no norm in front of either, and the q/k norms span all heads'
//! features (`[heads · head_dim]`) before the projections are split into heads.
//!
//! References: transformers' `models/olmo2/modeling_olmo2.py` (5.24); OLMo et al., "2 OLMo 2
//! Furious" (2024).

use kvcache::{LayerCache, LogicalMask};
use mlx::Array;
use serde_json::Value;

use crate::Result;
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

/// The hyperparameters of an OLMo 2 model.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `model_type`.
    pub model_type: String,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `num_hidden_layers`.
    pub num_hidden_layers: usize,
    /// `intermediate_size`.
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
    /// `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    /// The rotary embedding.
    pub rope: RopeConfig,
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
        let (heads, kv_heads) = f.attention_heads()?;
        let head_dim = Fields::even_head_dim(hidden_size, heads)?;
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
            layers: vec![
                LayerState::Attention {
                    kv_heads: self.num_key_value_heads,
                    head_dim: self.head_dim,
                    window: None,
                };
                self.num_hidden_layers
            ],
        }
    }
}

/// One decoder layer: attention and MLP, each normed after it and added to the residual
/// stream.
struct DecoderLayer {
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
    post_feedforward_layernorm: RmsNorm,
}

/// An OLMo 2 model.
pub struct Olmo2 {
    spec: ModelSpec,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl Olmo2 {
    /// Builds the model from transformers-named weights.
    pub fn new(config: Config, weights: &mut Weights) -> Result<Olmo2> {
        let hidden = dim(config.hidden_size, "hidden_size")?;
        let vocab = dim(config.vocab_size, "vocab_size")?;
        let inter = dim(config.intermediate_size, "intermediate_size")?;
        let eps = config.rms_norm_eps;
        let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(weights.dense(name, &[hidden])?, eps))
        };
        let embed_name = "model.embed_tokens.weight";
        let embed_weight = weights.table(embed_name)?;
        check_matrix(embed_name, &embed_weight, vocab, hidden)?;
        let embed_tokens = Embedding::new(embed_weight).with_packed(weights.packed(embed_name)?);
        let activation = Activation::from_name(&config.hidden_act)?;
        let rope = Rope::new(&config.rope)?;

        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("model.layers.{i}");
            layers.push(DecoderLayer {
                self_attn: attention(&config, weights, &format!("{p}.self_attn"), &rope)?,
                post_attention_layernorm: norm(
                    weights,
                    &format!("{p}.post_attention_layernorm.weight"),
                )?,
                mlp: Mlp::load(weights, &format!("{p}.mlp"), inter, hidden, activation)?,
                post_feedforward_layernorm: norm(
                    weights,
                    &format!("{p}.post_feedforward_layernorm.weight"),
                )?,
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
        Ok(Olmo2 {
            spec: config.spec(),
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
        })
    }
}

/// The attention block (`self_attn`), its q/k norms over the whole projections.
fn attention(c: &Config, weights: &mut Weights, p: &str, rope: &Rope) -> Result<Attention> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let heads = dim(c.num_attention_heads, "num_attention_heads")?;
    let kv_heads = dim(c.num_key_value_heads, "num_key_value_heads")?;
    let head_dim = dim(c.head_dim, "head_dim")?;
    let projection = |weights: &mut Weights, name: &str, out: i32, inp: i32| {
        weights.projection(&format!("{p}.{name}"), out, inp, c.attention_bias)
    };
    let norm = |weights: &mut Weights, name: &str, width: i32| -> Result<RmsNorm> {
        Ok(RmsNorm::new(
            weights.dense(&format!("{p}.{name}.weight"), &[width])?,
            c.rms_norm_eps,
        ))
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
    .with_qk_norms_across_heads(
        norm(weights, "q_norm", heads * head_dim)?,
        norm(weights, "k_norm", kv_heads * head_dim)?,
    )
    .build())
}

impl Model for Olmo2 {
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
            let projected = layer.self_attn.project(&h, positions.rope())?;
            let attended = attend_cached(
                &layer.self_attn,
                &projected,
                caches,
                i,
                &batch.positions,
                LogicalMask::Causal,
            )?;
            h = h.add(&layer.post_attention_layernorm.forward(&attended)?)?;
            let ff = layer.mlp.forward(&h)?;
            h = h.add(&layer.post_feedforward_layernorm.forward(&ff)?)?;
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
            layer.self_attn.collect_arrays(&mut out);
            layer.post_attention_layernorm.collect_arrays(&mut out);
            layer.mlp.collect_arrays(&mut out);
            layer.post_feedforward_layernorm.collect_arrays(&mut out);
        }
        self.norm.collect_arrays(&mut out);
        self.lm_head.collect_arrays(&mut out);
        out
    }
}
