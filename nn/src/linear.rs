//! `Linear`: `y = x Wᵀ + b` with a dense or quantized `W`.

use mlx::Array;
pub use quant::Tensor;

use crate::Result;

/// Appends the arrays of a weight (dense, or packed values, scales and biases) to `out`.
pub fn tensor_arrays(tensor: &Tensor, out: &mut Vec<Array>) {
    match tensor {
        Tensor::Dense(w) => out.push(w.clone()),
        Tensor::Quantized(q) => {
            out.push(q.weights.clone());
            out.push(q.scales.clone());
            out.extend(q.biases.iter().cloned());
        }
    }
}

/// A fully connected layer over a `[out, in]` weight, dense or quantized in any MLX mode
/// (multiplied without dequantizing).
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Array>,
}

impl Linear {
    /// A layer over `weight` (`[out, in]`) with an optional bias (`[out]`).
    pub fn new(weight: Tensor, bias: Option<Array>) -> Linear {
        Linear { weight, bias }
    }

    /// The weight.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The output features.
    pub fn out_features(&self) -> Result<i32> {
        Ok(match &self.weight {
            Tensor::Dense(w) => w.dim(0)?,
            Tensor::Quantized(q) => q.weights.dim(0)?,
        })
    }

    /// Appends every array this layer holds to `out`.
    pub fn collect_arrays(&self, out: &mut Vec<Array>) {
        tensor_arrays(&self.weight, out);
        out.extend(self.bias.iter().cloned());
    }

    /// `x Wᵀ + b` over the last axis of `x`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = match &self.weight {
            Tensor::Dense(w) => x.matmul(&w.transpose(&[1, 0])?)?,
            Tensor::Quantized(q) => q.matmul(x, true)?,
        };
        Ok(match &self.bias {
            Some(b) => y.add(b)?,
            None => y,
        })
    }
}
