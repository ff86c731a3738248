//! `LayerNorm`: mean-and-variance normalization with optional scale and shift.

use mlx::Array;

use crate::Result;

/// `(x − mean) / std · w + b` over the last axis.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Option<Array>,
    bias: Option<Array>,
    eps: f32,
}

impl LayerNorm {
    /// A norm with optional affine parameters.
    pub fn new(weight: Option<Array>, bias: Option<Array>, eps: f32) -> LayerNorm {
        LayerNorm { weight, bias, eps }
    }

    /// Appends the scale and shift, where present, to `out`.
    pub fn collect_arrays(&self, out: &mut Vec<Array>) {
        out.extend(self.weight.iter().cloned());
        out.extend(self.bias.iter().cloned());
    }

    /// Normalizes `x`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(mlx::fast::layer_norm(
            x,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )?)
    }
}
