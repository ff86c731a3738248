//! Whisper, the encoder-decoder speech recognizer: the audio encoder of `whisper.rs` and the
//! text decoder of `whisper_decoder.rs`, built from a transformers
//! `WhisperForConditionalGeneration` checkpoint (`model_type: "whisper"`: tensors under
//! `model.encoder`, `model.decoder`, and `proj_out`, usually tied to the token embedding).
//!
//! It is not a [`crate::Model`]: it never continues a chat prompt, and its decoder reads a
//! window of audio through cross-attention instead of a prompt cache. What it does is in
//! [`crate::audio::whisper_decoding`].
//!
//! Reference: transformers' `models/whisper/modeling_whisper.py` (5.24,
//! `WhisperForConditionalGeneration`).

use std::path::Path;

use mlx::{Array, Dtype};
use quant::Checkpoint;
use serde_json::Value;

use crate::audio::whisper::{self, Encoder};
use crate::audio::whisper_decoder::{CrossAttentionStates, Decoder, DecoderConfig};
use crate::config::Fields;
use crate::registry::default_dtype;
use crate::weights::Weights;
use crate::{Error, Result};

/// Whether `config` (a checkpoint's `config.json`) describes a Whisper model.
pub fn is_whisper(config: &Value) -> bool {
    config.get("model_type").and_then(Value::as_str) == Some("whisper")
}

/// Parameters a Whisper checkpoint with `config` holds (the head tied), counted from its
/// sizes; fails like [`Whisper::new`] on a config it would refuse.
pub fn parameter_count(config: &Value) -> Result<u64> {
    let e = whisper::Config::from_json(config)?;
    let t = DecoderConfig::from_json(config)?;
    let d = e.d_model as u64;
    let norm = 2 * d;
    // Four d×d projections, three of them biased.
    let attention = 4 * d * d + 3 * d;
    let mlp = |ffn: usize| 2 * d * ffn as u64 + ffn as u64 + d;
    let encoder = (e.num_mel_bins as u64 * 3 + 1) * d
        + (d * 3 + 1) * d
        + e.max_source_positions as u64 * d
        + e.encoder_layers as u64 * (2 * norm + attention + mlp(e.encoder_ffn_dim))
        + norm;
    let decoder = (t.vocab_size as u64 + t.max_target_positions as u64) * d
        + t.decoder_layers as u64 * (3 * norm + 2 * attention + mlp(t.decoder_ffn_dim))
        + norm;
    Ok(encoder + decoder)
}

/// A Whisper model: encoder and decoder.
pub struct Whisper {
    encoder: Encoder,
    decoder: Decoder,
}

impl Whisper {
    /// Builds the model from `config` (a Whisper `config.json`) and transformers-named
    /// `weights`. A config of another `model_type` is refused, as is any size the encoder's or
    /// the decoder's config refuses.
    pub fn new(config: &Value, weights: &mut Weights) -> Result<Whisper> {
        if !is_whisper(config) {
            return Err(Error::Config(format!(
                "`model_type` is {}, not \"whisper\"",
                config.get("model_type").unwrap_or(&Value::Null)
            )));
        }
        let encoder_config = whisper::Config::from_json(config)?;
        let decoder_config = DecoderConfig::from_json(config)?;
        let tie = Fields { object: config }.bool("tie_word_embeddings")?;
        let encoder = Encoder::new(encoder_config, weights, "model.encoder")?;
        let decoder = Decoder::new(decoder_config, weights, "model.decoder", "proj_out", tie)?;
        // A tied checkpoint may still store the head's copy of the embedding, which
        // transformers ties over on load.
        if tie != Some(false) {
            weights.set_aside("proj_out.");
        }
        Ok(Whisper { encoder, decoder })
    }

    /// Opens the safetensors checkpoint directory at `path` and builds the model computing in
    /// `dtype` (the device's default when `None`), its weights evaluated. Every tensor of the
    /// checkpoint must be used.
    pub fn load(path: &Path, dtype: Option<Dtype>) -> Result<Whisper> {
        let checkpoint = Checkpoint::open(path)?;
        let config = checkpoint.config().clone();
        if !is_whisper(&config) {
            return Err(Error::Config(format!(
                "`{}` is not a Whisper checkpoint",
                path.display()
            )));
        }
        let dtype = match dtype {
            Some(d) => d,
            None => default_dtype()?,
        };
        let tensors = crate::load::checkpoint_tensors(&checkpoint)?;
        let mut weights = Weights::new(tensors, dtype).dequantized(true);
        let model = Whisper::new(&config, &mut weights)?;
        if let Some(unused) = weights.unused().first() {
            return Err(Error::Weights(format!(
                "the checkpoint holds `{unused}`, which Whisper does not use"
            )));
        }
        mlx::eval(&model.parameters())?;
        Ok(model)
    }

    /// The encoder.
    pub fn encoder(&self) -> &Encoder {
        &self.encoder
    }

    /// The decoder.
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// The cross-attention states of one window: log-mel `features`
    /// `[batch, num_mel_bins, 2 · max_source_positions]` through the encoder, projected for
    /// every decoder layer, evaluated.
    pub fn encode(&self, features: &Array) -> Result<CrossAttentionStates> {
        let encoded = self.encoder.forward(features)?;
        let states = self.decoder.cross_attention_states(&encoded)?;
        mlx::eval(&states.arrays())?;
        Ok(states)
    }

    /// Every weight array.
    pub fn parameters(&self) -> Vec<Array> {
        let mut out = self.encoder.parameters();
        out.extend(self.decoder.parameters());
        out
    }
}
