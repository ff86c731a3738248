//! `RmsNorm`: root-mean-square normalization with a learned scale.

use mlx::Array;

use crate::Result;

/// `x / rms(x) · w` over the last axis.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Array,
    eps: f32,
}

impl RmsNorm {
    /// A norm scaling by `weight` as stored.
    pub fn new(weight: Array, eps: f32) -> RmsNorm {
        RmsNorm { weight, eps }
    }

    /// A norm for checkpoints that store `w − 1` (Gemma's convention): the stored weight is
    /// shifted once here, not at every forward.
    pub fn with_unit_offset(stored: Array, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: stored.add(1.0)?,
            eps,
        })
    }

    /// Appends the scale to `out`.
    pub fn collect_arrays(&self, out: &mut Vec<Array>) {
        out.push(self.weight.clone());
    }

    /// Normalizes `x`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(mlx::fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}
