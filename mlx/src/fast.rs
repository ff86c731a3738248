//! MLX's fused kernels: normalization, rotary embedding and attention.

use mlx_sys::ffi;

use crate::{Array, Result};

/// RMS normalization over the last axis, scaled by `weight` when given.
pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array> {
    let w = weight.unwrap_or(x);
    Array::from_raw(ffi::rms_norm(x.raw(), weight.is_some(), w.raw(), eps)?)
}

/// Layer normalization over the last axis, with optional scale and shift.
pub fn layer_norm(
    x: &Array,
    weight: Option<&Array>,
    bias: Option<&Array>,
    eps: f32,
) -> Result<Array> {
    let w = weight.unwrap_or(x);
    let b = bias.unwrap_or(x);
    Array::from_raw(ffi::layer_norm(
        x.raw(),
        weight.is_some(),
        w.raw(),
        bias.is_some(),
        b.raw(),
        eps,
    )?)
}

/// The position of the first row given to [`rope`].
#[derive(Debug, Clone, Copy)]
pub enum RopeOffset<'a> {
    /// One offset for every sequence in the batch.
    Scalar(i32),
    /// One offset per batch row (an int32 array of shape `[batch]`).
    PerRow(&'a Array),
}

/// How rotary frequencies are chosen.
#[derive(Debug, Clone, Copy)]
pub enum RopeFrequencies<'a> {
    /// `base^(-2i/dims)`.
    Base(f32),
    /// Explicit inverse frequencies of length `dims / 2` (llama3, yarn and other scalings).
    Custom(&'a Array),
}

/// Rotary position embedding over the first `dims` features of the last axis of
/// `x: [batch, heads, seq, head_dim]`. `traditional` rotates adjacent pairs `(2i, 2i+1)` instead
/// of the two halves. Positions are multiplied by `scale`.
pub fn rope(
    x: &Array,
    dims: i32,
    traditional: bool,
    frequencies: RopeFrequencies<'_>,
    scale: f32,
    offset: RopeOffset<'_>,
) -> Result<Array> {
    let (has_base, base, has_freqs, freqs) = match frequencies {
        RopeFrequencies::Base(base) => (true, base, false, x),
        RopeFrequencies::Custom(freqs) => (false, 0.0, true, freqs),
    };
    let raw = match offset {
        RopeOffset::Scalar(offset) => ffi::rope(
            x.raw(),
            dims,
            traditional,
            has_base,
            base,
            scale,
            offset,
            has_freqs,
            freqs.raw(),
        )?,
        RopeOffset::PerRow(offsets) => ffi::rope_offsets(
            x.raw(),
            dims,
            traditional,
            has_base,
            base,
            scale,
            offsets.raw(),
            has_freqs,
            freqs.raw(),
        )?,
    };
    Array::from_raw(raw)
}

/// The mask of [`scaled_dot_product_attention`].
#[derive(Debug, Clone, Copy)]
pub enum AttentionMask<'a> {
    /// Every query sees every key.
    None,
    /// Query `i` of `n` sees keys up to `key_len - n + i` (MLX's fused causal path).
    Causal,
    /// A boolean mask (true = attend) or an additive float mask, broadcast to
    /// `[batch, heads, queries, keys]`.
    Array(&'a Array),
}

/// `softmax(q kᵀ · scale + mask) v` for `q: [B, Hq, L, D]`, `k, v: [B, Hkv, S, D]`, with grouped
/// query attention when `Hq` is a multiple of `Hkv`.
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: AttentionMask<'_>,
) -> Result<Array> {
    let (mode, has_mask, mask_array) = match mask {
        AttentionMask::None => ("", false, q),
        AttentionMask::Causal => ("causal", false, q),
        AttentionMask::Array(m) => ("array", true, m),
    };
    Array::from_raw(ffi::scaled_dot_product_attention(
        q.raw(),
        k.raw(),
        v.raw(),
        scale,
        mode,
        has_mask,
        mask_array.raw(),
    )?)
}
