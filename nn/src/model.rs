//! The model contract every architecture implements, and what a forward takes and gives.

use kvcache::{
    KvCache, KvStorage, LayerCache, RecurrentCache, RecurrentConfig, RotatingConfig,
    RotatingKvCache,
};
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
        /// The shape of the state.
        state: RecurrentConfig,
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
        self.state_bytes_in(tokens, KvStorage::Float(mlx::Dtype::F32))
    }

    /// Bytes one sequence of `tokens` tokens holds in its caches, keys and values stored as
    /// `storage`.
    pub fn state_bytes_in(&self, tokens: usize, storage: KvStorage) -> usize {
        self.layers
            .iter()
            .map(|layer| match *layer {
                LayerState::Attention {
                    kv_heads,
                    head_dim,
                    window,
                } => {
                    let held = window.map_or(tokens, |w| tokens.min(w));
                    storage.bytes(held.saturating_mul(2 * kv_heads * head_dim))
                }
                LayerState::Recurrent { state } => {
                    // The state is kept in f32 whatever the model computes in.
                    4 * (state.conv_tail * state.conv_dim
                        + state.heads * state.value_dim * state.key_dim)
                }
                LayerState::Stateless => 0,
            })
            .fold(0usize, usize::saturating_add)
    }
}

impl LayerState {
    /// A fresh cache for a layer of this kind, as [`Model::new_caches_rewindable`] builds it
    /// by default: every position for global attention, the last `window` (plus `slack`, so
    /// rejected drafts can be rewound) for sliding attention, a recurrent state for a
    /// recurrent layer, and nothing for a stateless one.
    pub fn new_cache(&self, slack: usize) -> Result<Option<LayerCache>> {
        Ok(match *self {
            LayerState::Attention { window: None, .. } => Some(LayerCache::Kv(KvCache::new())),
            LayerState::Attention {
                window: Some(window),
                ..
            } => Some(LayerCache::Rotating(RotatingKvCache::new(
                RotatingConfig {
                    window,
                    keep: 0,
                    rewind_slack: slack,
                },
            )?)),
            LayerState::Recurrent { state } => {
                Some(LayerCache::Recurrent(RecurrentCache::new(state)?))
            }
            LayerState::Stateless => None,
        })
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
    /// Per row, its rotary position minus its cache position: nonzero only after images in
    /// families whose images take fewer rotary positions than tokens (M-RoPE: Qwen2.5-VL,
    /// [`Vision::rope_delta`]). Empty when every row's is 0; only such families read it.
    pub rope_deltas: Vec<i64>,
    /// Per row, the caller's name for the caches it runs over (an engine's sequence id), so a
    /// model whose caches also live in other processes finds the same row's there. Empty when
    /// the caller names none; a model in one process never reads it.
    pub row_tags: Vec<u64>,
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
            rope_deltas: Vec::new(),
            row_tags: Vec::new(),
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
            rope_deltas: Vec::new(),
            row_tags: Vec::new(),
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
            rope_deltas: Vec::new(),
            row_tags: Vec::new(),
        })
    }

    /// The batch with each row's rotary position `rope_deltas[row]` away from its cache
    /// position ([`Batch::rope_deltas`]): what an engine sets, per sequence, for every forward
    /// after an image of an M-RoPE family.
    pub fn with_rope_deltas(mut self, rope_deltas: Vec<i64>) -> Result<Batch> {
        if rope_deltas.len() != self.positions.len() {
            return Err(Error::InvalidInput(format!(
                "{} rope deltas for a batch of {} rows",
                rope_deltas.len(),
                self.positions.len()
            )));
        }
        self.rope_deltas = rope_deltas;
        Ok(self)
    }

    /// The batch with each row's caches named `row_tags[row]` ([`Batch::row_tags`]).
    pub fn with_row_tags(mut self, row_tags: Vec<u64>) -> Result<Batch> {
        if row_tags.len() != self.positions.len() {
            return Err(Error::InvalidInput(format!(
                "{} row tags for a batch of {} rows",
                row_tags.len(),
                self.positions.len()
            )));
        }
        self.row_tags = row_tags;
        Ok(self)
    }

    /// Row `row`'s rope delta (0 when none is set).
    pub fn rope_delta(&self, row: usize) -> i64 {
        self.rope_deltas.get(row).copied().unwrap_or(0)
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
    /// The state a drafter conditions on, where it is not `hidden` itself (a block drafter's
    /// tapped layers); `None` when it is, so a model with no such drafter computes nothing
    /// more.
    pub conditioning: Option<Array>,
}

impl Forward {
    /// The state a drafter head conditions on: [`Forward::conditioning`] where the model set
    /// one, else the final hidden states (what a multi-token-prediction head reads).
    pub fn conditioning(&self) -> &Array {
        self.conditioning.as_ref().unwrap_or(&self.hidden)
    }
}

/// A drafter head a checkpoint ships beside its decoder (Qwen3.5's multi-token-prediction
/// layer under `mtp.*`): from the target's state at position `S` (its
/// [`Forward::conditioning`]) and the token at `S + 1`, it predicts the token at `S + 2`, with
/// the target's own embedding and output head. Chained drafting feeds a step's `hidden` back
/// as the next step's conditioning.
pub trait DraftHead {
    /// Fresh caches for the head's own layers, one slot per layer.
    fn new_head_caches(&self) -> Result<Vec<Option<LayerCache>>>;

    /// Runs the head over `batch`, whose tokens are each position's *next* token and whose
    /// positions are the target's (`S`), conditioned on `conditioning` (`[rows, tokens,
    /// hidden]`, the target's state at the same positions), row `r` appending to `caches[r]`.
    /// Its `hidden` goes through the target's [`Model::unembed`] for the draft's logits.
    fn forward_head(
        &self,
        batch: &Batch,
        conditioning: &Array,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward>;
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
    /// How its image processor prepares the pixels.
    pub preprocessing: ImagePreprocessing,
}

/// The image processor a model's encoder was trained behind, named by what it does, so a
/// runner can reproduce its pixels (with `media`'s processors of the same names). A family
/// whose processor does something else adds a variant here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImagePreprocessing {
    /// SigLIP's (and Gemma 3's): bilinear, stretched to `image_size` square, mean and std 0.5.
    Siglip,
    /// CLIP's (and LLaVA's): bicubic to `image_size` on the shortest edge, the centre
    /// `image_size` square cut out, CLIP's mean and std.
    Clip,
    /// Qwen2-VL's dynamic-resolution processor (Qwen2.5-VL's too): any size, resized within a
    /// pixel budget to multiples of a merged block's side (bicubic), CLIP's mean and std, cut
    /// into flattened patches; sizes from [`Vision::patch_input`], the budget from the
    /// checkpoint's `preprocessor_config.json`. `image_size` and `tokens_per_image` are 0: each
    /// image's grid decides its tokens.
    Patches,
}

/// A model that can run from input embeddings as well as from token ids, so some positions
/// can take rows computed elsewhere (image features in place of image tokens).
pub trait InputEmbeddings {
    /// What its first layer takes for `tokens` (`[rows, tokens]`): `[rows, tokens, hidden]`.
    fn embed(&self, tokens: &Array) -> Result<Array>;

    /// Like [`Model::forward_rows`], with `embedded` (`[rows, tokens, hidden]`, from
    /// [`InputEmbeddings::embed`] with some rows replaced) as the first layer's input instead
    /// of the embeddings of `batch.tokens`, whose shape and positions still apply.
    fn forward_rows_embedded(
        &self,
        embedded: &Array,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward>;
}

/// An image's size as a dynamic-resolution encoder takes it (transformers' `image_grid_thw`):
/// frames (1 for a still image), rows and columns of patches. `media::PatchProcessorConfig`
/// gives it from the image's size before any pixel is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImageGrid {
    /// Frames, in units of the encoder's temporal patch.
    pub t: usize,
    /// Rows of patches.
    pub h: usize,
    /// Columns of patches.
    pub w: usize,
}

impl ImageGrid {
    /// Patches in the grid: the encoder's input rows.
    pub fn patches(self) -> usize {
        self.t * self.h * self.w
    }

    /// Prompt tokens the image takes when the encoder merges `merge` x `merge` patches into
    /// one.
    pub fn tokens(self, merge: usize) -> usize {
        self.patches() / (merge * merge).max(1)
    }
}

/// How a dynamic-resolution model ([`Vision::patch_input`]) reads images: any size, resized to
/// multiples of `patch_size · merge_size` (the pixel budget is the processor's, in
/// `preprocessor_config.json`), cut into patches, each image taking
/// [`ImageGrid::tokens`]`(merge_size)` image tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatchInput {
    /// The side of a square patch, in pixels.
    pub patch_size: usize,
    /// Patches per side of the block merged into one token.
    pub merge_size: usize,
    /// Frames per patch (a still image repeated).
    pub temporal_patch_size: usize,
    /// Values per patch row: `channels · temporal_patch_size · patch_size²`.
    pub patch_len: usize,
}

/// The image side of a model that reads images as well as text ([`Model::vision`]).
///
/// Fixed-size families (Gemma 3) take `[images, 3, side, side]` pixels and a fixed number of
/// tokens per image ([`Vision::image_input`]). Dynamic-resolution families with multimodal
/// rotary positions (Qwen2.5-VL) also answer [`Vision::patch_input`] and take images as
/// patches with their grids ([`Vision::encode_image_patches`],
/// [`Vision::forward_rows_with_image_grids`]); their text after an image sits at rotary
/// positions some way from its cache positions, which the engine keeps per sequence
/// ([`Vision::rope_delta`], [`Batch::rope_deltas`]).
pub trait Vision {
    /// What it takes.
    fn image_input(&self) -> ImageInput;

    /// The features of `pixel_values` (`[images, 3, image_size, image_size]`, normalized as
    /// the model's processor does): `[images, tokens_per_image, hidden]`.
    fn encode_images(&self, pixel_values: &Array) -> Result<Array>;

    /// Like [`Model::forward_rows`], with `features` (`[images, tokens_per_image, hidden]`,
    /// from [`Vision::encode_images`]) in place of the image tokens' embeddings, images in the
    /// order their tokens appear, row by row. An image's tokens may attend to each other both
    /// ways (Gemma 3's do, LLaVA's are causal), so an image must lie wholly inside one forward. Fails when the batch's image
    /// tokens and the features' rows differ in number.
    fn forward_rows_with_images(
        &self,
        batch: &Batch,
        features: Option<&Array>,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward>;

    /// How a dynamic-resolution model takes images; `None` (the default) for a fixed-size one.
    fn patch_input(&self) -> Option<PatchInput> {
        None
    }

    /// The features of images given as patches (`[patches, patch_len]`, the images' rows one
    /// after the other, each laid out as `media::patchify` does) of `grids`: `[tokens,
    /// hidden]`, each image's [`ImageGrid::tokens`] rows in turn. Fixed-size models refuse.
    fn encode_image_patches(&self, patches: &Array, grids: &[ImageGrid]) -> Result<Array> {
        let _ = (patches, grids);
        Err(Error::InvalidInput(
            "this model takes images of one fixed size, not patches".into(),
        ))
    }

    /// How far the rotary position after `tokens` (a sequence's tokens from its start, its
    /// images of `grids` in order) is from its cache position, `tokens.len()`: what the engine
    /// sets as the sequence's [`Batch::rope_deltas`] for every forward after them. 0 (the
    /// default) for models whose every token takes one position. Text never changes it, so it
    /// holds through decoding and rollback; a sequence restored from a cached prefix recomputes
    /// it from that prefix.
    fn rope_delta(&self, tokens: &[u32], grids: &[ImageGrid]) -> Result<i64> {
        let _ = (tokens, grids);
        Ok(0)
    }

    /// Like [`Vision::forward_rows_with_images`] with the grid of each image in the batch
    /// (row by row, in token order), which models with multimodal rotary positions need to
    /// place each image's tokens; `features` are then `[tokens, hidden]` rows. The default
    /// ignores the grids.
    fn forward_rows_with_image_grids(
        &self,
        batch: &Batch,
        features: Option<&Array>,
        grids: &[ImageGrid],
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        let _ = grids;
        self.forward_rows_with_images(batch, features, caches)
    }
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

/// A drafter that keeps no cache of its own and attends over its target's instead: Gemma 4's
/// assistant ([`crate::arch::gemma4_assistant`]). A round that starts at position `P` (the
/// target's caches hold `0..P`, and the token at `P` is known but not yet run) drafts every
/// token from that one position: the first step reads the token at `P` beside the target's
/// final state at `P − 1`; each further step reads the previous step's draft and its own
/// [`AssistantStep::state`].
pub trait Assistant {
    /// One drafting step for each row of `batch` (one token per row, at the row's position
    /// `P`, which is its target caches' length), conditioned on `conditioning` (`[rows, 1,
    /// target hidden]`), row `r` attending over `target_caches[r]` (the target's own cache
    /// slots, as [`Model::new_caches`] lays them out; read, never written). `target` is the
    /// model the assistant was loaded for, whose token embedding it reads.
    fn draft_step(
        &self,
        target: &dyn Model,
        batch: &Batch,
        conditioning: &Array,
        target_caches: &[&[Option<LayerCache>]],
    ) -> Result<AssistantStep>;

    /// Every weight array, for evaluating folds once at load and for memory accounting.
    fn parameters(&self) -> Vec<Array>;
}

/// One [`Assistant::draft_step`]'s output.
pub struct AssistantStep {
    /// Vocabulary logits, `[rows, 1, vocab]`.
    pub logits: Array,
    /// The state the next step is conditioned on, `[rows, 1, target hidden]`.
    pub state: Array,
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
    ///
    /// The default builds each layer's cache from what [`Model::spec`] says the layer keeps
    /// ([`LayerState::new_cache`]); a family whose caches are laid out otherwise overrides it.
    fn new_caches_rewindable(&self, slack: usize) -> Result<Vec<Option<LayerCache>>> {
        self.spec()
            .layers
            .iter()
            .map(|layer| layer.new_cache(slack))
            .collect()
    }

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

    /// The caches tagged `row_tags` ([`Batch::row_tags`]) will run no forward again: a model
    /// whose caches also live in other processes frees them there. Nothing to do (the default)
    /// for a model in one process, whose caches are the caller's.
    fn release_rows(&self, row_tags: &[u64]) -> Result<()> {
        let _ = row_tags;
        Ok(())
    }

    /// Why it cannot run now, when a forward has failed for a reason beyond its input: a
    /// process it is split across has gone. `None` (the default) for a model in one process.
    fn unavailable(&self) -> Option<String> {
        None
    }

    /// Its image side, when it reads images; `None` (the default) for a text model.
    fn vision(&self) -> Option<&dyn Vision> {
        None
    }

    /// Its forward from input embeddings, when its architecture offers one; `None` (the
    /// default) otherwise.
    fn input_embeddings(&self) -> Option<&dyn InputEmbeddings> {
        None
    }

    /// Its audio side, when it reads audio; `None` (the default) for a text model.
    fn audio(&self) -> Option<&dyn Audio> {
        None
    }

    /// The drafter head its checkpoint ships, when it has one; `None` (the default)
    /// otherwise.
    fn draft_head(&self) -> Option<&dyn DraftHead> {
        None
    }

    /// Makes every forward through all its layers offer, as its [`Forward::conditioning`],
    /// the outputs of `layers` (each layer's output, in that order, side by side along the
    /// features): what a block drafter reads (`arch::dflash`). Families that cannot tap
    /// their layers refuse (the default).
    fn tap_layers(&mut self, layers: &[usize]) -> Result<()> {
        let _ = layers;
        Err(Error::InvalidInput(format!(
            "`{}` models cannot offer their layers' outputs to a block drafter",
            self.spec().model_type
        )))
    }
}
