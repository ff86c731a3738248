//! Qwen2-Audio (`Qwen2AudioForConditionalGeneration`): a Whisper-style encoder reads a clip's
//! log-mel features (30 s chunks of 128 bins in the published model); its layers' output is
//! averaged over pairs of positions (a stride-2 average pool, *before* the encoder's final
//! LayerNorm, unlike Whisper), normalized, and mapped to the text width by one biased linear
//! projector (`multi_modal_projector.linear`). Those rows replace the embeddings of the
//! prompt's audio tokens (`audio_token_index`), which the processor expands to one per row;
//! the Qwen2 decoder then runs over the result, causal everywhere.
//!
//! A clip shorter than the chunk fills only the leading mel frames. transformers masks the
//! encoder's later positions as keys and keeps only the rows they do not reach: `f` valid
//! frames make `l = (f − 1) / 2 + 1` encoder positions and `(l − 2) / 2 + 1` audio tokens. Here
//! only those `l` positions go through the encoder's layers, which is the same computation.
//!
//! The processor lays an audio clip out as `<|audio_bos|>`, the audio tokens, `<|audio_eos|>`;
//! only the audio tokens take features, the markers are text.
//!
//! References: transformers' `models/qwen2_audio/modeling_qwen2_audio.py` and
//! `processing_qwen2_audio.py` (5.24); Chu et al., "Qwen2-Audio Technical Report" (2024).

use kvcache::LayerCache;
use mlx::Array;
use serde_json::Value;

use crate::arch::qwen2::{self, Qwen2};
use crate::audio::whisper::{self, Encoder};
use crate::config::{Fields, dim, missing};
use crate::linear::Linear;
use crate::model::{Audio, AudioInput, Batch, Forward, Model, ModelSpec};
use crate::placement::{MediaTokens, Placed, place_feature_rows};
use crate::weights::Weights;
use crate::{Error, Result};

/// The hyperparameters of a Qwen2-Audio checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `text_config`, read as a Qwen2 text model reads it.
    pub text: qwen2::Config,
    /// `audio_config`.
    pub audio: whisper::Config,
    /// `audio_token_index` (or `audio_token_id`): the id whose embeddings audio features
    /// replace.
    pub audio_token_index: u32,
}

impl Config {
    /// Reads a `Qwen2AudioForConditionalGeneration` config; what is missing or does not fit is
    /// an error naming the field.
    pub fn from_json(config: &Value) -> Result<Config> {
        let root = Fields { object: config };
        let audio = whisper::Config::from_json(
            root.get("audio_config")
                .ok_or_else(|| missing("audio_config"))?,
        )?;
        let id = match root.usize("audio_token_index")? {
            Some(id) => id,
            None => root
                .usize("audio_token_id")?
                .ok_or_else(|| missing("audio_token_index"))?,
        };
        Ok(Config {
            text: qwen2::Config::from_json(config)?,
            audio,
            audio_token_index: u32::try_from(id).map_err(|_| {
                Error::Config(format!("`audio_token_index` = {id} is not a token id"))
            })?,
        })
    }

    /// What the model takes: `audio_config.num_mel_bins` bins over `2 ·
    /// max_source_positions` frames, one audio token per encoded pair of positions.
    pub fn audio_input(&self) -> AudioInput {
        AudioInput {
            num_mel_bins: self.audio.num_mel_bins,
            max_frames: self.audio.input_frames(),
            audio_token: self.audio_token_index,
        }
    }

    /// Audio tokens of a clip filling `valid_frames` frames (counted as the processor counts
    /// them; 0 for fewer than 3 frames).
    pub fn audio_tokens(&self, valid_frames: usize) -> usize {
        let frames = valid_frames.min(self.audio.input_frames());
        let positions = self.audio.positions_for_frames(frames);
        if frames == 0 || positions < 2 {
            0
        } else {
            (positions - 2) / 2 + 1
        }
    }
}

/// A Qwen2-Audio model.
pub struct Qwen2Audio {
    config: Config,
    audio_tower: Encoder,
    /// `multi_modal_projector.linear`: encoder width to text width.
    multi_modal_projector: Linear,
    language_model: Qwen2,
}

impl Qwen2Audio {
    /// Builds the model from a checkpoint's weights, named as Qwen2-Audio is published and
    /// transformers 5.24 saves it (`audio_tower.…`, `multi_modal_projector.…`,
    /// `language_model.model.…`, `language_model.lm_head`) or by transformers 5's modules
    /// (`model.audio_tower.…`, `model.multi_modal_projector.…`, `model.language_model.…`,
    /// `lm_head`).
    pub fn new(config: Config, weights: &mut Weights) -> Result<Qwen2Audio> {
        let modules = weights.contains("model.audio_tower.conv1.weight");
        let (tower, projector) = if modules {
            ("model.audio_tower", "model.multi_modal_projector.linear")
        } else {
            ("audio_tower", "multi_modal_projector.linear")
        };
        let audio_tower = Encoder::new(config.audio.clone(), weights, tower)?;
        let multi_modal_projector = weights.linear(
            projector,
            dim(config.text.hidden_size, "text_config.hidden_size")?,
            dim(config.audio.d_model, "audio_config.d_model")?,
        )?;
        if !weights.contains(&format!("{projector}.bias")) {
            return Err(Error::Weights(format!(
                "tensor `{projector}.bias` is missing"
            )));
        }
        let language_model = Qwen2::new(config.text.clone(), weights)?;
        Ok(Qwen2Audio {
            config,
            audio_tower,
            multi_modal_projector,
            language_model,
        })
    }

    /// Its hyperparameters.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The audio encoder.
    pub fn audio_tower(&self) -> &Encoder {
        &self.audio_tower
    }

    /// The text model: a text-only forward, caches and the output head.
    pub fn language_model(&self) -> &Qwen2 {
        &self.language_model
    }

    /// The encoder's pooled, normalized output for one clip (`[1, num_mel_bins, max_frames]`
    /// features whose first `valid_frames` frames hold it): `[audio_tokens, d_model]`, before
    /// the projector.
    pub fn encode_audio_hidden(&self, features: &Array, valid_frames: usize) -> Result<Array> {
        let tokens = self.config.audio_tokens(valid_frames);
        if tokens == 0 {
            return Err(Error::InvalidInput(format!(
                "a clip of {valid_frames} mel frames is too short for an audio token"
            )));
        }
        if features.dim(0)? != 1 {
            return Err(Error::InvalidInput(format!(
                "audio features of shape {:?}: encode one clip at a time",
                features.shape()
            )));
        }
        let positions = self
            .config
            .audio
            .positions_for_frames(valid_frames.min(self.config.audio.input_frames()));
        let h = self.audio_tower.hidden_states(features, positions)?;
        let (t, d) = (tokens as i32, h.dim(2)?);
        // Pairs of positions averaged: stride-2 pooling, which drops an odd last position.
        let pooled = h
            .slice_axis(1, 0, 2 * t)?
            .reshape(&[t, 2, d])?
            .mean(&[1], false)?;
        self.audio_tower.layer_norm().forward(&pooled)
    }

    /// The audio features of one clip in the text width, `[audio_tokens(valid_frames),
    /// hidden]`, for [`Qwen2Audio::forward_with_audio`].
    pub fn encode_audio(&self, features: &Array, valid_frames: usize) -> Result<Array> {
        self.multi_modal_projector
            .forward(&self.encode_audio_hidden(features, valid_frames)?)
    }

    /// Like [`Model::forward_rows`], with audio features (`[rows, hidden]`: each clip's
    /// [`Qwen2Audio::encode_audio`] concatenated in the order their tokens appear, row by row)
    /// in place of the audio tokens' embeddings. Fails when the batch's audio tokens and the
    /// features' rows differ in number.
    pub fn forward_with_audio(
        &self,
        batch: &Batch,
        audio_features: Option<&Array>,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        let Placed { embedded, .. } = place_feature_rows(
            batch,
            &MediaTokens {
                kind: "audio",
                token: self.config.audio_token_index,
                vocab_size: self.config.text.vocab_size,
                hidden: dim(self.config.text.hidden_size, "text_config.hidden_size")?,
            },
            audio_features,
            |tokens| self.language_model.embed(tokens),
        )?;
        self.language_model
            .forward_embedded(embedded, batch, caches)
    }

    /// Every weight array, for evaluating them once at load.
    pub fn parameters(&self) -> Vec<Array> {
        let mut out = self.audio_tower.parameters();
        self.multi_modal_projector.collect_arrays(&mut out);
        out.extend(self.language_model.parameters());
        out
    }
}

/// Text runs through the text model alone (an audio token without features is then an
/// ordinary embedding); audio goes through [`Audio`].
impl Model for Qwen2Audio {
    fn spec(&self) -> &ModelSpec {
        self.language_model.spec()
    }

    fn forward_rows(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        self.language_model.forward_rows(batch, caches)
    }

    fn forward_rows_through(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
        layers: usize,
    ) -> Result<Forward> {
        self.language_model
            .forward_rows_through(batch, caches, layers)
    }

    fn unembed(&self, hidden: &Array) -> Result<Array> {
        self.language_model.unembed(hidden)
    }

    fn parameters(&self) -> Vec<Array> {
        Qwen2Audio::parameters(self)
    }

    fn audio(&self) -> Option<&dyn Audio> {
        Some(self)
    }
}

impl Audio for Qwen2Audio {
    fn audio_input(&self) -> AudioInput {
        self.config.audio_input()
    }

    fn audio_tokens(&self, valid_frames: usize) -> usize {
        self.config.audio_tokens(valid_frames)
    }

    fn encode_audio(&self, features: &Array, valid_frames: usize) -> Result<Array> {
        Qwen2Audio::encode_audio(self, features, valid_frames)
    }

    fn forward_rows_with_audio(
        &self,
        batch: &Batch,
        features: Option<&Array>,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        self.forward_with_audio(batch, features, caches)
    }
}
