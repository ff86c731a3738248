//! SigLIP's vision transformer: an image cut into square patches, each patch projected to the
//! model width (a convolution whose stride is its kernel, here a reshape and one matrix
//! product), a learned embedding per patch position added, then pre-norm encoder layers
//! (LayerNorm with bias, multi-head attention with biases and no mask, an ungated MLP of
//! GELU-tanh) and a final LayerNorm. The output is one vector per patch, for a family's
//! projector to pool; the attention-pooling head of SigLIP's contrastive model is not part of
//! it (Gemma 3's configs set `vision_use_head` false). The patches and the encoder layers are
//! the ones CLIP's tower has too (`vit`).
//!
//! References: transformers' `models/siglip/modeling_siglip.py` (5.24, `SiglipVisionModel`);
//! Zhai et al., "Sigmoid Loss for Language Image Pre-Training" (2023); Dosovitskiy et al., "An
//! Image is Worth 16x16 Words" (2021).

use mlx::{Array, Dtype};
use serde_json::Value;

use crate::Result;
use crate::activation::Activation;
use crate::config::{Fields, dim, limits};
use crate::layer_norm::LayerNorm;
use crate::linear::Linear;
use crate::vision::vit::{
    self, EncoderDims, EncoderLayer, MAX_IMAGE_SIZE, cut_patches, layer_norm, patch_embedding,
};
use crate::weights::Weights;

/// The hyperparameters of a SigLIP vision tower (a checkpoint's `vision_config`).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size`.
    pub intermediate_size: usize,
    /// `num_hidden_layers`.
    pub num_hidden_layers: usize,
    /// `num_attention_heads`; each head is `hidden_size / num_attention_heads` wide.
    pub num_attention_heads: usize,
    /// `num_channels` (3 when absent, transformers' default).
    pub num_channels: usize,
    /// `image_size`: the side of the square images the position embeddings were learned for.
    pub image_size: usize,
    /// `patch_size`: the side of a square patch; divides `image_size`.
    pub patch_size: usize,
    /// `hidden_act` (`gelu_pytorch_tanh` when absent, transformers' default).
    pub hidden_act: String,
    /// `layer_norm_eps` (1e-6 when absent, transformers' default, which Gemma 3's published
    /// configs rely on).
    pub layer_norm_eps: f32,
    /// `vision_use_head` (transformers defaults it to true): whether the checkpoint holds an
    /// attention-pooling head, which this tower never runs.
    pub vision_use_head: bool,
}

impl Config {
    /// Reads a `vision_config` object; a missing size, or one beyond any real model, is an
    /// error naming the field.
    pub fn from_json(vision_config: &Value) -> Result<Config> {
        let f = Fields {
            object: vision_config,
        };
        let hidden_size = f.required_bounded("hidden_size", limits::HIDDEN)?;
        let num_attention_heads = f.required_bounded("num_attention_heads", limits::HEADS)?;
        let image_size = f.required_bounded("image_size", MAX_IMAGE_SIZE)?;
        let patch_size = f.required_bounded("patch_size", MAX_IMAGE_SIZE)?;
        vit::check_geometry(hidden_size, num_attention_heads, image_size, patch_size)?;
        Ok(Config {
            hidden_size,
            intermediate_size: f.required_bounded("intermediate_size", limits::INTERMEDIATE)?,
            num_hidden_layers: f.required_bounded("num_hidden_layers", limits::LAYERS)?,
            num_attention_heads,
            num_channels: vit::num_channels(&f)?,
            image_size,
            patch_size,
            hidden_act: f
                .str("hidden_act")
                .unwrap_or("gelu_pytorch_tanh")
                .to_string(),
            layer_norm_eps: vit::layer_norm_eps(&f, 1e-6)?,
            vision_use_head: f.bool("vision_use_head")?.unwrap_or(true),
        })
    }

    /// Patches along each side of an image.
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Patches per image: the tower's output length.
    pub fn num_patches(&self) -> usize {
        self.patches_per_side() * self.patches_per_side()
    }
}

/// A SigLIP vision tower.
pub struct VisionModel {
    config: Config,
    dtype: Dtype,
    /// `embeddings.patch_embedding`, its `[hidden, channels, p, p]` kernel flattened to
    /// `[hidden, channels · p · p]`.
    patch_embedding: Linear,
    /// `embeddings.position_embedding.weight`, `[patches, hidden]`.
    position_embedding: Array,
    /// `encoder.layers`.
    layers: Vec<EncoderLayer>,
    post_layernorm: LayerNorm,
}

impl VisionModel {
    /// Builds the tower from transformers-named weights under `prefix` (the module holding
    /// `embeddings`, `encoder` and `post_layernorm`, such as `model.vision_tower.vision_model`).
    /// A head's weights, if the checkpoint has one, are left for the caller.
    pub fn new(config: Config, weights: &mut Weights, prefix: &str) -> Result<VisionModel> {
        let hidden = dim(config.hidden_size, "vision_config.hidden_size")?;
        let channels = dim(config.num_channels, "vision_config.num_channels")?;
        let patch = dim(config.patch_size, "vision_config.patch_size")?;
        let patches = dim(config.num_patches(), "vision_config.image_size")?;
        let dims = EncoderDims {
            hidden_size: config.hidden_size,
            intermediate_size: config.intermediate_size,
            num_attention_heads: config.num_attention_heads,
            layer_norm_eps: config.layer_norm_eps,
            activation: Activation::from_name(&config.hidden_act)?,
        };
        let patch_embedding = patch_embedding(
            weights,
            &format!("{prefix}.embeddings.patch_embedding"),
            hidden,
            channels,
            patch,
            true,
        )?;
        let position_embedding = weights.dense(
            &format!("{prefix}.embeddings.position_embedding.weight"),
            &[patches, hidden],
        )?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| EncoderLayer::new(weights, &format!("{prefix}.encoder.layers.{i}"), &dims))
            .collect::<Result<Vec<_>>>()?;
        let post_layernorm = layer_norm(
            weights,
            &format!("{prefix}.post_layernorm"),
            hidden,
            config.layer_norm_eps,
        )?;
        Ok(VisionModel {
            config,
            dtype: weights.dtype(),
            patch_embedding,
            position_embedding,
            layers,
            post_layernorm,
        })
    }

    /// Its hyperparameters.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Patch features `[images, patches, hidden]` of `pixel_values` `[images, channels,
    /// image_size, image_size]` (already resized and normalized as the checkpoint's processor
    /// does; any float dtype). Patches are numbered row by row. Images of another size are
    /// refused: the position embeddings are not interpolated.
    pub fn forward(&self, pixel_values: &Array) -> Result<Array> {
        let c = &self.config;
        let patches = cut_patches(
            pixel_values,
            c.num_channels as i32,
            c.image_size as i32,
            c.patch_size as i32,
            self.dtype,
        )?;
        let mut h = self
            .patch_embedding
            .forward(&patches)?
            .add(&self.position_embedding)?;
        for layer in &self.layers {
            h = layer.forward(&h)?;
        }
        self.post_layernorm.forward(&h)
    }

    /// Every weight array, for evaluating them once at load.
    pub fn parameters(&self) -> Vec<Array> {
        let mut out = vec![self.position_embedding.clone()];
        self.patch_embedding.collect_arrays(&mut out);
        for layer in &self.layers {
            layer.collect_arrays(&mut out);
        }
        self.post_layernorm.collect_arrays(&mut out);
        out
    }
}
