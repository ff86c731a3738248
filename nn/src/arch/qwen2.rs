//! Qwen2 and Qwen2.5: Llama's pre-norm decoder (grouped-query attention with rotary positions,
//! a SwiGLU MLP, RMS norms) whose query, key and value projections carry biases, read from the
//! checkpoint. Layers that `layer_types` marks `sliding_attention` (those from
//! `max_window_layers` on, when `use_sliding_window` is set) attend only to the last
//! `sliding_window` positions.
//!
//! References: transformers' `models/qwen2/modeling_qwen2.py` (5.24); Qwen Team, "Qwen2
//! Technical Report" (2024) and "Qwen2.5 Technical Report" (2024).

use kvcache::{LayerCache, LogicalMask};
use mlx::Array;
use serde_json::Value;

use crate::activation::Activation;
use crate::attention::{Attention, AttentionParts};
use crate::cached_attention::{BatchPositions, attend_cached, check_cache_sets};
use crate::config::{Fields, dim, limits, missing, model_type, read_rope, tie_word_embeddings};
use crate::embedding::Embedding;
use crate::linear::Linear;
use crate::mlp::Mlp;
use crate::model::{Batch, Forward, LayerState, Model, ModelSpec, check_depth};
use crate::rms_norm::RmsNorm;
use crate::rope::{Rope, RopeConfig};
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The hyperparameters of a Qwen2 model (and of a Qwen3 one: the same keys).
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
    /// `max_position_embeddings` (4,096 when absent).
    pub max_position_embeddings: usize,
    /// `tie_word_embeddings`; `None` when silent (no `lm_head` then means tied).
    pub tie_word_embeddings: Option<bool>,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `num_key_value_heads`.
    pub num_key_value_heads: usize,
    /// `head_dim` (default `hidden_size / num_attention_heads`).
    pub head_dim: usize,
    /// The rotary embedding: `rope_parameters`, or `rope_theta` and `rope_scaling`.
    pub rope: RopeConfig,
    /// `hidden_act`.
    pub hidden_act: String,
    /// `layer_types` and `sliding_window`: each layer's window, `None` where it attends to
    /// everything before it.
    pub layer_windows: Vec<Option<usize>>,
}

impl Config {
    /// Reads the config.
    pub fn from_json(config: &Value) -> Result<Config> {
        let f = Fields::text_section(config);
        let model_type = model_type(config)?;
        let hidden_size = f.required_bounded("hidden_size", limits::HIDDEN)?;
        let num_hidden_layers = f.required_bounded("num_hidden_layers", limits::LAYERS)?;
        let (heads, kv_heads) = f.attention_heads()?;
        let head_dim = match f.bounded("head_dim", limits::HIDDEN)? {
            Some(d) => d,
            None if hidden_size % heads == 0 => hidden_size / heads,
            None => return Err(missing("head_dim")),
        };
        let sliding = f
            .layer_types(num_hidden_layers)?
            .unwrap_or_else(|| vec![false; num_hidden_layers]);
        let layer_windows = f.layer_windows(&sliding)?;
        Ok(Config {
            model_type,
            hidden_size,
            vocab_size: f.required_bounded("vocab_size", limits::VOCAB)?,
            intermediate_size: f.required_bounded("intermediate_size", limits::INTERMEDIATE)?,
            rms_norm_eps: f
                .f64("rms_norm_eps")?
                .ok_or_else(|| missing("rms_norm_eps"))? as f32,
            max_position_embeddings: f
                .bounded("max_position_embeddings", limits::POSITIONS)?
                .unwrap_or(4096),
            tie_word_embeddings: tie_word_embeddings(config)?,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rope: read_rope(&f, dim(head_dim, "head_dim")?)?.0,
            hidden_act: f.str("hidden_act").unwrap_or("silu").to_string(),
            layer_windows,
        })
    }

    /// What the engine needs to know of the model.
    pub fn spec(&self) -> ModelSpec {
        ModelSpec {
            model_type: self.model_type.clone(),
            vocab_size: self.vocab_size,
            context_length: self.max_position_embeddings,
            layers: self
                .layer_windows
                .iter()
                .map(|&window| LayerState::Attention {
                    kv_heads: self.num_key_value_heads,
                    head_dim: self.head_dim,
                    window,
                })
                .collect(),
        }
    }
}

/// One decoder layer: pre-norm attention and a pre-norm MLP, each added to the residual
/// stream.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
    sliding_window: Option<usize>,
}

/// A Qwen2 model.
pub struct Qwen2 {
    spec: ModelSpec,
    hidden_size: i32,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
}

/// Where a checkpoint keeps the decoder and its head: `model.…` and `lm_head` (text only), or
/// an audio-language checkpoint's `language_model.model.…` and `language_model.lm_head` (as
/// Qwen2-Audio is published and transformers 5.24 saves it) or `model.language_model.…` and
/// `lm_head` (transformers 5's module names).
fn text_root(weights: &Weights) -> (&'static str, &'static str) {
    let root = ["model.language_model", "language_model.model"]
        .into_iter()
        .find(|root| weights.contains(&format!("{root}.embed_tokens.weight")))
        .unwrap_or("model");
    let head = if weights.contains("language_model.lm_head.weight") {
        "language_model.lm_head"
    } else {
        "lm_head"
    };
    (root, head)
}

impl Qwen2 {
    /// Builds the model from transformers-named weights: a text checkpoint's, or the decoder
    /// of an audio-language one (whose encoder and projector the caller takes or sets aside).
    pub fn new(config: Config, weights: &mut Weights) -> Result<Qwen2> {
        let hidden = dim(config.hidden_size, "hidden_size")?;
        let vocab = dim(config.vocab_size, "vocab_size")?;
        let inter = dim(config.intermediate_size, "intermediate_size")?;
        let eps = config.rms_norm_eps;
        let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(weights.dense(name, &[hidden])?, eps))
        };
        let activation = Activation::from_name(&config.hidden_act)?;
        let (root, head) = text_root(weights);
        let embed_name = format!("{root}.embed_tokens.weight");
        let embed_weight = weights.table(&embed_name)?;
        check_matrix(&embed_name, &embed_weight, vocab, hidden)?;
        let embed_tokens = Embedding::new(embed_weight).with_packed(weights.packed(&embed_name)?);
        let rope = Rope::new(&config.rope)?;

        let mut layers = Vec::with_capacity(config.layer_windows.len());
        for (i, &sliding_window) in config.layer_windows.iter().enumerate() {
            let p = format!("{root}.layers.{i}");
            layers.push(DecoderLayer {
                input_layernorm: norm(weights, &format!("{p}.input_layernorm.weight"))?,
                self_attn: attention(&config, weights, &format!("{p}.self_attn"), &rope)?,
                post_attention_layernorm: norm(
                    weights,
                    &format!("{p}.post_attention_layernorm.weight"),
                )?,
                mlp: Mlp::load(weights, &format!("{p}.mlp"), inter, hidden, activation)?,
                sliding_window,
            });
        }
        let final_norm = norm(weights, &format!("{root}.norm.weight"))?;
        let lm_head =
            embed_tokens.output_head(weights, config.tie_word_embeddings, head, vocab, hidden)?;
        Ok(Qwen2 {
            spec: config.spec(),
            hidden_size: hidden,
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
        })
    }
}

impl Qwen2 {
    /// The input embeddings of `tokens` (`[rows, tokens]` ids): `[rows, tokens, hidden]`.
    pub fn embed(&self, tokens: &Array) -> Result<Array> {
        self.embed_tokens.forward(tokens)
    }

    /// Like [`Model::forward_rows`] from input embeddings already made (`[rows, tokens,
    /// hidden]`, in place of `batch.tokens`, of which only the shape is read): the text of
    /// [`Qwen2::embed`] with other features placed among it, such as an audio clip's. Every
    /// position stays causal.
    pub fn forward_embedded(
        &self,
        embedded: Array,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        let expected = [batch.tokens.dim(0)?, batch.tokens.dim(1)?, self.hidden_size];
        if embedded.shape() != expected {
            return Err(Error::InvalidInput(format!(
                "input embeddings of shape {:?} for a batch needing {expected:?}",
                embedded.shape()
            )));
        }
        self.decode(embedded, batch, caches, self.layers.len())
    }

    /// The first `layers` decoder layers and the final norm over input embeddings `h`.
    fn decode(
        &self,
        mut h: Array,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
        layers: usize,
    ) -> Result<Forward> {
        check_depth(layers, self.layers.len())?;
        check_cache_sets(batch, caches, self.layers.len())?;
        let positions = BatchPositions::new(batch)?;
        for (i, layer) in self.layers.iter().enumerate().take(layers) {
            let x = layer.input_layernorm.forward(&h)?;
            let projected = layer.self_attn.project(&x, positions.rope())?;
            let logical = match layer.sliding_window {
                Some(window) => LogicalMask::SlidingWindow(window),
                None => LogicalMask::Causal,
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
            let ff = layer
                .mlp
                .forward(&layer.post_attention_layernorm.forward(&h)?)?;
            h = h.add(&ff)?;
        }
        Ok(Forward {
            hidden: self.norm.forward(&h)?,
            conditioning: None,
        })
    }
}

/// The attention block (`self_attn`): grouped-query attention over rotated queries and keys,
/// its projections biased as the checkpoint has them (q, k and v in Qwen2).
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

impl Model for Qwen2 {
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
        self.decode(embedded, batch, caches, layers)
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
