//! LFM2 (Liquid AI): a hybrid of gated short convolutions and grouped-query attention.
//!
//! Most layers mix tokens with a *gated short convolution*: the input is projected to three
//! streams `B`, `C`, `x`; `B ⊙ x` goes through a causal depthwise convolution over the last few
//! tokens (`conv_L_cache`, 3 in the released models), and `C` gates its output. The state such
//! a layer carries is only the convolution's input tail, a few tokens wide. The other layers
//! attend with per-head q/k norms and rotary embeddings. Every layer then runs a SwiGLU MLP
//! (`w1`, `w3`, `w2`) whose width is adjusted from the config the way the reference does.
//! The final norm is named `embedding_norm`.
//!
//! Reference: transformers' `models/lfm2/modeling_lfm2.py` (5.24); Liquid AI, "LFM2
//! technical report", 2025.

use kvcache::{LayerCache, LogicalMask, RecurrentConfig};
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
use crate::pipeline_parallel::{PipelineStage, run_decoder};
use crate::recurrent_rows::{conv_tails, split_at_captures, store};
use crate::rms_norm::RmsNorm;
use crate::rope::{Rope, RopeConfig};
use crate::short_conv::ShortConv;
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The hyperparameters of an LFM2 model, in transformers 5's spelling or the original one
/// (`block_ff_dim`, `tie_embedding`, `full_attn_idxs`, `rope_theta`).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `model_type`.
    pub model_type: String,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// The MLP's width after the reference's adjustment of `intermediate_size`
    /// (`block_auto_adjust_ff_dim`, `block_ffn_dim_multiplier`, `block_multiple_of`).
    pub feed_forward_size: usize,
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `norm_eps`.
    pub norm_eps: f32,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `tie_word_embeddings`; `None` when silent (no `lm_head` then means tied).
    pub tie_word_embeddings: Option<bool>,
    /// `layer_types`: which layers attend (`true`) and which convolve.
    pub attention_layers: Vec<bool>,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `num_key_value_heads`.
    pub num_key_value_heads: usize,
    /// Features per attention head: `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    /// The rotary embedding.
    pub rope: RopeConfig,
    /// `conv_L_cache`: the convolution's kernel size.
    pub conv_kernel: usize,
    /// `conv_bias`: whether the convolution block's projections and convolution have biases.
    pub conv_bias: bool,
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
        let conv_kernel = f.required_bounded("conv_L_cache", 64)?;
        if conv_kernel < 2 {
            return Err(Error::Config(format!(
                "`conv_L_cache` = {conv_kernel} leaves no convolution"
            )));
        }
        Ok(Config {
            model_type,
            hidden_size,
            feed_forward_size: feed_forward_size(&f)?,
            vocab_size: f.required_bounded("vocab_size", limits::VOCAB)?,
            norm_eps: f.f64("norm_eps")?.ok_or_else(|| missing("norm_eps"))? as f32,
            max_position_embeddings: f
                .bounded("max_position_embeddings", limits::POSITIONS)?
                .ok_or_else(|| missing("max_position_embeddings"))?,
            tie_word_embeddings: match f.bool("tie_word_embeddings")? {
                Some(tied) => Some(tied),
                None => f.bool("tie_embedding")?,
            },
            attention_layers: read_layer_types(&f, layers)?,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rope: read_rope(&f, dim(head_dim, "head_dim")?)?.0,
            conv_kernel,
            conv_bias: f.bool("conv_bias")?.unwrap_or(false),
        })
    }

    fn conv_state(&self) -> RecurrentConfig {
        // A short convolution keeps only its input tail: no recurrent state beside it.
        RecurrentConfig {
            conv_tail: self.conv_kernel - 1,
            conv_dim: self.hidden_size,
            heads: 0,
            value_dim: 0,
            key_dim: 0,
        }
    }

    /// What the engine needs to know of the model.
    pub fn spec(&self) -> ModelSpec {
        ModelSpec {
            model_type: self.model_type.clone(),
            vocab_size: self.vocab_size,
            context_length: self.max_position_embeddings,
            layers: self
                .attention_layers
                .iter()
                .map(|&attends| {
                    if attends {
                        LayerState::Attention {
                            kv_heads: self.num_key_value_heads,
                            head_dim: self.head_dim,
                            window: None,
                        }
                    } else {
                        LayerState::Recurrent {
                            state: self.conv_state(),
                        }
                    }
                })
                .collect(),
        }
    }
}

/// The MLP's width: `intermediate_size` (or `block_ff_dim`), taken to two thirds, scaled by
/// `block_ffn_dim_multiplier` and rounded up to a multiple of `block_multiple_of` when
/// `block_auto_adjust_ff_dim` asks for it (the reference rounds only when a multiplier is set).
fn feed_forward_size(f: &Fields<'_>) -> Result<usize> {
    let base = match f.bounded("intermediate_size", limits::INTERMEDIATE)? {
        Some(size) => size,
        None => f.required_bounded("block_ff_dim", limits::INTERMEDIATE)?,
    };
    if !f.bool("block_auto_adjust_ff_dim")?.unwrap_or(true) {
        return Ok(base);
    }
    let mut size = 2 * base / 3;
    if let Some(multiplier) = f.f64("block_ffn_dim_multiplier")? {
        if !(multiplier > 0.0 && multiplier <= 16.0) {
            return Err(Error::Config(format!(
                "`block_ffn_dim_multiplier` = {multiplier} is out of range"
            )));
        }
        size = (multiplier * size as f64) as usize;
        let multiple = f
            .bounded("block_multiple_of", limits::INTERMEDIATE)?
            .unwrap_or(256);
        if multiple == 0 {
            return Err(Error::Config("`block_multiple_of` must be positive".into()));
        }
        size = size.div_ceil(multiple) * multiple;
    }
    Ok(size)
}

/// `layer_types` (`full_attention` / `conv`), or `full_attn_idxs` (every layer attends when
/// neither is given, as the reference reads it).
fn read_layer_types(f: &Fields<'_>, layers: usize) -> Result<Vec<bool>> {
    if let Some(types) = f.get("layer_types") {
        let list = types
            .as_array()
            .ok_or_else(|| Error::Config("`layer_types` must be a list".into()))?;
        if list.len() != layers {
            return Err(Error::Config(format!(
                "`layer_types` lists {} layers, the model has {layers}",
                list.len()
            )));
        }
        return list
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(true),
                Some("conv") => Ok(false),
                _ => Err(Error::Config(format!("unsupported layer type {t}"))),
            })
            .collect();
    }
    let Some(indices) = f.get("full_attn_idxs") else {
        return Ok(vec![true; layers]);
    };
    let indices = indices
        .as_array()
        .ok_or_else(|| Error::Config("`full_attn_idxs` must be a list".into()))?
        .iter()
        .map(|i| {
            i.as_u64()
                .map(|i| i as usize)
                .filter(|&i| i < layers)
                .ok_or_else(|| Error::Config(format!("`full_attn_idxs` holds {i}")))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((0..layers).map(|i| indices.contains(&i)).collect())
}

/// The gated short convolution of a `conv` layer.
struct ShortConvBlock {
    /// `[3 · hidden, hidden]`: the `B`, `C` and `x` streams.
    in_proj: Linear,
    conv: ShortConv,
    out_proj: Linear,
    hidden: i32,
}

impl ShortConvBlock {
    fn new(c: &Config, weights: &mut Weights, p: &str) -> Result<ShortConvBlock> {
        let hidden = dim(c.hidden_size, "hidden_size")?;
        let kernel = dim(c.conv_kernel, "conv_L_cache")?;
        let projection = |weights: &mut Weights, name: &str, out: i32| {
            weights.projection(&format!("{p}.{name}"), out, hidden, c.conv_bias)
        };
        let conv_weight = weights.dense(&format!("{p}.conv.weight"), &[hidden, 1, kernel])?;
        let conv_bias = if c.conv_bias {
            Some(weights.dense(&format!("{p}.conv.bias"), &[hidden])?)
        } else {
            None
        };
        Ok(ShortConvBlock {
            in_proj: projection(weights, "in_proj", 3 * hidden)?,
            conv: ShortConv::from_torch(&conv_weight, hidden)?.with_bias(conv_bias),
            out_proj: projection(weights, "out_proj", hidden)?,
            hidden,
        })
    }

    fn collect_arrays(&self, out: &mut Vec<Array>) {
        self.in_proj.collect_arrays(out);
        self.conv.collect_arrays(out);
        self.out_proj.collect_arrays(out);
    }

    /// Mixes `x: [rows, tokens, hidden]`, row `r` continuing from the tail in
    /// `caches[r][layer]`.
    fn forward(
        &self,
        x: &Array,
        caches: &mut [&mut [Option<LayerCache>]],
        layer: usize,
    ) -> Result<Array> {
        split_at_captures(x, caches, layer, |piece, caches| {
            let tokens = piece.dim(1)? as usize;
            let streams = self.in_proj.forward(piece)?;
            let mut parts = streams
                .split_at(&[self.hidden, 2 * self.hidden], -1)?
                .into_iter();
            let (Some(b), Some(c), Some(x)) = (parts.next(), parts.next(), parts.next()) else {
                return Err(Error::InvalidInput(
                    "short convolution: the projection did not split".into(),
                ));
            };
            let tail = conv_tails(caches, layer, piece.dtype())?;
            let (convolved, tail) = self.conv.forward(&b.multiply(&x)?, &tail)?;
            store(caches, layer, &tail, None, tokens)?;
            self.out_proj.forward(&c.multiply(&convolved)?)
        })
    }
}

/// How a layer mixes tokens.
enum Operator {
    /// `conv`: the gated short convolution.
    Conv(Box<ShortConvBlock>),
    /// `self_attn`.
    Attention(Box<Attention>),
}

/// One layer: `operator_norm` → operator, `ffn_norm` → `feed_forward`, each added to the
/// residual stream.
struct DecoderLayer {
    operator_norm: RmsNorm,
    operator: Operator,
    ffn_norm: RmsNorm,
    feed_forward: Mlp,
}

impl DecoderLayer {
    /// Layer `index` of the model over `h`, its caches in `caches`.
    fn forward(
        &self,
        h: &Array,
        caches: &mut [&mut [Option<LayerCache>]],
        index: usize,
        batch: &Batch,
        positions: &BatchPositions,
    ) -> Result<Array> {
        let x = self.operator_norm.forward(h)?;
        let mixed = match &self.operator {
            Operator::Conv(conv) => conv.forward(&x, caches, index)?,
            Operator::Attention(attention) => {
                let projected = attention.project(&x, positions.rope())?;
                attend_cached(
                    attention,
                    &projected,
                    caches,
                    index,
                    &batch.positions,
                    LogicalMask::Causal,
                )?
            }
        };
        let h = h.add(&mixed)?;
        Ok(h.add(&self.feed_forward.forward(&self.ffn_norm.forward(&h)?)?)?)
    }
}

/// An LFM2 model.
pub struct Lfm2 {
    spec: ModelSpec,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    embedding_norm: RmsNorm,
    lm_head: Linear,
    /// This rank's range of the layers when they are split across a pipeline: `layers` holds
    /// only those, from the range's start on.
    stage: Option<PipelineStage>,
}

impl Lfm2 {
    /// Builds the model from transformers-named weights (`model.layers.N.conv.in_proj.weight`,
    /// `model.layers.N.self_attn.q_layernorm.weight`, …).
    pub fn new(config: Config, weights: &mut Weights) -> Result<Lfm2> {
        let hidden = dim(config.hidden_size, "hidden_size")?;
        let vocab = dim(config.vocab_size, "vocab_size")?;
        let eps = config.norm_eps;
        let norm = |weights: &mut Weights, name: &str, size: i32| -> Result<RmsNorm> {
            Ok(RmsNorm::new(weights.dense(name, &[size])?, eps))
        };
        let embed_name = "model.embed_tokens.weight";
        let embed_weight = weights.table(embed_name)?;
        check_matrix(embed_name, &embed_weight, vocab, hidden)?;
        let embed_tokens = Embedding::new(embed_weight).with_packed(weights.packed(embed_name)?);
        let rope = Rope::new(&config.rope)?;
        let inter = dim(config.feed_forward_size, "intermediate_size")?;

        let stage = weights.pipeline_stage().cloned();
        let mut layers = Vec::with_capacity(config.attention_layers.len());
        for (i, &attends) in config.attention_layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            if weights.is_another_stages(i, &format!("{p}.")) {
                continue;
            }
            let operator = if attends {
                Operator::Attention(Box::new(attention(
                    &config,
                    weights,
                    &format!("{p}.self_attn"),
                    &rope,
                )?))
            } else {
                Operator::Conv(Box::new(ShortConvBlock::new(
                    &config,
                    weights,
                    &format!("{p}.conv"),
                )?))
            };
            layers.push(DecoderLayer {
                operator_norm: norm(weights, &format!("{p}.operator_norm.weight"), hidden)?,
                operator,
                ffn_norm: norm(weights, &format!("{p}.ffn_norm.weight"), hidden)?,
                feed_forward: Mlp::new(
                    weights.matrix(&format!("{p}.feed_forward.w1"), inter, hidden)?,
                    weights.matrix(&format!("{p}.feed_forward.w3"), inter, hidden)?,
                    weights.linear(&format!("{p}.feed_forward.w2"), hidden, inter)?,
                    Activation::Silu,
                )?,
            });
        }
        let embedding_norm = norm(weights, "model.embedding_norm.weight", hidden)?;
        let lm_head = embed_tokens.output_head(
            weights,
            config.tie_word_embeddings,
            "lm_head",
            vocab,
            hidden,
        )?;
        let mut spec = config.spec();
        if let Some(stage) = &stage {
            stage.keep_own_caches(&mut spec);
        }
        Ok(Lfm2 {
            spec,
            embed_tokens,
            layers,
            embedding_norm,
            lm_head,
            stage,
        })
    }
}

/// The attention block of an attention layer: grouped-query attention with per-head q/k norms
/// (`q_layernorm`, `k_layernorm`) and `out_proj`.
fn attention(c: &Config, weights: &mut Weights, p: &str, rope: &Rope) -> Result<Attention> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let heads = dim(c.num_attention_heads, "num_attention_heads")?;
    let kv_heads = dim(c.num_key_value_heads, "num_key_value_heads")?;
    let head_dim = dim(c.head_dim, "head_dim")?;
    let head_norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
        Ok(RmsNorm::new(
            weights.dense(&format!("{p}.{name}.weight"), &[head_dim])?,
            c.norm_eps,
        ))
    };
    Ok(AttentionParts::new(
        weights.matrix(&format!("{p}.q_proj"), heads * head_dim, hidden)?,
        weights.matrix(&format!("{p}.k_proj"), kv_heads * head_dim, hidden)?,
        weights.matrix(&format!("{p}.v_proj"), kv_heads * head_dim, hidden)?,
        weights.matrix(&format!("{p}.out_proj"), hidden, heads * head_dim)?,
        heads,
        kv_heads,
        head_dim,
    )
    .with_rope(rope.clone())
    .with_qk_norms(
        head_norm(weights, "q_layernorm")?,
        head_norm(weights, "k_layernorm")?,
    )
    .build())
}

impl Model for Lfm2 {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// A convolution layer's tail cannot rewind past a forward; `slack` only concerns sliding
    /// windows, which this family has none of.
    fn forward_rows(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        self.forward_rows_through(batch, caches, self.spec.layers.len())
    }

    fn forward_rows_through(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
        layers: usize,
    ) -> Result<Forward> {
        check_depth(layers, self.spec.layers.len())?;
        check_cache_sets(batch, caches, self.spec.layers.len())?;
        let positions = BatchPositions::new(batch)?;
        let h = self.embed_tokens.forward(&batch.tokens)?;
        let hidden = run_decoder(
            self.stage.as_ref(),
            h,
            &self.layers,
            layers,
            self.spec.layers.len(),
            |layer, h, i| layer.forward(&h, caches, i, batch, &positions),
            |h| self.embedding_norm.forward(h),
        )?;
        Ok(Forward {
            hidden,
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
            layer.operator_norm.collect_arrays(&mut out);
            match &layer.operator {
                Operator::Conv(conv) => conv.collect_arrays(&mut out),
                Operator::Attention(attention) => attention.collect_arrays(&mut out),
            }
            layer.ffn_norm.collect_arrays(&mut out);
            layer.feed_forward.collect_arrays(&mut out);
        }
        self.embedding_norm.collect_arrays(&mut out);
        self.lm_head.collect_arrays(&mut out);
        out
    }
}
