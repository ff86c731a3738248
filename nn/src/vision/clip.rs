//! CLIP's vision transformer, as LLaVA reads it: an image cut into square patches projected to
//! the model width (a bias-free convolution whose stride is its kernel, here a reshape and one
//! matrix product), a learned class embedding put before them, a learned embedding per
//! position (class token first) added, a LayerNorm (`pre_layrnorm`, transformers' spelling),
//! then pre-norm encoder layers (`vit`, the same layer SigLIP has; CLIP trained them with
//! quick_gelu). A family reads the hidden states between layers rather than the tower's end:
//! LLaVA takes those after the next-to-last layer, so the last layers and the final LayerNorm
//! of CLIP's pooled output are never run (their weights are set aside at load).
//!
//! References: transformers' `models/clip/modeling_clip.py` (5.24, `CLIPVisionModel`, whose
//! `hidden_states` are the pre-LayerNorm embeddings and each layer's output); Radford et al.,
//! "Learning Transferable Visual Models From Natural Language Supervision" (2021).

use mlx::{Array, Dtype};
use serde_json::Value;

use crate::activation::Activation;
use crate::config::{Fields, dim, limits};
use crate::layer_norm::LayerNorm;
use crate::linear::Linear;
use crate::vision::vit::{
    self, EncoderDims, EncoderLayer, MAX_IMAGE_SIZE, cut_patches, layer_norm, patch_embedding,
};
use crate::weights::Weights;
use crate::{Error, Result};

/// The hyperparameters of a CLIP vision tower (a checkpoint's `vision_config`).
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
    /// `hidden_act` (`quick_gelu` when absent, transformers' default, which llava-hf's
    /// published configs rely on).
    pub hidden_act: String,
    /// `layer_norm_eps` (1e-5 when absent, transformers' default).
    pub layer_norm_eps: f32,
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
            hidden_act: f.str("hidden_act").unwrap_or("quick_gelu").to_string(),
            layer_norm_eps: vit::layer_norm_eps(&f, 1e-5)?,
        })
    }

    /// Patches along each side of an image.
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Patches per image; the tower's hidden states have one more row, the class token.
    pub fn num_patches(&self) -> usize {
        self.patches_per_side() * self.patches_per_side()
    }
}

/// A CLIP vision tower, built through the layer a family reads.
pub struct VisionModel {
    config: Config,
    dtype: Dtype,
    /// `embeddings.class_embedding`, `[hidden]`.
    class_embedding: Array,
    /// `embeddings.patch_embedding`, its `[hidden, channels, p, p]` kernel flattened to
    /// `[hidden, channels · p · p]`.
    patch_embedding: Linear,
    /// `embeddings.position_embedding.weight`, `[1 + patches, hidden]`.
    position_embedding: Array,
    pre_layrnorm: LayerNorm,
    /// `encoder.layers`, the first `depth` of them.
    layers: Vec<EncoderLayer>,
}

impl VisionModel {
    /// Builds the tower's first `depth` layers from transformers-named weights under `prefix`
    /// (the module holding `embeddings`, `pre_layrnorm` and `encoder`, such as
    /// `vision_tower.vision_model`). The later layers and `post_layernorm` are set aside: no
    /// hidden state read through `depth` depends on them. A `depth` beyond the config's layers
    /// is an error.
    pub fn new(
        config: Config,
        weights: &mut Weights,
        prefix: &str,
        depth: usize,
    ) -> Result<VisionModel> {
        if depth > config.num_hidden_layers {
            return Err(Error::Config(format!(
                "features after layer {depth} of a vision tower of {} layers",
                config.num_hidden_layers
            )));
        }
        let hidden = dim(config.hidden_size, "vision_config.hidden_size")?;
        let channels = dim(config.num_channels, "vision_config.num_channels")?;
        let patch = dim(config.patch_size, "vision_config.patch_size")?;
        let positions = dim(config.num_patches() + 1, "vision_config.image_size")?;
        let e = format!("{prefix}.embeddings");
        let class_embedding = weights.dense(&format!("{e}.class_embedding"), &[hidden])?;
        let patch_embedding = patch_embedding(
            weights,
            &format!("{e}.patch_embedding"),
            hidden,
            channels,
            patch,
            false,
        )?;
        let position_embedding = weights.dense(
            &format!("{e}.position_embedding.weight"),
            &[positions, hidden],
        )?;
        let pre_layrnorm = layer_norm(
            weights,
            &format!("{prefix}.pre_layrnorm"),
            hidden,
            config.layer_norm_eps,
        )?;
        let dims = EncoderDims {
            hidden_size: config.hidden_size,
            intermediate_size: config.intermediate_size,
            num_attention_heads: config.num_attention_heads,
            layer_norm_eps: config.layer_norm_eps,
            activation: Activation::from_name(&config.hidden_act)?,
        };
        let layers = (0..depth)
            .map(|i| EncoderLayer::new(weights, &format!("{prefix}.encoder.layers.{i}"), &dims))
            .collect::<Result<Vec<_>>>()?;
        for i in depth..config.num_hidden_layers {
            weights.set_aside(&format!("{prefix}.encoder.layers.{i}."));
        }
        weights.set_aside(&format!("{prefix}.post_layernorm."));
        Ok(VisionModel {
            config,
            dtype: weights.dtype(),
            class_embedding,
            patch_embedding,
            position_embedding,
            pre_layrnorm,
            layers,
        })
    }

    /// Its hyperparameters.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// How many layers it runs.
    pub fn depth(&self) -> usize {
        self.layers.len()
    }

    /// The hidden states of `pixel_values` (`[images, channels, image_size, image_size]`,
    /// resized and normalized as the checkpoint's processor does; any float dtype): entry 0 the
    /// embeddings after `pre_layrnorm`, entry `i` the output of layer `i`, through
    /// [`VisionModel::depth`]; each `[images, 1 + patches, hidden]`, the class token first and
    /// the patches row by row. Images of another size are refused: the position embeddings
    /// are not interpolated.
    pub fn hidden_states(&self, pixel_values: &Array) -> Result<Vec<Array>> {
        let c = &self.config;
        let patches = cut_patches(
            pixel_values,
            c.num_channels as i32,
            c.image_size as i32,
            c.patch_size as i32,
            self.dtype,
        )?;
        let images = patches.dim(0)?;
        let hidden = self.class_embedding.dim(0)?;
        let class = self
            .class_embedding
            .reshape(&[1, 1, hidden])?
            .broadcast_to(&[images, 1, hidden])?;
        let embeddings = mlx::concatenate(&[class, self.patch_embedding.forward(&patches)?], 1)?
            .add(&self.position_embedding)?;
        let mut states = Vec::with_capacity(self.layers.len() + 1);
        states.push(self.pre_layrnorm.forward(&embeddings)?);
        for layer in &self.layers {
            let next = layer.forward(&states[states.len() - 1])?;
            states.push(next);
        }
        Ok(states)
    }

    /// Every weight array, for evaluating them once at load.
    pub fn parameters(&self) -> Vec<Array> {
        let mut out = vec![
            self.class_embedding.clone(),
            self.position_embedding.clone(),
        ];
        self.patch_embedding.collect_arrays(&mut out);
        self.pre_layrnorm.collect_arrays(&mut out);
        for layer in &self.layers {
            layer.collect_arrays(&mut out);
        }
        out
    }
}
