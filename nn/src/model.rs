//! The model contract every architecture implements, and what a forward takes and gives.

use kvcache::LayerCache;
use mlx::Array;

use crate::{Error, Result};

/// What the engine needs to know of a model, whatever its family: sizes for the scheduler's
/// memory estimates, the context, and what each layer's cache holds.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// The architecture family as its config names it (`llama`, `qwen3_5_text`, …).
    pub model_type: String,
    /// Rows of the output head.
    pub vocab_size: usize,
    /// Longest context the model supports.
    pub context_length: usize,
    /// Parameters the hyperparameters describe (norms included, biases not).
    pub parameters: u64,
    /// What each layer keeps per sequence, in layer order.
    pub layers: Vec<LayerState>,
}

/// What one layer keeps for a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerState {
    /// Keys and values of every position, or of the last `window` positions.
    Attention {
        /// Key/value heads.
        kv_heads: usize,
        /// Features per head.
        head_dim: usize,
        /// The sliding window, for layers that attend only to recent positions.
        window: Option<usize>,
    },
    /// A state of fixed size whatever the length (a convolution tail and a recurrent state).
    Recurrent {
        /// Bytes of the state.
        bytes: usize,
    },
    /// Nothing (a block that only transforms each position, such as an MLP of its own).
    Stateless,
}

/// Checks that a forward through `layers` of a model's `total` layers makes sense (at least
/// one, at most all), as [`Model::forward_rows_through`] requires.
pub fn check_depth(layers: usize, total: usize) -> Result<()> {
    if layers == 0 || layers > total {
        return Err(Error::InvalidInput(format!(
            "a forward through {layers} of {total} layers"
        )));
    }
    Ok(())
}

impl ModelSpec {
    /// Decoder layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Bytes one sequence of `tokens` tokens holds in its caches (f32 keys and values).
    pub fn state_bytes(&self, tokens: usize) -> usize {
        self.layers
            .iter()
            .map(|layer| match *layer {
                LayerState::Attention {
                    kv_heads,
                    head_dim,
                    window,
                } => {
                    let held = window.map_or(tokens, |w| tokens.min(w));
                    held.saturating_mul(2 * kv_heads * head_dim * 4)
                }
                LayerState::Recurrent { bytes } => bytes,
                LayerState::Stateless => 0,
            })
            .fold(0usize, usize::saturating_add)
    }
}

/// The tokens of one forward: `[rows, tokens]` int32 ids, and where each row starts.
///
/// Each row is one sequence with its own caches ([`Model::forward_rows`]) and its own position:
/// rows at different offsets share the forward's matrix products, while each attends only to
/// its own history. Every row must start where its caches end.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Token ids, `[rows, tokens]`, int32.
    pub tokens: Array,
    /// The position of each row's first token.
    pub positions: Vec<usize>,
}

impl Batch {
    /// One sequence of `ids` starting at `position`.
    pub fn single(ids: &[u32], position: usize) -> Result<Batch> {
        if ids.is_empty() {
            return Err(Error::InvalidInput(
                "a forward needs at least one token".into(),
            ));
        }
        let ids: Vec<i32> = ids
            .iter()
            .map(|&id| {
                i32::try_from(id)
                    .map_err(|_| Error::InvalidInput(format!("token id {id} is out of range")))
            })
            .collect::<Result<_>>()?;
        Ok(Batch {
            tokens: Array::from_slice(&ids, &[1, ids.len() as i32])?,
            positions: vec![position],
        })
    }

    /// Rows of host token ids, each with the position of its first token; every row has the
    /// same number of tokens.
    pub fn rows(rows: &[(&[u32], usize)]) -> Result<Batch> {
        let Some(&(first, _)) = rows.first() else {
            return Err(Error::InvalidInput(
                "a forward needs at least one row".into(),
            ));
        };
        let width = first.len();
        let mut ids = Vec::with_capacity(rows.len() * width);
        for (row, _) in rows {
            if row.len() != width || width == 0 {
                return Err(Error::InvalidInput(format!(
                    "batch rows must have the same non-zero length, got {} and {}",
                    width,
                    row.len()
                )));
            }
            for &id in *row {
                ids.push(
                    i32::try_from(id).map_err(|_| {
                        Error::InvalidInput(format!("token id {id} is out of range"))
                    })?,
                );
            }
        }
        Ok(Batch {
            tokens: Array::from_slice(&ids, &[rows.len() as i32, width as i32])?,
            positions: rows.iter().map(|&(_, position)| position).collect(),
        })
    }

    /// Rows of ids already on the device (`[rows, tokens]`, any integer dtype), for a decode
    /// step whose tokens the host has not read yet.
    pub fn from_device(tokens: &Array, positions: Vec<usize>) -> Result<Batch> {
        let shape = tokens.shape();
        if shape.len() != 2 || usize::try_from(shape[0]).ok() != Some(positions.len()) {
            return Err(Error::InvalidInput(format!(
                "batch tokens of shape {shape:?} for {} rows",
                positions.len()
            )));
        }
        Ok(Batch {
            tokens: tokens.astype(mlx::Dtype::I32)?,
            positions,
        })
    }

    /// How many rows (sequences) the batch has.
    pub fn row_count(&self) -> usize {
        self.positions.len()
    }

    /// Tokens per row.
    pub fn width(&self) -> Result<usize> {
        Ok(usize::try_from(self.tokens.dim(1)?).unwrap_or(0))
    }
}

/// What a forward produces.
#[derive(Debug, Clone)]
pub struct Forward {
    /// Final hidden states, `[rows, tokens, hidden]`, before the output head.
    pub hidden: Array,
    /// Extra state a drafter head conditions on (pre-norm hidden states), when the model
    /// offers one.
    pub conditioning: Option<Array>,
}

/// How a model reads images: the pixels its encoder takes and the tokens that stand for an
/// image in the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInput {
    /// The side of the square image the encoder takes, in pixels.
    pub image_size: usize,
    /// Prompt tokens each image takes (each replaced by one row of its features).
    pub tokens_per_image: usize,
    /// The id of those tokens.
    pub image_token: u32,
    /// The token opening an image's tokens in the prompt, when the model has one.
    pub start_token: Option<u32>,
    /// The token closing them, when the model has one.
    pub end_token: Option<u32>,
}

/// The image side of a model that reads images as well as text ([`Model::vision`]).
pub trait Vision {
    /// What it takes.
    fn image_input(&self) -> ImageInput;

    /// The features of `pixel_values` (`[images, 3, image_size, image_size]`, normalized as
    /// the model's processor does): `[images, tokens_per_image, hidden]`.
    fn encode_images(&self, pixel_values: &Array) -> Result<Array>;

    /// Like [`Model::forward_rows`], with `features` (`[images, tokens_per_image, hidden]`,
    /// from [`Vision::encode_images`]) in place of the image tokens' embeddings, images in the
    /// order their tokens appear, row by row. Each image's tokens attend to each other both
    /// ways, so an image must lie wholly inside one forward. Fails when the batch's image
    /// tokens and the features' rows differ in number.
    fn forward_rows_with_images(
        &self,
        batch: &Batch,
        features: Option<&Array>,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward>;
}

/// How a model reads audio: the log-mel features its encoder takes (as `media::log_mel`
/// computes them with `LogMelConfig::whisper(num_mel_bins)` over a chunk of `max_frames`
/// frames, 160 samples apart at 16 kHz) and the token that stands for each encoded position in
/// the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AudioInput {
    /// Mel bins per frame.
    pub num_mel_bins: usize,
    /// Frames of one chunk (3000 for 30 s); a clip fills its leading frames.
    pub max_frames: usize,
    /// The id of the prompt tokens each replaced by one row of audio features.
    pub audio_token: u32,
}

/// The audio side of a model that reads audio as well as text ([`Model::audio`]).
pub trait Audio {
    /// What it takes.
    fn audio_input(&self) -> AudioInput;

    /// How many audio tokens a clip whose features fill `valid_frames` frames takes (what the
    /// family's processor expands its audio placeholder to).
    fn audio_tokens(&self, valid_frames: usize) -> usize;

    /// The features of one clip, `[1, num_mel_bins, max_frames]` log-mel features of which the
    /// first `valid_frames` hold the clip: `[audio_tokens(valid_frames), hidden]`. Fails when
    /// the clip is too short to make a token.
    fn encode_audio(&self, features: &Array, valid_frames: usize) -> Result<Array>;

    /// Like [`Model::forward_rows`], with `features` (rows of [`Audio::encode_audio`], clips
    /// concatenated in the order their tokens appear, row by row) in place of the audio
    /// tokens' embeddings. Fails when the batch's audio tokens and the features' rows differ
    /// in number.
    fn forward_rows_with_audio(
        &self,
        batch: &Batch,
        features: Option<&Array>,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward>;
}

/// A language model: embeds tokens, runs its layers over caches, and maps hidden states to
/// vocabulary logits.
pub trait Model {
    /// What the engine needs to know of it.
    fn spec(&self) -> &ModelSpec;

    /// Fresh caches, one slot per layer (`None` for a layer that keeps no state).
    fn new_caches(&self) -> Result<Vec<Option<LayerCache>>> {
        self.new_caches_rewindable(0)
    }

    /// Fresh caches that can rewind by `slack` tokens at any point: sliding-window layers keep
    /// that many positions beyond their window, for rejected speculative drafts.
    fn new_caches_rewindable(&self, slack: usize) -> Result<Vec<Option<LayerCache>>>;

    /// Runs the layers over a batch of one row, appending to `caches`.
    fn forward(&self, batch: &Batch, caches: &mut [Option<LayerCache>]) -> Result<Forward> {
        self.forward_rows(batch, &mut [caches])
    }

    /// Runs the layers over `batch`, row `r` appending to `caches[r]` (one slot per layer,
    /// as [`Model::new_caches`] builds them). A row's output does not depend on the other
    /// rows beyond floating-point summation order in the shared matrix products.
    fn forward_rows(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward>;

    /// Like [`Model::forward_rows`], through only the first `layers` layers and then the final
    /// norm: a layer-skip draft (`unembed` of its hidden states guesses the next tokens with no
    /// extra weights). Only those layers' caches are appended to. Architectures that cannot
    /// cut their stack refuse.
    fn forward_rows_through(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
        layers: usize,
    ) -> Result<Forward> {
        let _ = (batch, caches, layers);
        Err(Error::InvalidInput(
            "this architecture cannot run a prefix of its layers (layer-skip drafting)".into(),
        ))
    }

    /// Vocabulary logits of `hidden` (`[..., hidden]` → `[..., vocab]`).
    fn unembed(&self, hidden: &Array) -> Result<Array>;

    /// Every weight array, for evaluating folds once at load.
    fn parameters(&self) -> Vec<Array>;

    /// Its image side, when it reads images; `None` (the default) for a text model.
    fn vision(&self) -> Option<&dyn Vision> {
        None
    }

    /// Its audio side, when it reads audio; `None` (the default) for a text model.
    fn audio(&self) -> Option<&dyn Audio> {
        None
    }
}
