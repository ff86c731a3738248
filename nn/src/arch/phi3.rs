//! Phi-3 and Phi-4-mini (Microsoft): llama's pre-norm decoder with the attention's query, key
//! and value projections stored as one `qkv_proj` and the MLP's gate and up projections as one
//! `gate_up_proj` (gate first). Phi-4-mini turns only part of each head
//! (`partial_rotary_factor`). The `longrope` scaling of the 128k-context releases is refused
//! by name: its factors switch with the sequence length.
//!
//! References: transformers' `models/phi3/modeling_phi3.py` (5.24); Abdin et al., "Phi-3
//! Technical Report" (2024).

use kvcache::{LayerCache, LogicalMask};
use mlx::Array;
use serde_json::Value;

use crate::activation::Activation;
use crate::attention::{Attention, AttentionParts};
use crate::cached_attention::{BatchPositions, attend_cached, check_cache_sets};
use crate::config::{Fields, dim, limits, missing, read_rope};
use crate::embedding::Embedding;
use crate::linear::{Linear, Tensor};
use crate::mlp::Mlp;
use crate::model::{Batch, Forward, LayerState, Model, ModelSpec, check_depth};
use crate::rms_norm::RmsNorm;
use crate::rope::{Rope, RopeConfig};
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The hyperparameters of a Phi-3 model.
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
    /// The rotary embedding over `head_dim · partial_rotary_factor` features.
    pub rope: RopeConfig,
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
        // transformers 5 keeps the factor in `rope_parameters`, 4 at the top level.
        let factor = match f.get("rope_parameters") {
            Some(params) => Fields { object: params }.f64("partial_rotary_factor")?,
            None => None,
        }
        .or(f.f64("partial_rotary_factor")?)
        .unwrap_or(1.0);
        if !(factor > 0.0 && factor <= 1.0) {
            return Err(Error::Config(format!(
                "`partial_rotary_factor` must be in (0, 1], got {factor}"
            )));
        }
        let rotary = ((head_dim as f64 * factor) as i32) & !1;
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
            rope: read_rope(&f, rotary)?.0,
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

/// One decoder layer: pre-norm attention and pre-norm MLP, each added to the residual stream.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

/// A Phi-3 model.
pub struct Phi3 {
    spec: ModelSpec,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl Phi3 {
    /// Builds the model from transformers-named weights.
    pub fn new(config: Config, weights: &mut Weights) -> Result<Phi3> {
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
                input_layernorm: norm(weights, &format!("{p}.input_layernorm.weight"))?,
                self_attn: attention(&config, weights, &format!("{p}.self_attn"), &rope)?,
                post_attention_layernorm: norm(
                    weights,
                    &format!("{p}.post_attention_layernorm.weight"),
                )?,
                mlp: Mlp::from_fused(
                    weights.matrix(&format!("{p}.mlp.gate_up_proj"), 2 * inter, hidden)?,
                    weights.linear(&format!("{p}.mlp.down_proj"), hidden, inter)?,
                    activation,
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
        Ok(Phi3 {
            spec: config.spec(),
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
        })
    }
}

/// The attention block (`self_attn`), its `qkv_proj` split into queries, keys and values at
/// load (dequantized for it: a packed matrix is cut along rows only in its dense form here).
fn attention(c: &Config, weights: &mut Weights, p: &str, rope: &Rope) -> Result<Attention> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let heads = dim(c.num_attention_heads, "num_attention_heads")?;
    let kv_heads = dim(c.num_key_value_heads, "num_key_value_heads")?;
    let head_dim = dim(c.head_dim, "head_dim")?;
    let (q, kv) = (heads * head_dim, kv_heads * head_dim);
    let qkv = weights.dense(&format!("{p}.qkv_proj.weight"), &[q + 2 * kv, hidden])?;
    let rows = |start: i32, len: i32| -> Result<Linear> {
        Ok(Linear::new(
            Tensor::Dense(qkv.slice_axis(0, start, start + len)?),
            None,
        ))
    };
    Ok(AttentionParts::new(
        rows(0, q)?,
        rows(q, kv)?,
        rows(q + kv, kv)?,
        weights.matrix(&format!("{p}.o_proj"), hidden, q)?,
        heads,
        kv_heads,
        head_dim,
    )
    .with_rope(rope.clone())
    .build())
}

impl Model for Phi3 {
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
            let attended = attend_cached(
                &layer.self_attn,
                &projected,
                caches,
                i,
                &batch.positions,
                LogicalMask::Causal,
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
