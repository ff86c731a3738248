//! What the Vision Transformer towers (SigLIP, CLIP) share: cutting an image into square
//! patches for the patch embedding, and the pre-norm encoder layer — LayerNorm with bias,
//! unmasked multi-head attention with biases, LayerNorm, an ungated MLP (`fc1`, activation,
//! `fc2`), each added to the residual stream. The towers differ around it (class token, where
//! the LayerNorms sit, which output a family reads) and say so in their own files.
//!
//! Reference: Dosovitskiy et al., "An Image is Worth 16x16 Words" (2021); transformers'
//! `SiglipEncoderLayer` and `CLIPEncoderLayer` (5.24), which compute the same layer.

use mlx::fast::{AttentionMask, RopeOffset};
use mlx::{Array, Dtype};

use crate::activation::Activation;
use crate::attention::{Attention, AttentionParts};
use crate::config::{Fields, dim};
use crate::layer_norm::LayerNorm;
use crate::linear::{Linear, Tensor};
use crate::weights::Weights;
use crate::{Error, Result};

/// Largest image side, in pixels, a config may claim.
pub(crate) const MAX_IMAGE_SIZE: usize = 1 << 16;
/// Most channels an image may have.
pub(crate) const MAX_CHANNELS: usize = 16;

/// Refuses a tower whose heads do not split its width or whose patches do not tile its image.
pub(crate) fn check_geometry(
    hidden_size: usize,
    num_attention_heads: usize,
    image_size: usize,
    patch_size: usize,
) -> Result<()> {
    if num_attention_heads == 0 || !hidden_size.is_multiple_of(num_attention_heads) {
        return Err(Error::Config(format!(
            "vision_config: {num_attention_heads} attention heads do not split a hidden size of \
             {hidden_size}"
        )));
    }
    if patch_size == 0 || !image_size.is_multiple_of(patch_size) {
        return Err(Error::Config(format!(
            "vision_config: `patch_size` = {patch_size} does not tile `image_size` = {image_size}"
        )));
    }
    Ok(())
}

/// `num_channels`, 3 (transformers' default) when absent.
pub(crate) fn num_channels(f: &Fields<'_>) -> Result<usize> {
    match f.bounded("num_channels", MAX_CHANNELS)? {
        Some(0) => Err(Error::Config("vision_config: `num_channels` is 0".into())),
        Some(c) => Ok(c),
        None => Ok(3),
    }
}

/// `layer_norm_eps`, the family's default when absent; it must be positive.
pub(crate) fn layer_norm_eps(f: &Fields<'_>, default: f64) -> Result<f32> {
    let eps = f.f64("layer_norm_eps")?.unwrap_or(default);
    if eps <= 0.0 {
        return Err(Error::Config(format!(
            "vision_config: `layer_norm_eps` must be positive, got {eps}"
        )));
    }
    Ok(eps as f32)
}

/// The sizes of a tower's encoder layers.
pub(crate) struct EncoderDims {
    pub(crate) hidden_size: usize,
    pub(crate) intermediate_size: usize,
    pub(crate) num_attention_heads: usize,
    pub(crate) layer_norm_eps: f32,
    pub(crate) activation: Activation,
}

/// A LayerNorm with weight and bias, `name.weight` and `name.bias`.
pub(crate) fn layer_norm(
    weights: &mut Weights,
    name: &str,
    hidden: i32,
    eps: f32,
) -> Result<LayerNorm> {
    Ok(LayerNorm::new(
        Some(weights.dense(&format!("{name}.weight"), &[hidden])?),
        Some(weights.dense(&format!("{name}.bias"), &[hidden])?),
        eps,
    ))
}

/// A projection that must have its bias.
fn biased(weights: &mut Weights, name: &str, out: i32, inp: i32) -> Result<Linear> {
    if !weights.contains(&format!("{name}.bias")) {
        return Err(Error::Weights(format!("tensor `{name}.bias` is missing")));
    }
    weights.linear(name, out, inp)
}

/// The patch embedding's convolution (`name.weight`, and `name.bias` when `bias`) as one matrix
/// over each patch's (channel, row, column) values: the kernel as transformers stores it,
/// `[hidden, channels, p, p]`, or as MLX's convolutions store it (mlx-vlm's conversions),
/// `[hidden, p, p, channels]`, put back in transformers' order.
pub(crate) fn patch_embedding(
    weights: &mut Weights,
    name: &str,
    hidden: i32,
    channels: i32,
    patch: i32,
    bias: bool,
) -> Result<Linear> {
    let weight_name = format!("{name}.weight");
    let kernel = match weights.weight(&weight_name)? {
        Tensor::Dense(a) => a,
        quantized => quantized.into_dense(Some(weights.dtype()))?,
    };
    let kernel = if kernel.shape() == [hidden, channels, patch, patch] {
        kernel
    } else if channels != patch && kernel.shape() == [hidden, patch, patch, channels] {
        kernel.transpose(&[0, 3, 1, 2])?
    } else {
        return Err(Error::Weights(format!(
            "tensor `{weight_name}` has shape {:?}, expected [{hidden}, {channels}, {patch}, \
             {patch}]",
            kernel.shape()
        )));
    };
    let bias = if bias {
        Some(weights.dense(&format!("{name}.bias"), &[hidden])?)
    } else {
        None
    };
    Ok(Linear::new(
        Tensor::Dense(kernel.reshape(&[hidden, channels * patch * patch])?),
        bias,
    ))
}

/// `pixel_values` (`[images, channels, side, side]`, any float dtype) cut into patches,
/// `[images, (side / patch)², channels · patch · patch]` in `dtype`, numbered row by row, each
/// patch's values in the kernel's (channel, row, column) order: a stride-p convolution with a
/// p×p kernel is then one matrix product. Images of another shape are refused.
pub(crate) fn cut_patches(
    pixel_values: &Array,
    channels: i32,
    side: i32,
    patch: i32,
    dtype: Dtype,
) -> Result<Array> {
    let shape = pixel_values.shape();
    if shape.len() != 4 || shape[0] < 1 || shape[1..] != [channels, side, side] {
        return Err(Error::InvalidInput(format!(
            "pixel values of shape {shape:?}, expected [images, {channels}, {side}, {side}]"
        )));
    }
    let (images, grid) = (shape[0], side / patch);
    Ok(pixel_values
        .astype(dtype)?
        .reshape(&[images, channels, grid, patch, grid, patch])?
        .transpose(&[0, 2, 4, 1, 3, 5])?
        .reshape(&[images, grid * grid, channels * patch * patch])?)
}

/// The ungated feed-forward block (`mlp`): `fc2(act(fc1(x)))`.
struct Mlp {
    fc1: Linear,
    fc2: Linear,
    activation: Activation,
}

/// One pre-norm encoder layer (`layers.{i}`).
pub(crate) struct EncoderLayer {
    layer_norm1: LayerNorm,
    self_attn: Attention,
    layer_norm2: LayerNorm,
    mlp: Mlp,
}

impl EncoderLayer {
    /// Builds the layer under `prefix` (such as `….encoder.layers.0`).
    pub(crate) fn new(
        weights: &mut Weights,
        prefix: &str,
        d: &EncoderDims,
    ) -> Result<EncoderLayer> {
        let hidden = dim(d.hidden_size, "vision_config.hidden_size")?;
        let inter = dim(d.intermediate_size, "vision_config.intermediate_size")?;
        let heads = dim(d.num_attention_heads, "vision_config.num_attention_heads")?;
        let head_dim = hidden / heads;
        let a = format!("{prefix}.self_attn");
        Ok(EncoderLayer {
            layer_norm1: layer_norm(
                weights,
                &format!("{prefix}.layer_norm1"),
                hidden,
                d.layer_norm_eps,
            )?,
            self_attn: AttentionParts::new(
                biased(weights, &format!("{a}.q_proj"), hidden, hidden)?,
                biased(weights, &format!("{a}.k_proj"), hidden, hidden)?,
                biased(weights, &format!("{a}.v_proj"), hidden, hidden)?,
                biased(weights, &format!("{a}.out_proj"), hidden, hidden)?,
                heads,
                heads,
                head_dim,
            )
            .build(),
            layer_norm2: layer_norm(
                weights,
                &format!("{prefix}.layer_norm2"),
                hidden,
                d.layer_norm_eps,
            )?,
            mlp: Mlp {
                fc1: biased(weights, &format!("{prefix}.mlp.fc1"), inter, hidden)?,
                fc2: biased(weights, &format!("{prefix}.mlp.fc2"), hidden, inter)?,
                activation: d.activation,
            },
        })
    }

    /// The layer over `h` (`[images, tokens, hidden]`): every token attends to every other.
    pub(crate) fn forward(&self, h: &Array) -> Result<Array> {
        let x = self.layer_norm1.forward(h)?;
        let projected = self.self_attn.project(&x, RopeOffset::Scalar(0))?;
        let heads = self.self_attn.attend_heads(
            &projected.queries,
            &projected.keys,
            &projected.values,
            AttentionMask::None,
        )?;
        let h = h.add(&self.self_attn.output(&heads, None)?)?;
        let ff = self.mlp.fc2.forward(
            &self
                .mlp
                .activation
                .apply(&self.mlp.fc1.forward(&self.layer_norm2.forward(&h)?)?)?,
        )?;
        Ok(h.add(&ff)?)
    }

    /// Its weight arrays.
    pub(crate) fn collect_arrays(&self, out: &mut Vec<Array>) {
        self.layer_norm1.collect_arrays(out);
        self.self_attn.collect_arrays(out);
        self.layer_norm2.collect_arrays(out);
        self.mlp.fc1.collect_arrays(out);
        self.mlp.fc2.collect_arrays(out);
    }
}
