//! Qwen3.5's (and Qwen3-Next's) gated delta nets as llama.cpp's converter writes them, read
//! back in transformers' layout.
//!
//! Besides storing `A = -exp(A_log)` and squeezing the convolution kernels, the converter
//! reorders every value-head axis of a delta net whose key heads serve several value heads:
//! transformers groups value heads by their key head (`k0v0 k0v1 k1v0 k1v1`), llama.cpp tiles
//! them (`k0v0 k1v0 k0v1 k1v1`) so that a broadcast replaces an interleaved repeat. The value
//! rows of `in_proj_qkv` and their convolution channels, the rows of `in_proj_z`, `in_proj_a`
//! and `in_proj_b`, `A_log`, `dt_bias` and the input columns of `out_proj` are all reordered.
//! A quantized tensor among them is dequantized here: its groups run along the reordered
//! axis. Qwen3-Next's converter predates the reordering: its value heads stay grouped.

use std::collections::BTreeMap;

use mlx::Array;

use crate::MetaValue;
use crate::gguf_recurrent::{a_log_of, unsqueezed_kernel};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// The head layout of a model's delta nets, from the file's `ssm.*` keys.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeltaNetHeads {
    key_heads: i32,
    values_per_key: i32,
    key_dim: i32,
    value_dim: i32,
    /// Whether the converter tiled the value heads (Qwen3.5, not Qwen3-Next).
    tiled: bool,
}

impl DeltaNetHeads {
    /// `ssm.group_count` key heads of `ssm.state_size`, `ssm.time_step_rank` value heads
    /// sharing `ssm.inner_size` features; `None` when the file lacks them.
    pub(crate) fn from_metadata(
        metadata: &BTreeMap<String, MetaValue>,
        arch: &str,
    ) -> Option<DeltaNetHeads> {
        let size = |key: &str| {
            metadata
                .get(&format!("{arch}.ssm.{key}"))
                .and_then(MetaValue::as_u64)
                .and_then(|v| i32::try_from(v).ok())
                .filter(|&v| v > 0)
        };
        let (key_heads, value_heads) = (size("group_count")?, size("time_step_rank")?);
        if value_heads % key_heads != 0 || size("inner_size")? % value_heads != 0 {
            return None;
        }
        Some(DeltaNetHeads {
            key_heads,
            values_per_key: value_heads / key_heads,
            key_dim: size("state_size")?,
            value_dim: size("inner_size")? / value_heads,
            tiled: arch != "qwen3next",
        })
    }

    /// The tiled value heads along `axis` (of `width` entries each) back in grouped order.
    fn untile(&self, a: &Array, axis: usize, width: i32) -> Result<Array> {
        let shape = a.shape();
        let mut split = shape[..axis].to_vec();
        split.extend([self.values_per_key, self.key_heads, width]);
        split.extend(&shape[axis + 1..]);
        let axis = axis as i32;
        Ok(a.reshape(&split)?
            .swap_axes(axis, axis + 1)?
            .reshape(&shape)?)
    }

    /// Untiles the rows after the queries' and keys' (`in_proj_qkv`, the convolution).
    fn untile_value_rows(&self, a: &Array) -> Result<Array> {
        let qk = 2 * self.key_heads * self.key_dim;
        let rows = a.dim(0)?;
        let values = self.untile(&a.slice_axis(0, qk, rows)?, 0, self.value_dim)?;
        Ok(mlx::concatenate(&[a.slice_axis(0, 0, qk)?, values], 0)?)
    }
}

/// Tensor `name` (a transformers name under `linear_attn.`) in transformers' layout.
pub(crate) fn undo_delta_net(name: &str, tensor: Tensor, heads: DeltaNetHeads) -> Result<Tensor> {
    let reordered = heads.tiled && heads.values_per_key > 1;
    let touched = name.ends_with(".A_log")
        || name.ends_with(".conv1d.weight")
        || (reordered
            && [
                ".dt_bias",
                ".in_proj_qkv.weight",
                ".in_proj_z.weight",
                ".in_proj_a.weight",
                ".in_proj_b.weight",
                ".out_proj.weight",
            ]
            .iter()
            .any(|s| name.ends_with(s)));
    if !touched {
        return Ok(tensor);
    }
    let a = tensor.into_dense(None)?;
    let untiled = |a: Array, axis: usize, width: i32| -> Result<Array> {
        if reordered {
            heads.untile(&a, axis, width)
        } else {
            Ok(a)
        }
    };
    let a = if name.ends_with(".A_log") {
        untiled(a_log_of(&a)?, 0, 1)?
    } else if name.ends_with(".dt_bias") {
        untiled(a, 0, 1)?
    } else if name.ends_with(".conv1d.weight") {
        if a.ndim() != 2 {
            return Err(Error::Config(format!(
                "`{name}` has shape {:?}, expected the converter's [channels, kernel]",
                a.shape()
            )));
        }
        let a = if reordered {
            heads.untile_value_rows(&a)?
        } else {
            a
        };
        unsqueezed_kernel(&a)?
    } else if name.ends_with(".in_proj_qkv.weight") {
        heads.untile_value_rows(&a)?
    } else if name.ends_with(".in_proj_z.weight") {
        heads.untile(&a, 0, heads.value_dim)?
    } else if name.ends_with(".out_proj.weight") {
        heads.untile(&a, 1, heads.value_dim)?
    } else {
        // `in_proj_a`, `in_proj_b`: one row per value head.
        heads.untile(&a, 0, 1)?
    };
    Ok(Tensor::Dense(a))
}
