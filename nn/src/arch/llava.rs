//! LLaVA (`LlavaForConditionalGeneration`, as LLaVA 1.5 is published): a CLIP tower encodes
//! each image; the hidden states after one of its layers (`vision_feature_layer`, -2: the
//! next-to-last), without the class token (`vision_feature_select_strategy` "default"; "full"
//! keeps it), go through a two-layer MLP projector (`linear_1`, GELU, `linear_2`) to the text
//! width; those rows replace the embeddings of the prompt's image tokens (`image_token_index`)
//! and the text model runs over the result, causally throughout (LLaVA has no bidirectional
//! image blocks). The text model is whichever family `text_config` names, built by the
//! registry as a text checkpoint of that family would be; it must be able to run from input
//! embeddings ([`crate::model::InputEmbeddings`]: Llama so far).
//!
//! The processor lays an image out as exactly its image tokens, one per feature row (the
//! tower's patches, plus one with "full"), with no markers around them.
//!
//! References: transformers' `models/llava/modeling_llava.py` and `processing_llava.py`
//! (5.24); Liu et al., "Improved Baselines with Visual Instruction Tuning" (2023).

use kvcache::LayerCache;
use mlx::Array;
use serde_json::Value;

use crate::activation::Activation;
use crate::config::{Fields, dim, limits, missing};
use crate::linear::Linear;
use crate::model::{
    Batch, Forward, ImageInput, ImagePreprocessing, InputEmbeddings, Model, ModelSpec, Vision,
};
use crate::placement::{MediaTokens, Placed, place_image_features};
use crate::vision::clip::{self, VisionModel};
use crate::weights::Weights;
use crate::{Error, Result};

/// Which of the tower's rows become image tokens (`vision_feature_select_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeatureSelect {
    /// "default": the patches, the class token dropped.
    Patches,
    /// "full": the class token and the patches.
    Full,
}

/// The hyperparameters of a LLaVA.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The text model's config as a text checkpoint of its family holds it: `text_config`,
    /// with its `model_type` (`llama` when absent, transformers' default) and the head tying
    /// the whole model uses.
    pub text_config: Value,
    /// `text_config.hidden_size`.
    pub text_hidden_size: usize,
    /// `text_config.vocab_size`.
    pub text_vocab_size: usize,
    /// `vision_config`.
    pub vision: clip::Config,
    /// `image_token_index` (or `image_token_id`; 32000 when absent, transformers' default).
    pub image_token_index: u32,
    /// `projector_hidden_act` (`gelu` when absent).
    pub projector_hidden_act: String,
    /// `vision_feature_layer` (-2 when absent): the tower's hidden states read, as indices into
    /// its `num_hidden_layers + 1` states (0 = the embeddings, negative from the end); several
    /// are concatenated along the width.
    pub vision_feature_layer: Vec<usize>,
    /// `vision_feature_select_strategy` ("default" when absent).
    pub vision_feature_select_strategy: FeatureSelect,
    /// `multimodal_projector_bias` (true when absent).
    pub multimodal_projector_bias: bool,
}

/// Most hidden states a config may concatenate.
const MAX_FEATURE_LAYERS: usize = 64;
/// Most tokens an image may take in the prompt.
const MAX_TOKENS_PER_IMAGE: usize = 1 << 16;

impl Config {
    /// Reads a `LlavaForConditionalGeneration` config; what is missing or does not fit is an
    /// error naming the field.
    pub fn from_json(config: &Value) -> Result<Config> {
        let root = Fields { object: config };
        let vision_config = root
            .get("vision_config")
            .ok_or_else(|| missing("vision_config"))?;
        let vision = clip::Config::from_json(vision_config)?;
        let text_value = root
            .get("text_config")
            .ok_or_else(|| missing("text_config"))?;
        let Value::Object(text) = text_value else {
            return Err(Error::Config("`text_config` is not an object".into()));
        };
        let text_fields = Fields { object: text_value };
        let text_hidden_size = text_fields.required_bounded("hidden_size", limits::HIDDEN)?;
        let text_vocab_size = text_fields.required_bounded("vocab_size", limits::VOCAB)?;
        let mut text_config = text.clone();
        text_config
            .entry("model_type")
            .or_insert_with(|| Value::from("llama"));
        // transformers ties the head when the top level says so or the text config does.
        let root_tie = root.bool("tie_word_embeddings")?;
        let text_tie = text_fields.bool("tie_word_embeddings")?;
        if root_tie.is_some() || text_tie.is_some() {
            let tied = root_tie.unwrap_or(false) || text_tie.unwrap_or(false);
            text_config.insert("tie_word_embeddings".into(), Value::from(tied));
        }

        // Each image becomes this many prompt tokens (a runner lays them out before loading).
        if vision.num_patches() >= MAX_TOKENS_PER_IMAGE {
            return Err(Error::Config(format!(
                "vision_config: {} patches per image; an image may take fewer than \
                 {MAX_TOKENS_PER_IMAGE} image tokens",
                vision.num_patches()
            )));
        }
        let states = vision.num_hidden_layers + 1;
        let index = |layer: i64| -> Result<usize> {
            let resolved = if layer < 0 {
                states as i64 + layer
            } else {
                layer
            };
            usize::try_from(resolved)
                .ok()
                .filter(|&i| i < states)
                .ok_or_else(|| {
                    Error::Config(format!(
                        "`vision_feature_layer` {layer} is outside a tower of {} layers",
                        vision.num_hidden_layers
                    ))
                })
        };
        let layer_value = |v: &Value| -> Result<i64> {
            v.as_i64().ok_or_else(|| {
                Error::Config(format!("`vision_feature_layer` holds {v}, not an integer"))
            })
        };
        let vision_feature_layer = match root.get("vision_feature_layer") {
            None => vec![index(-2)?],
            Some(Value::Array(layers)) => {
                if layers.is_empty() || layers.len() > MAX_FEATURE_LAYERS {
                    return Err(Error::Config(format!(
                        "`vision_feature_layer` lists {} layers, expected 1 to \
                         {MAX_FEATURE_LAYERS}",
                        layers.len()
                    )));
                }
                layers
                    .iter()
                    .map(|v| index(layer_value(v)?))
                    .collect::<Result<Vec<_>>>()?
            }
            Some(v) => vec![index(layer_value(v)?)?],
        };
        let vision_feature_select_strategy = match root.str("vision_feature_select_strategy") {
            None | Some("default") => FeatureSelect::Patches,
            Some("full") => FeatureSelect::Full,
            Some(other) => {
                return Err(Error::Config(format!(
                    "`vision_feature_select_strategy` is `{other}`, expected `default` or `full`"
                )));
            }
        };
        let image_token_index = match root.usize("image_token_index")? {
            Some(v) => Some(v),
            None => root.usize("image_token_id")?,
        }
        .unwrap_or(32000);
        Ok(Config {
            text_config: Value::Object(text_config),
            text_hidden_size,
            text_vocab_size,
            vision,
            image_token_index: u32::try_from(image_token_index).map_err(|_| {
                Error::Config(format!(
                    "`image_token_index` = {image_token_index} is not a token id"
                ))
            })?,
            projector_hidden_act: root
                .str("projector_hidden_act")
                .unwrap_or("gelu")
                .to_string(),
            vision_feature_layer,
            vision_feature_select_strategy,
            multimodal_projector_bias: root.bool("multimodal_projector_bias")?.unwrap_or(true),
        })
    }

    /// Image tokens per image: one per patch, and one for the class token with "full".
    pub fn tokens_per_image(&self) -> usize {
        match self.vision_feature_select_strategy {
            FeatureSelect::Patches => self.vision.num_patches(),
            FeatureSelect::Full => self.vision.num_patches() + 1,
        }
    }

    /// What the model takes: `vision_config.image_size` square images as CLIP's processor
    /// prepares them, each [`Config::tokens_per_image`] image tokens and nothing around them.
    pub fn image_input(&self) -> ImageInput {
        ImageInput {
            image_size: self.vision.image_size,
            tokens_per_image: self.tokens_per_image(),
            image_token: self.image_token_index,
            start_token: None,
            end_token: None,
            preprocessing: ImagePreprocessing::Clip,
        }
    }
}

/// The projector (`multi_modal_projector`): `linear_2(act(linear_1(x)))`, from the selected
/// hidden states (concatenated when several) to the text width.
pub struct MultiModalProjector {
    linear_1: Linear,
    activation: Activation,
    linear_2: Linear,
}

impl MultiModalProjector {
    /// Builds the projector from the weights under `prefix`.
    pub fn new(
        config: &Config,
        weights: &mut Weights,
        prefix: &str,
    ) -> Result<MultiModalProjector> {
        let vision = config.vision.hidden_size * config.vision_feature_layer.len();
        let vision = dim(vision, "vision_config.hidden_size")?;
        let text = dim(config.text_hidden_size, "text_config.hidden_size")?;
        let bias = config.multimodal_projector_bias;
        Ok(MultiModalProjector {
            linear_1: weights.projection(&format!("{prefix}.linear_1"), text, vision, bias)?,
            activation: Activation::from_name(&config.projector_hidden_act)?,
            linear_2: weights.projection(&format!("{prefix}.linear_2"), text, text, bias)?,
        })
    }

    /// Text-width image tokens of `features` (`[images, tokens, vision hidden · layers]`).
    pub fn forward(&self, features: &Array) -> Result<Array> {
        let hidden = self.activation.apply(&self.linear_1.forward(features)?)?;
        self.linear_2.forward(&hidden)
    }

    /// Every weight array.
    pub fn parameters(&self) -> Vec<Array> {
        let mut out = Vec::new();
        self.linear_1.collect_arrays(&mut out);
        self.linear_2.collect_arrays(&mut out);
        out
    }
}

/// A LLaVA: a CLIP tower and projector in front of a text model.
pub struct Llava {
    spec: ModelSpec,
    config: Config,
    vision_tower: VisionModel,
    multi_modal_projector: MultiModalProjector,
    language_model: Box<dyn Model>,
}

impl Llava {
    /// Builds the model from a checkpoint's weights named as llava-hf publishes LLaVA
    /// (`vision_tower.vision_model.…`, `multi_modal_projector.…`, `language_model.model.…`,
    /// `language_model.lm_head`), as transformers 5.24 saves it (the tower directly under
    /// `vision_tower.`), by transformers 5's modules (`model.vision_tower.…`,
    /// `model.multi_modal_projector.…`, `model.language_model.…`, `lm_head`) or as mlx-vlm
    /// converts it (llava-hf's names, the patch kernel in MLX's channels-last layout). The text
    /// model is the one `build_text` makes of `text_config` (the registry passes
    /// [`crate::registry::build_text_model`]); a family that cannot take input embeddings is
    /// refused by name.
    pub fn new(
        config: Config,
        weights: &mut Weights,
        build_text: fn(&Value, &mut Weights) -> Result<Box<dyn Model>>,
    ) -> Result<Llava> {
        let tower = [
            "vision_tower.vision_model",
            "vision_tower",
            "model.vision_tower.vision_model",
            "model.vision_tower",
        ]
        .into_iter()
        .find(|p| weights.contains(&format!("{p}.embeddings.class_embedding")))
        .unwrap_or("vision_tower.vision_model");
        let projector = if weights.contains("model.multi_modal_projector.linear_1.weight") {
            "model.multi_modal_projector"
        } else {
            "multi_modal_projector"
        };
        let depth = config
            .vision_feature_layer
            .iter()
            .copied()
            .max()
            .unwrap_or(0);
        let vision_tower = VisionModel::new(config.vision.clone(), weights, tower, depth)?;
        let multi_modal_projector = MultiModalProjector::new(&config, weights, projector)?;
        // The text model reads its weights under a text checkpoint's names.
        weights.rename_prefix("language_model.model.", "model.")?;
        weights.rename_prefix("language_model.lm_head.", "lm_head.")?;
        weights.rename_prefix("model.language_model.", "model.")?;
        let language_model = build_text(&config.text_config, weights)?;
        if language_model.input_embeddings().is_none() {
            return Err(Error::Config(format!(
                "LLaVA over a `{}` text model: that family cannot take image features in place \
                 of token embeddings",
                language_model.spec().model_type
            )));
        }
        Ok(Llava {
            spec: language_model.spec().clone(),
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
    pub fn language_model(&self) -> &dyn Model {
        self.language_model.as_ref()
    }

    fn embedder(&self) -> Result<&dyn InputEmbeddings> {
        self.language_model.input_embeddings().ok_or_else(|| {
            Error::InvalidInput("the text model cannot take input embeddings".into())
        })
    }

    /// The image tokens of `pixel_values` (`[images, channels, image_size, image_size]`,
    /// resized and normalized as CLIP's processor does): `[images, tokens_per_image, text
    /// hidden]`, for [`Llava::forward_with_images`].
    pub fn encode_images(&self, pixel_values: &Array) -> Result<Array> {
        let states = self.vision_tower.hidden_states(pixel_values)?;
        let selected = self
            .config
            .vision_feature_layer
            .iter()
            .map(|&layer| {
                let state = states.get(layer).ok_or_else(|| {
                    Error::InvalidInput(format!("the tower has no hidden state {layer}"))
                })?;
                Ok(match self.config.vision_feature_select_strategy {
                    FeatureSelect::Full => state.clone(),
                    FeatureSelect::Patches => state.slice_axis(1, 1, state.dim(1)?)?,
                })
            })
            .collect::<Result<Vec<Array>>>()?;
        let features = if selected.len() == 1 {
            selected[0].clone()
        } else {
            mlx::concatenate(&selected, -1)?
        };
        self.multi_modal_projector.forward(&features)
    }

    /// Like [`Model::forward_rows`], with image features `[images, tokens_per_image, text
    /// hidden]` ([`Llava::encode_images`]) in place of the image tokens' embeddings: the
    /// images in the order their tokens appear, row by row; causal throughout. Fails when the
    /// batch's image tokens and the features' rows differ in number.
    pub fn forward_with_images(
        &self,
        batch: &Batch,
        image_features: Option<&Array>,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        let embedder = self.embedder()?;
        let Placed { embedded, .. } = place_image_features(
            batch,
            &MediaTokens {
                kind: "image",
                token: self.config.image_token_index,
                vocab_size: self.config.text_vocab_size,
                hidden: dim(self.config.text_hidden_size, "text_config.hidden_size")?,
            },
            dim(self.config.tokens_per_image(), "vision_config.image_size")?,
            image_features,
            |tokens| embedder.embed(tokens),
        )?;
        embedder.forward_rows_embedded(&embedded, batch, caches)
    }

    /// Every weight array, for evaluating them once at load.
    pub fn parameters(&self) -> Vec<Array> {
        let mut out = self.vision_tower.parameters();
        out.extend(self.multi_modal_projector.parameters());
        out.extend(self.language_model.parameters());
        out
    }
}

/// Text runs through the text model alone, as a text-only load of its weights would (an image
/// token without features is then an ordinary embedding); images go through [`Vision`].
impl Model for Llava {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    fn new_caches_rewindable(&self, slack: usize) -> Result<Vec<Option<LayerCache>>> {
        self.language_model.new_caches_rewindable(slack)
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
        Llava::parameters(self)
    }

    fn vision(&self) -> Option<&dyn Vision> {
        Some(self)
    }

    fn input_embeddings(&self) -> Option<&dyn InputEmbeddings> {
        self.language_model.input_embeddings()
    }
}

impl Vision for Llava {
    fn image_input(&self) -> ImageInput {
        self.config.image_input()
    }

    fn encode_images(&self, pixel_values: &Array) -> Result<Array> {
        Llava::encode_images(self, pixel_values)
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
