//! Whisper's text decoder: token ids in, next-token logits out, reading the encoder's output
//! through cross-attention. A token embedding plus a learned position embedding (indexed by
//! the token's place in the decoded sequence), pre-norm layers each made of causal
//! self-attention, cross-attention over the encoder output and an ungated MLP (every
//! LayerNorm with bias; every projection biased but the keys'), a final LayerNorm, and an
//! output head tied to the token embedding.
//!
//! Decoding keeps two kinds of state, both explicit: [`SelfAttentionCache`], the keys and
//! values of the tokens decoded so far (appended each step), and [`CrossAttentionStates`], the
//! encoder output projected to each layer's keys and values once per 30 s window.
//!
//! References: transformers' `models/whisper/modeling_whisper.py` (5.24, `WhisperDecoder`,
//! `WhisperDecoderLayer`, `WhisperAttention`; the head is `proj_out`, tied to
//! `model.decoder.embed_tokens`); Radford et al., "Robust Speech Recognition via Large-Scale
//! Weak Supervision" (2022).

use mlx::fast::AttentionMask;
use mlx::{Array, Dtype};
use serde_json::Value;

use crate::activation::Activation;
use crate::config::{Fields, dim, limits};
use crate::embedding::Embedding;
use crate::layer_norm::LayerNorm;
use crate::linear::Linear;
use crate::weights::Weights;
use crate::{Error, Result};

/// Most decoder positions a config may claim (Whisper's 448).
const MAX_TARGET_POSITIONS: usize = 1 << 16;
/// transformers' LayerNorm epsilon, which Whisper's configs do not state.
const LAYER_NORM_EPS: f32 = 1e-5;

/// The decoder's hyperparameters, from a Whisper checkpoint's `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderConfig {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `d_model`: the width, shared with the encoder.
    pub d_model: usize,
    /// `decoder_layers`.
    pub decoder_layers: usize,
    /// `decoder_attention_heads`; each head is `d_model / decoder_attention_heads` wide.
    pub decoder_attention_heads: usize,
    /// `decoder_ffn_dim`.
    pub decoder_ffn_dim: usize,
    /// `max_target_positions`: the longest token sequence the decoder reads.
    pub max_target_positions: usize,
    /// `activation_function` (`gelu` when absent, transformers' default).
    pub activation_function: String,
}

impl DecoderConfig {
    /// Reads the decoder's keys from `object`; a missing size, or one beyond any real model, is
    /// an error naming the field. `scale_embedding` is not read: transformers' decoder defines
    /// the scale but never applies it.
    pub fn from_json(object: &Value) -> Result<DecoderConfig> {
        let f = Fields { object };
        let d_model = f.required_bounded("d_model", limits::HIDDEN)?;
        let heads = f.required_bounded("decoder_attention_heads", limits::HEADS)?;
        if heads == 0 || !d_model.is_multiple_of(heads) {
            return Err(Error::Config(format!(
                "{heads} decoder attention heads do not split `d_model` = {d_model}"
            )));
        }
        let vocab_size = f.required_bounded("vocab_size", limits::VOCAB)?;
        let max_target_positions =
            f.required_bounded("max_target_positions", MAX_TARGET_POSITIONS)?;
        if vocab_size == 0 || max_target_positions == 0 {
            return Err(Error::Config(
                "`vocab_size` and `max_target_positions` must be positive".into(),
            ));
        }
        Ok(DecoderConfig {
            vocab_size,
            d_model,
            decoder_layers: f.required_bounded("decoder_layers", limits::LAYERS)?,
            decoder_attention_heads: heads,
            decoder_ffn_dim: f.required_bounded("decoder_ffn_dim", limits::INTERMEDIATE)?,
            max_target_positions,
            activation_function: f.str("activation_function").unwrap_or("gelu").to_string(),
        })
    }
}

/// Query, key, value and output projections of one attention block, its heads and scale.
struct HeadProjections {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    out_proj: Linear,
    heads: i32,
    head_dim: i32,
}

impl HeadProjections {
    fn new(weights: &mut Weights, prefix: &str, d: i32, heads: i32) -> Result<HeadProjections> {
        // Every projection but the key one has a bias: refuse a checkpoint without one rather
        // than compute without it.
        let biased = |weights: &mut Weights, name: &str| -> Result<Linear> {
            let p = format!("{prefix}.{name}");
            if !weights.contains(&format!("{p}.bias")) {
                return Err(Error::Weights(format!("tensor `{p}.bias` is missing")));
            }
            weights.linear(&p, d, d)
        };
        Ok(HeadProjections {
            q_proj: biased(weights, "q_proj")?,
            k_proj: weights.matrix(&format!("{prefix}.k_proj"), d, d)?,
            v_proj: biased(weights, "v_proj")?,
            out_proj: biased(weights, "out_proj")?,
            heads,
            head_dim: d / heads,
        })
    }

    /// `x: [batch, tokens, d]` through `proj`, split into `[batch, heads, tokens, head_dim]`.
    fn split(&self, proj: &Linear, x: &Array) -> Result<Array> {
        let s = x.shape();
        Ok(proj
            .forward(x)?
            .reshape(&[s[0], s[1], self.heads, self.head_dim])?
            .transpose(&[0, 2, 1, 3])?)
    }

    /// `queries` over `keys`/`values` (all split into heads), merged and projected out.
    fn attend(
        &self,
        queries: &Array,
        keys: &Array,
        values: &Array,
        mask: AttentionMask<'_>,
    ) -> Result<Array> {
        let scale = 1.0 / (self.head_dim as f32).sqrt();
        let out = mlx::fast::scaled_dot_product_attention(queries, keys, values, scale, mask)?;
        let s = out.shape();
        let merged =
            out.transpose(&[0, 2, 1, 3])?
                .reshape(&[s[0], s[2], self.heads * self.head_dim])?;
        self.out_proj.forward(&merged)
    }

    fn collect_arrays(&self, out: &mut Vec<Array>) {
        for proj in [&self.q_proj, &self.k_proj, &self.v_proj, &self.out_proj] {
            proj.collect_arrays(out);
        }
    }
}

/// One pre-norm decoder layer (`model.decoder.layers.{i}`).
struct DecoderLayer {
    self_attn_layer_norm: LayerNorm,
    self_attn: HeadProjections,
    encoder_attn_layer_norm: LayerNorm,
    encoder_attn: HeadProjections,
    final_layer_norm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// The keys and values of every token decoded so far, per layer, `[batch, heads, tokens,
/// head_dim]`; empty before the first step.
pub struct SelfAttentionCache {
    layers: Vec<Option<(Array, Array)>>,
    tokens: usize,
}

impl SelfAttentionCache {
    /// Tokens it holds.
    pub fn len(&self) -> usize {
        self.tokens
    }

    /// Whether it holds no token yet.
    pub fn is_empty(&self) -> bool {
        self.tokens == 0
    }
}

/// The encoder output of one window projected to each layer's cross-attention keys and
/// values, `[batch, heads, positions, head_dim]`: computed once, read by every step.
pub struct CrossAttentionStates {
    layers: Vec<(Array, Array)>,
}

impl CrossAttentionStates {
    /// Every array it holds, to evaluate them before the first step.
    pub fn arrays(&self) -> Vec<Array> {
        self.layers
            .iter()
            .flat_map(|(k, v)| [k.clone(), v.clone()])
            .collect()
    }
}

/// Whisper's decoder.
pub struct Decoder {
    config: DecoderConfig,
    activation: Activation,
    embed_tokens: Embedding,
    /// `embed_positions.weight`, `[max_target_positions, d_model]`.
    embed_positions: Array,
    layers: Vec<DecoderLayer>,
    layer_norm: LayerNorm,
    proj_out: Linear,
}

impl Decoder {
    /// Builds the decoder from transformers-named weights under `prefix` (`model.decoder` in
    /// a Whisper checkpoint). The output head is the token embedding when `tie` says so (or,
    /// when the config is silent, when the checkpoint holds no `{head}.weight`), else
    /// `{head}.weight` (`proj_out` in a Whisper checkpoint).
    pub fn new(
        config: DecoderConfig,
        weights: &mut Weights,
        prefix: &str,
        head: &str,
        tie: Option<bool>,
    ) -> Result<Decoder> {
        let d = dim(config.d_model, "d_model")?;
        let vocab = dim(config.vocab_size, "vocab_size")?;
        let ffn = dim(config.decoder_ffn_dim, "decoder_ffn_dim")?;
        let heads = dim(config.decoder_attention_heads, "decoder_attention_heads")?;
        let positions = dim(config.max_target_positions, "max_target_positions")?;
        let activation = Activation::from_name(&config.activation_function)?;
        let layer_norm = |weights: &mut Weights, name: &str| -> Result<LayerNorm> {
            Ok(LayerNorm::new(
                Some(weights.dense(&format!("{prefix}.{name}.weight"), &[d])?),
                Some(weights.dense(&format!("{prefix}.{name}.bias"), &[d])?),
                LAYER_NORM_EPS,
            ))
        };
        let embed_tokens =
            Embedding::dense(weights.dense(&format!("{prefix}.embed_tokens.weight"), &[vocab, d])?);
        let embed_positions =
            weights.dense(&format!("{prefix}.embed_positions.weight"), &[positions, d])?;
        let mut layers = Vec::with_capacity(config.decoder_layers);
        for i in 0..config.decoder_layers {
            let p = format!("layers.{i}");
            let full = format!("{prefix}.{p}");
            let fc = |weights: &mut Weights, name: &str, out: i32, inp: i32| -> Result<Linear> {
                let name = format!("{full}.{name}");
                if !weights.contains(&format!("{name}.bias")) {
                    return Err(Error::Weights(format!("tensor `{name}.bias` is missing")));
                }
                weights.linear(&name, out, inp)
            };
            layers.push(DecoderLayer {
                self_attn_layer_norm: layer_norm(weights, &format!("{p}.self_attn_layer_norm"))?,
                self_attn: HeadProjections::new(weights, &format!("{full}.self_attn"), d, heads)?,
                encoder_attn_layer_norm: layer_norm(
                    weights,
                    &format!("{p}.encoder_attn_layer_norm"),
                )?,
                encoder_attn: HeadProjections::new(
                    weights,
                    &format!("{full}.encoder_attn"),
                    d,
                    heads,
                )?,
                final_layer_norm: layer_norm(weights, &format!("{p}.final_layer_norm"))?,
                fc1: fc(weights, "fc1", ffn, d)?,
                fc2: fc(weights, "fc2", d, ffn)?,
            });
        }
        let layer_norm = layer_norm(weights, "layer_norm")?;
        let proj_out = embed_tokens.output_head(weights, tie, head, vocab, d)?;
        Ok(Decoder {
            config,
            activation,
            embed_tokens,
            embed_positions,
            layers,
            layer_norm,
            proj_out,
        })
    }

    /// Its hyperparameters.
    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// An empty self-attention cache for one sequence.
    pub fn new_cache(&self) -> SelfAttentionCache {
        SelfAttentionCache {
            layers: (0..self.layers.len()).map(|_| None).collect(),
            tokens: 0,
        }
    }

    /// Every layer's cross-attention keys and values for `encoder_output`
    /// `[batch, positions, d_model]` (the encoder's final output).
    pub fn cross_attention_states(&self, encoder_output: &Array) -> Result<CrossAttentionStates> {
        let shape = encoder_output.shape();
        if shape.len() != 3 || shape[2] != self.config.d_model as i32 {
            return Err(Error::InvalidInput(format!(
                "encoder output of shape {shape:?}, expected [batch, positions, {}]",
                self.config.d_model
            )));
        }
        let layers = self
            .layers
            .iter()
            .map(|layer| {
                let a = &layer.encoder_attn;
                Ok((
                    a.split(&a.k_proj, encoder_output)?,
                    a.split(&a.v_proj, encoder_output)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CrossAttentionStates { layers })
    }

    /// Logits `[batch, tokens, vocab_size]` for `tokens` `[batch, tokens]` (integers), which
    /// follow the `cache.len()` tokens already in `cache`: each token sees the cached ones and
    /// the earlier new ones, and every position of the window in `cross`. Their keys and values
    /// are appended to `cache`. Fails when the sequence would pass `max_target_positions`.
    pub fn forward(
        &self,
        tokens: &Array,
        cross: &CrossAttentionStates,
        cache: &mut SelfAttentionCache,
    ) -> Result<Array> {
        let shape = tokens.shape();
        if shape.len() != 2 || shape[1] < 1 {
            return Err(Error::InvalidInput(format!(
                "decoder tokens of shape {shape:?}, expected [batch, tokens]"
            )));
        }
        let new = shape[1] as usize;
        let end = cache.tokens + new;
        if end > self.config.max_target_positions {
            return Err(Error::InvalidInput(format!(
                "{end} decoder tokens, past `max_target_positions` = {}",
                self.config.max_target_positions
            )));
        }
        if cross.layers.len() != self.layers.len() || cache.layers.len() != self.layers.len() {
            return Err(Error::InvalidInput(
                "caches built for another decoder".into(),
            ));
        }
        let positions = self
            .embed_positions
            .slice_axis(0, cache.tokens as i32, end as i32)?;
        let mut h = self.embed_tokens.forward(tokens)?.add(&positions)?;
        // Each new token sees the cached ones and the new ones up to itself: MLX's causal mask
        // aligns queries with the last keys. One token alone sees everything.
        let mask = if new == 1 {
            AttentionMask::None
        } else {
            AttentionMask::Causal
        };
        for ((layer, slot), (cross_keys, cross_values)) in self
            .layers
            .iter()
            .zip(cache.layers.iter_mut())
            .zip(&cross.layers)
        {
            let a = &layer.self_attn;
            let x = layer.self_attn_layer_norm.forward(&h)?;
            let queries = a.split(&a.q_proj, &x)?;
            let (keys, values) = (a.split(&a.k_proj, &x)?, a.split(&a.v_proj, &x)?);
            let (keys, values) = match slot.take() {
                Some((k, v)) => (
                    mlx::concatenate(&[k, keys], 2)?,
                    mlx::concatenate(&[v, values], 2)?,
                ),
                None => (keys, values),
            };
            h = h.add(&a.attend(&queries, &keys, &values, mask)?)?;
            *slot = Some((keys, values));

            let c = &layer.encoder_attn;
            let x = layer.encoder_attn_layer_norm.forward(&h)?;
            let queries = c.split(&c.q_proj, &x)?;
            h = h.add(&c.attend(&queries, cross_keys, cross_values, AttentionMask::None)?)?;

            let x = layer.final_layer_norm.forward(&h)?;
            let ff = layer
                .fc2
                .forward(&self.activation.apply(&layer.fc1.forward(&x)?)?)?;
            h = h.add(&ff)?;
        }
        cache.tokens = end;
        let h = self.layer_norm.forward(&h)?;
        self.proj_out
            .forward(&h)?
            .astype(Dtype::F32)
            .map_err(Error::from)
    }

    /// Every weight array, for evaluating them once at load.
    pub fn parameters(&self) -> Vec<Array> {
        let mut out = vec![self.embed_positions.clone()];
        self.embed_tokens.collect_arrays(&mut out);
        for layer in &self.layers {
            layer.self_attn_layer_norm.collect_arrays(&mut out);
            layer.self_attn.collect_arrays(&mut out);
            layer.encoder_attn_layer_norm.collect_arrays(&mut out);
            layer.encoder_attn.collect_arrays(&mut out);
            layer.final_layer_norm.collect_arrays(&mut out);
            layer.fc1.collect_arrays(&mut out);
            layer.fc2.collect_arrays(&mut out);
        }
        self.layer_norm.collect_arrays(&mut out);
        self.proj_out.collect_arrays(&mut out);
        out
    }
}
