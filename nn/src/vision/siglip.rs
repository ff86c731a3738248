//! SigLIP's vision transformer: an image cut into square patches, each patch projected to the
//! model width (a convolution whose stride is its kernel, here a reshape and one matrix
//! product), a learned embedding per patch position added, then pre-norm encoder layers
//! (LayerNorm with bias, multi-head attention with biases and no mask, an ungated MLP of
//! GELU-tanh) and a final LayerNorm. The output is one vector per patch, for a family's
//! projector to pool; the attention-pooling head of SigLIP's contrastive model is not part of
//! it (Gemma 3's configs set `vision_use_head` false).
//!
//! References: transformers' `models/siglip/modeling_siglip.py` (5.24, `SiglipVisionModel`);
//! Zhai et al., "Sigmoid Loss for Language Image Pre-Training" (2023); Dosovitskiy et al., "An
//! Image is Worth 16x16 Words" (2021).

use mlx::fast::{AttentionMask, RopeOffset};
use mlx::{Array, Dtype};
use serde_json::Value;

use crate::activation::Activation;
use crate::attention::{Attention, AttentionParts};
use crate::config::{Fields, dim, limits};
use crate::layer_norm::LayerNorm;
use crate::linear::{Linear, Tensor};
use crate::weights::Weights;
use crate::{Error, Result};

/// Largest image side, in pixels, a config may claim.
const MAX_IMAGE_SIZE: usize = 1 << 16;
/// Most channels an image may have.
const MAX_CHANNELS: usize = 16;

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
        if num_attention_heads == 0 || !hidden_size.is_multiple_of(num_attention_heads) {
            return Err(Error::Config(format!(
                "vision_config: {num_attention_heads} attention heads do not split a hidden \
                 size of {hidden_size}"
            )));
        }
        let image_size = f.required_bounded("image_size", MAX_IMAGE_SIZE)?;
        let patch_size = f.required_bounded("patch_size", MAX_IMAGE_SIZE)?;
        if patch_size == 0 || !image_size.is_multiple_of(patch_size) {
            return Err(Error::Config(format!(
                "vision_config: `patch_size` = {patch_size} does not tile `image_size` = \
                 {image_size}"
            )));
        }
        let layer_norm_eps = f.f64("layer_norm_eps")?.unwrap_or(1e-6);
        if layer_norm_eps <= 0.0 {
            return Err(Error::Config(format!(
                "vision_config: `layer_norm_eps` must be positive, got {layer_norm_eps}"
            )));
        }
        Ok(Config {
            hidden_size,
            intermediate_size: f.required_bounded("intermediate_size", limits::INTERMEDIATE)?,
            num_hidden_layers: f.required_bounded("num_hidden_layers", limits::LAYERS)?,
            num_attention_heads,
            num_channels: match f.bounded("num_channels", MAX_CHANNELS)? {
                Some(0) => return Err(Error::Config("vision_config: `num_channels` is 0".into())),
                Some(c) => c,
                None => 3,
            },
            image_size,
            patch_size,
            hidden_act: f
                .str("hidden_act")
                .unwrap_or("gelu_pytorch_tanh")
                .to_string(),
            layer_norm_eps: layer_norm_eps as f32,
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

/// The ungated feed-forward block (`mlp`): `fc2(act(fc1(x)))`.
struct Mlp {
    fc1: Linear,
    fc2: Linear,
    activation: Activation,
}

impl Mlp {
    fn forward(&self, x: &Array) -> Result<Array> {
        let hidden = self.activation.apply(&self.fc1.forward(x)?)?;
        self.fc2.forward(&hidden)
    }
}

/// One pre-norm encoder layer (`encoder.layers.{i}`).
struct EncoderLayer {
    layer_norm1: LayerNorm,
    self_attn: Attention,
    layer_norm2: LayerNorm,
    mlp: Mlp,
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
    layers: Vec<EncoderLayer>,
    post_layernorm: LayerNorm,
}

impl VisionModel {
    /// Builds the tower from transformers-named weights under `prefix` (the module holding
    /// `embeddings`, `encoder` and `post_layernorm`, such as `model.vision_tower.vision_model`).
    /// A head's weights, if the checkpoint has one, are left for the caller.
    pub fn new(config: Config, weights: &mut Weights, prefix: &str) -> Result<VisionModel> {
        let hidden = dim(config.hidden_size, "vision_config.hidden_size")?;
        let inter = dim(config.intermediate_size, "vision_config.intermediate_size")?;
        let heads = dim(
            config.num_attention_heads,
            "vision_config.num_attention_heads",
        )?;
        let head_dim = hidden / heads;
        let channels = dim(config.num_channels, "vision_config.num_channels")?;
        let patch = dim(config.patch_size, "vision_config.patch_size")?;
        let patches = dim(config.num_patches(), "vision_config.image_size")?;
        let eps = config.layer_norm_eps;
        let activation = Activation::from_name(&config.hidden_act)?;
        let layer_norm = |weights: &mut Weights, name: &str| -> Result<LayerNorm> {
            Ok(LayerNorm::new(
                Some(weights.dense(&format!("{prefix}.{name}.weight"), &[hidden])?),
                Some(weights.dense(&format!("{prefix}.{name}.bias"), &[hidden])?),
                eps,
            ))
        };
        let biased = |weights: &mut Weights, name: &str, out: i32, inp: i32| -> Result<Linear> {
            let p = format!("{prefix}.{name}");
            if !weights.contains(&format!("{p}.bias")) {
                return Err(Error::Weights(format!("tensor `{p}.bias` is missing")));
            }
            weights.linear(&p, out, inp)
        };

        let kernel = weights.dense(
            &format!("{prefix}.embeddings.patch_embedding.weight"),
            &[hidden, channels, patch, patch],
        )?;
        let patch_embedding = Linear::new(
            Tensor::Dense(kernel.reshape(&[hidden, channels * patch * patch])?),
            Some(weights.dense(
                &format!("{prefix}.embeddings.patch_embedding.bias"),
                &[hidden],
            )?),
        );
        let position_embedding = weights.dense(
            &format!("{prefix}.embeddings.position_embedding.weight"),
            &[patches, hidden],
        )?;

        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("encoder.layers.{i}");
            let a = format!("{p}.self_attn");
            layers.push(EncoderLayer {
                layer_norm1: layer_norm(weights, &format!("{p}.layer_norm1"))?,
                self_attn: Attention::new(AttentionParts {
                    q_proj: biased(weights, &format!("{a}.q_proj"), hidden, hidden)?,
                    k_proj: biased(weights, &format!("{a}.k_proj"), hidden, hidden)?,
                    v_proj: biased(weights, &format!("{a}.v_proj"), hidden, hidden)?,
                    o_proj: biased(weights, &format!("{a}.out_proj"), hidden, hidden)?,
                    q_norm: None,
                    k_norm: None,
                    rope: None,
                    num_heads: heads,
                    num_kv_heads: heads,
                    head_dim,
                    scale: 1.0 / (head_dim as f32).sqrt(),
                    logit_softcap: None,
                    output_gate: false,
                    sinks: None,
                    qk_norm_across_heads: false,
                }),
                layer_norm2: layer_norm(weights, &format!("{p}.layer_norm2"))?,
                mlp: Mlp {
                    fc1: biased(weights, &format!("{p}.mlp.fc1"), inter, hidden)?,
                    fc2: biased(weights, &format!("{p}.mlp.fc2"), hidden, inter)?,
                    activation,
                },
            });
        }
        let post_layernorm = layer_norm(weights, "post_layernorm")?;
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
        let channels = c.num_channels as i32;
        let side = c.image_size as i32;
        let shape = pixel_values.shape();
        if shape.len() != 4 || shape[0] < 1 || shape[1..] != [channels, side, side] {
            return Err(Error::InvalidInput(format!(
                "pixel values of shape {shape:?}, expected [images, {channels}, {side}, {side}]"
            )));
        }
        let images = shape[0];
        let (grid, patch) = (c.patches_per_side() as i32, c.patch_size as i32);
        // A stride-p convolution with a p×p kernel is a matrix product over each patch's
        // (channel, row, column) values, in the kernel's own order.
        let patches = pixel_values
            .astype(self.dtype)?
            .reshape(&[images, channels, grid, patch, grid, patch])?
            .transpose(&[0, 2, 4, 1, 3, 5])?
            .reshape(&[images, grid * grid, channels * patch * patch])?;
        let mut h = self
            .patch_embedding
            .forward(&patches)?
            .add(&self.position_embedding)?;
        for layer in &self.layers {
            let x = layer.layer_norm1.forward(&h)?;
            let projected = layer.self_attn.project(&x, RopeOffset::Scalar(0))?;
            let heads = layer.self_attn.attend_heads(
                &projected.queries,
                &projected.keys,
                &projected.values,
                AttentionMask::None,
            )?;
            h = h.add(&layer.self_attn.output(&heads, None)?)?;
            let ff = layer.mlp.forward(&layer.layer_norm2.forward(&h)?)?;
            h = h.add(&ff)?;
        }
        self.post_layernorm.forward(&h)
    }

    /// Every weight array, for evaluating them once at load.
    pub fn parameters(&self) -> Vec<Array> {
        let mut out = vec![self.position_embedding.clone()];
        self.patch_embedding.collect_arrays(&mut out);
        for layer in &self.layers {
            layer.layer_norm1.collect_arrays(&mut out);
            layer.self_attn.collect_arrays(&mut out);
            layer.layer_norm2.collect_arrays(&mut out);
            layer.mlp.fc1.collect_arrays(&mut out);
            layer.mlp.fc2.collect_arrays(&mut out);
        }
        self.post_layernorm.collect_arrays(&mut out);
        out
    }
}
