//! Whisper's audio encoder: log-mel frames in, one vector per two frames out. Two
//! convolutions of width 3 (the second of stride 2, halving the frames), each followed by an
//! exact GELU, bring the `num_mel_bins` features to the model width; a position embedding per
//! output position is added (sinusoids in OpenAI's checkpoints, but stored there like learned
//! ones, and read as stored); pre-norm transformer layers follow (LayerNorm with bias,
//! unmasked multi-head attention whose key projection alone has no bias, an ungated MLP) and a
//! final LayerNorm. Qwen2-Audio's encoder is this one with a pooling step before the final norm
//! ([`Encoder::hidden_states`] and [`Encoder::layer_norm`] serve it).
//!
//! The encoder takes exactly `2 · max_source_positions` frames (3000: 30 s), as transformers
//! requires; a shorter clip arrives padded by the feature extractor.
//!
//! References: transformers' `models/whisper/modeling_whisper.py` (5.24, `WhisperEncoder`);
//! Radford et al., "Robust Speech Recognition via Large-Scale Weak Supervision" (2022).

use mlx::fast::{AttentionMask, RopeOffset};
use mlx::{Array, Dtype};
use serde_json::Value;

use crate::activation::Activation;
use crate::attention::{Attention, AttentionParts};
use crate::config::{Fields, dim, limits};
use crate::conv1d::Conv1d;
use crate::layer_norm::LayerNorm;
use crate::linear::Linear;
use crate::weights::Weights;
use crate::{Error, Result};

/// Most mel bins a config may claim.
const MAX_MEL_BINS: usize = 512;
/// Most encoder positions a config may claim (Whisper's 1500 is 30 s).
const MAX_SOURCE_POSITIONS: usize = 1 << 16;
/// transformers' LayerNorm epsilon, which Whisper's configs do not state.
const LAYER_NORM_EPS: f32 = 1e-5;

/// The hyperparameters of a Whisper-style encoder: a Whisper checkpoint's `config.json`, or a
/// family's `audio_config` (Qwen2-Audio's uses the same keys).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `num_mel_bins`: features per frame.
    pub num_mel_bins: usize,
    /// `d_model`: the encoder's width.
    pub d_model: usize,
    /// `encoder_layers`.
    pub encoder_layers: usize,
    /// `encoder_attention_heads`; each head is `d_model / encoder_attention_heads` wide.
    pub encoder_attention_heads: usize,
    /// `encoder_ffn_dim`.
    pub encoder_ffn_dim: usize,
    /// `max_source_positions`: output positions, half the input frames.
    pub max_source_positions: usize,
    /// `activation_function` (`gelu` when absent, transformers' default).
    pub activation_function: String,
}

impl Config {
    /// Reads the encoder's keys from `object`; a missing size, or one beyond any real model, is
    /// an error naming the field.
    pub fn from_json(object: &Value) -> Result<Config> {
        let f = Fields { object };
        let d_model = f.required_bounded("d_model", limits::HIDDEN)?;
        let heads = f.required_bounded("encoder_attention_heads", limits::HEADS)?;
        if heads == 0 || !d_model.is_multiple_of(heads) {
            return Err(Error::Config(format!(
                "{heads} encoder attention heads do not split `d_model` = {d_model}"
            )));
        }
        let num_mel_bins = f.required_bounded("num_mel_bins", MAX_MEL_BINS)?;
        let max_source_positions =
            f.required_bounded("max_source_positions", MAX_SOURCE_POSITIONS)?;
        if num_mel_bins == 0 || max_source_positions == 0 {
            return Err(Error::Config(
                "`num_mel_bins` and `max_source_positions` must be positive".into(),
            ));
        }
        Ok(Config {
            num_mel_bins,
            d_model,
            encoder_layers: f.required_bounded("encoder_layers", limits::LAYERS)?,
            encoder_attention_heads: heads,
            encoder_ffn_dim: f.required_bounded("encoder_ffn_dim", limits::INTERMEDIATE)?,
            max_source_positions,
            activation_function: f.str("activation_function").unwrap_or("gelu").to_string(),
        })
    }

    /// Mel frames the encoder takes: `2 · max_source_positions`.
    pub fn input_frames(&self) -> usize {
        2 * self.max_source_positions
    }

    /// Output positions that `frames` leading frames reach through the stride-2 convolution:
    /// `(frames − 1) / 2 + 1`, as transformers counts them.
    pub fn positions_for_frames(&self, frames: usize) -> usize {
        (frames.max(1) - 1) / 2 + 1
    }
}

/// The ungated feed-forward block: `fc2(act(fc1(x)))`.
struct Mlp {
    fc1: Linear,
    fc2: Linear,
    activation: Activation,
}

/// One pre-norm encoder layer (`layers.{i}`).
struct EncoderLayer {
    self_attn_layer_norm: LayerNorm,
    self_attn: Attention,
    final_layer_norm: LayerNorm,
    mlp: Mlp,
}

/// A Whisper-style audio encoder.
pub struct Encoder {
    config: Config,
    dtype: Dtype,
    conv1: Conv1d,
    conv2: Conv1d,
    activation: Activation,
    /// `embed_positions.weight`, `[max_source_positions, d_model]`.
    embed_positions: Array,
    layers: Vec<EncoderLayer>,
    layer_norm: LayerNorm,
}

impl Encoder {
    /// Builds the encoder from transformers-named weights under `prefix` (the module holding
    /// `conv1`, `embed_positions`, `layers` and `layer_norm`: `model.encoder` in a Whisper
    /// checkpoint, `audio_tower` in Qwen2-Audio's).
    pub fn new(config: Config, weights: &mut Weights, prefix: &str) -> Result<Encoder> {
        let d = dim(config.d_model, "d_model")?;
        let mels = dim(config.num_mel_bins, "num_mel_bins")?;
        let ffn = dim(config.encoder_ffn_dim, "encoder_ffn_dim")?;
        let heads = dim(config.encoder_attention_heads, "encoder_attention_heads")?;
        let positions = dim(config.max_source_positions, "max_source_positions")?;
        let head_dim = d / heads;
        let activation = Activation::from_name(&config.activation_function)?;
        let layer_norm = |weights: &mut Weights, name: &str| -> Result<LayerNorm> {
            Ok(LayerNorm::new(
                Some(weights.dense(&format!("{prefix}.{name}.weight"), &[d])?),
                Some(weights.dense(&format!("{prefix}.{name}.bias"), &[d])?),
                LAYER_NORM_EPS,
            ))
        };
        // Every projection but the key one has a bias: refuse a checkpoint without one rather
        // than compute without it.
        let biased = |weights: &mut Weights, name: &str, out: i32, inp: i32| -> Result<Linear> {
            let p = format!("{prefix}.{name}");
            if !weights.contains(&format!("{p}.bias")) {
                return Err(Error::Weights(format!("tensor `{p}.bias` is missing")));
            }
            weights.linear(&p, out, inp)
        };
        // Width-3 kernels padded by one: conv1 keeps the frames, conv2 (stride 2) halves them.
        let conv = |weights: &mut Weights, name: &str, inp: i32, stride: i32| {
            let w = weights.dense(&format!("{prefix}.{name}.weight"), &[d, inp, 3])?;
            let b = weights.dense(&format!("{prefix}.{name}.bias"), &[d])?;
            Conv1d::from_torch(&w, Some(b), stride, 1, 1)
        };
        let conv1 = conv(weights, "conv1", mels, 1)?;
        let conv2 = conv(weights, "conv2", d, 2)?;
        let embed_positions =
            weights.dense(&format!("{prefix}.embed_positions.weight"), &[positions, d])?;

        let mut layers = Vec::with_capacity(config.encoder_layers);
        for i in 0..config.encoder_layers {
            let p = format!("layers.{i}");
            let a = format!("{p}.self_attn");
            layers.push(EncoderLayer {
                self_attn_layer_norm: layer_norm(weights, &format!("{p}.self_attn_layer_norm"))?,
                self_attn: AttentionParts::new(
                    biased(weights, &format!("{a}.q_proj"), d, d)?,
                    weights.matrix(&format!("{prefix}.{a}.k_proj"), d, d)?,
                    biased(weights, &format!("{a}.v_proj"), d, d)?,
                    biased(weights, &format!("{a}.out_proj"), d, d)?,
                    heads,
                    heads,
                    head_dim,
                )
                .build(),
                final_layer_norm: layer_norm(weights, &format!("{p}.final_layer_norm"))?,
                mlp: Mlp {
                    fc1: biased(weights, &format!("{p}.fc1"), ffn, d)?,
                    fc2: biased(weights, &format!("{p}.fc2"), d, ffn)?,
                    activation,
                },
            });
        }
        let layer_norm = layer_norm(weights, "layer_norm")?;
        Ok(Encoder {
            config,
            dtype: weights.dtype(),
            conv1,
            conv2,
            activation,
            embed_positions,
            layers,
            layer_norm,
        })
    }

    /// Its hyperparameters.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The final LayerNorm (`layer_norm`), for families that pool before it.
    pub fn layer_norm(&self) -> &LayerNorm {
        &self.layer_norm
    }

    /// The encoder's output `[batch, max_source_positions, d_model]` for log-mel `features`
    /// `[batch, num_mel_bins, 2 · max_source_positions]` (the feature extractor's layout; any
    /// float dtype): every position attends to every other.
    pub fn forward(&self, features: &Array) -> Result<Array> {
        let h = self.hidden_states(features, self.config.max_source_positions)?;
        self.layer_norm.forward(&h)
    }

    /// The layers' output before the final norm, for the first `positions` output positions
    /// only: the convolutions run over all the frames, then only those positions go through
    /// the layers, attending to each other. That equals the full encoder with every later
    /// position masked as a key (what Qwen2-Audio does for a clip shorter than the chunk) at
    /// the cost of the positions kept. Fails unless `features` is `[batch, num_mel_bins, 2 ·
    /// max_source_positions]` and `1 ≤ positions ≤ max_source_positions`.
    pub fn hidden_states(&self, features: &Array, positions: usize) -> Result<Array> {
        let c = &self.config;
        let (mels, frames) = (c.num_mel_bins as i32, c.input_frames() as i32);
        let shape = features.shape();
        if shape.len() != 3 || shape[0] < 1 || shape[1..] != [mels, frames] {
            return Err(Error::InvalidInput(format!(
                "log-mel features of shape {shape:?}, expected [batch, {mels}, {frames}]"
            )));
        }
        if positions == 0 || positions > c.max_source_positions {
            return Err(Error::InvalidInput(format!(
                "{positions} encoder positions of {}",
                c.max_source_positions
            )));
        }
        let kept = positions as i32;
        // MLX convolves [batch, length, channels].
        let x = features.astype(self.dtype)?.swap_axes(1, 2)?;
        let x = self.activation.apply(&self.conv1.forward(&x)?)?;
        let x = self.activation.apply(&self.conv2.forward(&x)?)?;
        let mut h = x
            .slice_axis(1, 0, kept)?
            .add(&self.embed_positions.slice_axis(0, 0, kept)?)?;
        for layer in &self.layers {
            let x = layer.self_attn_layer_norm.forward(&h)?;
            let projected = layer.self_attn.project(&x, RopeOffset::Scalar(0))?;
            let heads = layer.self_attn.attend_heads(
                &projected.queries,
                &projected.keys,
                &projected.values,
                AttentionMask::None,
            )?;
            h = h.add(&layer.self_attn.output(&heads, None)?)?;
            let x = layer.final_layer_norm.forward(&h)?;
            let ff = layer
                .mlp
                .fc2
                .forward(&layer.mlp.activation.apply(&layer.mlp.fc1.forward(&x)?)?)?;
            h = h.add(&ff)?;
        }
        Ok(h)
    }

    /// Every weight array, for evaluating them once at load.
    pub fn parameters(&self) -> Vec<Array> {
        let mut out = vec![self.embed_positions.clone()];
        self.conv1.collect_arrays(&mut out);
        self.conv2.collect_arrays(&mut out);
        for layer in &self.layers {
            layer.self_attn_layer_norm.collect_arrays(&mut out);
            layer.self_attn.collect_arrays(&mut out);
            layer.final_layer_norm.collect_arrays(&mut out);
            layer.mlp.fc1.collect_arrays(&mut out);
            layer.mlp.fc2.collect_arrays(&mut out);
        }
        self.layer_norm.collect_arrays(&mut out);
        out
    }
}
