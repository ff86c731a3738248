//! Gemma 3 with images (`Gemma3ForConditionalGeneration`): a SigLIP tower encodes each image
//! into a grid of patch features; the projector averages the grid down to
//! `mm_tokens_per_image` tokens (square pools), normalizes them (an RMS norm storing `w − 1`,
//! with the tower's epsilon) and maps them to the text width with one matrix
//! (`mm_input_projection_weight`, stored `[vision, text]`). Those rows replace the embeddings
//! of the prompt's image tokens (`image_token_index`) — unscaled, where text embeddings are
//! scaled by `√hidden` — and the [`Gemma3`] text decoder runs over the result, each image's
//! tokens attending to the whole image in both directions while everything else stays causal
//! (transformers does so when the processor's `token_type_ids` are passed, as its generation
//! does for a prompt: an image sees neither later images nor later text).
//!
//! The processor lays an image out as `\n\n <start_of_image>`, `mm_tokens_per_image` image
//! tokens, `<end_of_image> \n\n`; only the image tokens take features, the markers are text.
//!
//! References: transformers' `models/gemma3/modeling_gemma3.py` (5.24: `Gemma3Model`,
//! `Gemma3MultiModalProjector`, `create_masks_for_vision_model`) and `processing_gemma3.py`;
//! Gemma Team, "Gemma 3 Technical Report" (2025).

use kvcache::LayerCache;
use mlx::Array;
use serde_json::Value;

use crate::arch::gemma3::{self, Gemma3};
use crate::cached_attention::TokenBlocks;
use crate::config::{Fields, dim, missing};
use crate::model::{Batch, Forward, ImageInput, ImagePreprocessing, Model, ModelSpec, Vision};
use crate::placement::{MediaTokens, Placed, place_image_features};
use crate::rms_norm::RmsNorm;
use crate::vision::siglip::{self, VisionModel};
use crate::weights::Weights;
use crate::{Error, Result};

/// Most tokens an image may take in the prompt.
const MAX_TOKENS_PER_IMAGE: usize = 1 << 16;

/// The hyperparameters of a multimodal Gemma 3.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `text_config`, read as a text-only load reads it.
    pub text: gemma3::Config,
    /// `vision_config`.
    pub vision: siglip::Config,
    /// `mm_tokens_per_image`: a square number whose root divides the tower's patches per side.
    pub mm_tokens_per_image: usize,
    /// `image_token_index` (or `image_token_id`): the id whose embeddings image features
    /// replace.
    pub image_token_index: u32,
    /// `boi_token_index` (or `boi_token_id`): `<start_of_image>`, when the config names it.
    pub boi_token_index: Option<u32>,
    /// `eoi_token_index` (or `eoi_token_id`): `<end_of_image>`, when the config names it.
    pub eoi_token_index: Option<u32>,
}

impl Config {
    /// Reads a `Gemma3ForConditionalGeneration` config; what is missing or does not fit is an
    /// error naming the field.
    pub fn from_json(config: &Value) -> Result<Config> {
        let root = Fields { object: config };
        let vision = siglip::Config::from_json(
            root.get("vision_config")
                .ok_or_else(|| missing("vision_config"))?,
        )?;
        let mm_tokens_per_image =
            root.required_bounded("mm_tokens_per_image", MAX_TOKENS_PER_IMAGE)?;
        let side = mm_tokens_per_image.isqrt();
        let patches = vision.patches_per_side();
        if side == 0 || side * side != mm_tokens_per_image || !patches.is_multiple_of(side) {
            return Err(Error::Config(format!(
                "`mm_tokens_per_image` = {mm_tokens_per_image} is not a square grid that pools \
                 the tower's {patches}×{patches} patches evenly"
            )));
        }
        let token = |names: [&str; 2]| -> Result<Option<u32>> {
            let value = match root.usize(names[0])? {
                Some(v) => Some(v),
                None => root.usize(names[1])?,
            };
            value
                .map(|v| {
                    u32::try_from(v).map_err(|_| {
                        Error::Config(format!("`{}` = {v} is not a token id", names[0]))
                    })
                })
                .transpose()
        };
        Ok(Config {
            text: gemma3::Config::from_json(config)?,
            vision,
            mm_tokens_per_image,
            image_token_index: token(["image_token_index", "image_token_id"])?
                .ok_or_else(|| missing("image_token_index"))?,
            boi_token_index: token(["boi_token_index", "boi_token_id"])?,
            eoi_token_index: token(["eoi_token_index", "eoi_token_id"])?,
        })
    }
}

impl Config {
    /// What the model takes: `vision_config.image_size` square images, each
    /// `mm_tokens_per_image` image tokens between `<start_of_image>` and `<end_of_image>`.
    pub fn image_input(&self) -> ImageInput {
        ImageInput {
            image_size: self.vision.image_size,
            tokens_per_image: self.mm_tokens_per_image,
            image_token: self.image_token_index,
            start_token: self.boi_token_index,
            end_token: self.eoi_token_index,
            preprocessing: ImagePreprocessing::Siglip,
        }
    }
}

/// The projector (`multi_modal_projector`): patch features to text-width image tokens.
pub struct MultiModalProjector {
    mm_soft_emb_norm: RmsNorm,
    /// `[vision hidden, text hidden]`, applied as `x · W`.
    mm_input_projection_weight: Array,
    patches_per_side: i32,
    tokens_per_side: i32,
}

impl MultiModalProjector {
    /// Builds the projector from the weights under `prefix`.
    pub fn new(
        config: &Config,
        weights: &mut Weights,
        prefix: &str,
    ) -> Result<MultiModalProjector> {
        let vision = dim(config.vision.hidden_size, "vision_config.hidden_size")?;
        let text = dim(config.text.hidden_size, "hidden_size")?;
        Ok(MultiModalProjector {
            mm_soft_emb_norm: RmsNorm::with_unit_offset(
                weights.dense(&format!("{prefix}.mm_soft_emb_norm.weight"), &[vision])?,
                config.vision.layer_norm_eps,
            )?,
            mm_input_projection_weight: weights.dense(
                &format!("{prefix}.mm_input_projection_weight"),
                &[vision, text],
            )?,
            patches_per_side: dim(config.vision.patches_per_side(), "vision_config.image_size")?,
            tokens_per_side: dim(config.mm_tokens_per_image.isqrt(), "mm_tokens_per_image")?,
        })
    }

    /// Image tokens `[images, mm_tokens_per_image, text hidden]` of the tower's patch features
    /// `[images, patches, vision hidden]` (patches row by row, tokens likewise).
    pub fn forward(&self, vision_outputs: &Array) -> Result<Array> {
        let shape = vision_outputs.shape();
        let (side, tokens) = (self.patches_per_side, self.tokens_per_side);
        if shape.len() != 3 || shape[1] != side * side {
            return Err(Error::InvalidInput(format!(
                "vision features of shape {shape:?}, expected [images, {}, hidden]",
                side * side
            )));
        }
        let (images, width) = (shape[0], shape[2]);
        let pool = side / tokens;
        // Rows and columns of the patch grid split into (token, offset within its pool); the
        // mean over both offsets is a stride-`pool` average pool.
        let pooled = vision_outputs
            .reshape(&[images, tokens, pool, tokens, pool, width])?
            .mean(&[2, 4], false)?
            .reshape(&[images, tokens * tokens, width])?;
        let normed = self.mm_soft_emb_norm.forward(&pooled)?;
        Ok(normed.matmul(&self.mm_input_projection_weight)?)
    }

    /// Every weight array.
    pub fn parameters(&self) -> Vec<Array> {
        let mut out = vec![self.mm_input_projection_weight.clone()];
        self.mm_soft_emb_norm.collect_arrays(&mut out);
        out
    }
}

/// A Gemma 3 that reads images as well as text.
pub struct Gemma3Multimodal {
    config: Config,
    vision_tower: VisionModel,
    multi_modal_projector: MultiModalProjector,
    language_model: Gemma3,
}

impl Gemma3Multimodal {
    /// Builds the model from a multimodal checkpoint's weights, named as Google published
    /// Gemma 3 (`vision_tower.vision_model.…`, `multi_modal_projector.…`,
    /// `language_model.model.…`), as transformers 5.24 saves it (the tower directly under
    /// `vision_tower.`) or by transformers 5's modules (`model.vision_tower.…`,
    /// `model.multi_modal_projector.…`, `model.language_model.…`).
    pub fn new(config: Config, weights: &mut Weights) -> Result<Gemma3Multimodal> {
        let tower = [
            "vision_tower.vision_model",
            "vision_tower",
            "model.vision_tower.vision_model",
            "model.vision_tower",
        ]
        .into_iter()
        .find(|p| weights.contains(&format!("{p}.embeddings.patch_embedding.weight")))
        .unwrap_or("vision_tower");
        let projector =
            if weights.contains("model.multi_modal_projector.mm_input_projection_weight") {
                "model.multi_modal_projector"
            } else {
                "multi_modal_projector"
            };
        let vision_tower = VisionModel::new(config.vision.clone(), weights, tower)?;
        if config.vision.vision_use_head {
            // SigLIP's attention-pooling head: Gemma 3 projects the patches, never the pool.
            weights.set_aside(&format!("{tower}.head."));
        }
        let multi_modal_projector = MultiModalProjector::new(&config, weights, projector)?;
        let language_model = Gemma3::new(config.text.clone(), weights)?;
        Ok(Gemma3Multimodal {
            config,
            vision_tower,
            multi_modal_projector,
            language_model,
        })
    }

    /// Its hyperparameters.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The vision tower.
    pub fn vision_tower(&self) -> &VisionModel {
        &self.vision_tower
    }

    /// The projector.
    pub fn multi_modal_projector(&self) -> &MultiModalProjector {
        &self.multi_modal_projector
    }

    /// The text model: a text-only forward, caches and the output head.
    pub fn language_model(&self) -> &Gemma3 {
        &self.language_model
    }

    /// The image tokens of `pixel_values` (`[images, channels, image_size, image_size]`,
    /// resized and normalized as the processor does): `[images, mm_tokens_per_image, text
    /// hidden]`, for [`Gemma3Multimodal::forward_with_images`].
    pub fn encode_images(&self, pixel_values: &Array) -> Result<Array> {
        self.multi_modal_projector
            .forward(&self.vision_tower.forward(pixel_values)?)
    }

    /// Like [`Model::forward_rows`], with image features `[images, mm_tokens_per_image, text
    /// hidden]` ([`Gemma3Multimodal::encode_images`]) in place of the image tokens' embeddings:
    /// the images in the order their tokens appear, row by row. Each run of image tokens
    /// attends to itself in both directions, so it must lie wholly inside this forward. Fails
    /// when the batch's image tokens and the features' rows differ in number.
    pub fn forward_with_images(
        &self,
        batch: &Batch,
        image_features: Option<&Array>,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        let width = batch.width()?;
        let image = self.config.image_token_index;
        let Placed { embedded, ids } = place_image_features(
            batch,
            &MediaTokens {
                kind: "image",
                token: image,
                vocab_size: self.config.text.vocab_size,
                hidden: dim(self.config.text.hidden_size, "hidden_size")?,
            },
            dim(self.config.mm_tokens_per_image, "mm_tokens_per_image")?,
            image_features,
            |tokens| self.language_model.embed(tokens),
        )?;
        let row_ids: Vec<Vec<u32>> = ids.chunks(width.max(1)).map(<[u32]>::to_vec).collect();
        let blocks = TokenBlocks::runs(&row_ids, |id| id == image);
        self.language_model
            .forward_embedded(embedded, batch, caches, Some(&blocks))
    }

    /// Every weight array, for evaluating them once at load.
    pub fn parameters(&self) -> Vec<Array> {
        let mut out = self.vision_tower.parameters();
        out.extend(self.multi_modal_projector.parameters());
        out.extend(self.language_model.parameters());
        out
    }
}

/// Text runs through the text model alone, as a text-only load of the checkpoint would (an
/// image token without features is then an ordinary embedding); images go through
/// [`Vision`].
impl Model for Gemma3Multimodal {
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
        Gemma3Multimodal::parameters(self)
    }

    fn vision(&self) -> Option<&dyn Vision> {
        Some(self)
    }
}

impl Vision for Gemma3Multimodal {
    fn image_input(&self) -> ImageInput {
        self.config.image_input()
    }

    fn encode_images(&self, pixel_values: &Array) -> Result<Array> {
        Gemma3Multimodal::encode_images(self, pixel_values)
    }

    fn forward_rows_with_images(
        &self,
        batch: &Batch,
        features: Option<&Array>,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        self.forward_with_images(batch, features, caches)
    }
}
