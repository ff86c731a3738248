//! `Linear`: `y = x Wᵀ + b` with a dense or quantized `W`.

use mlx::Array;
use mlx::quantized::{Quantized, packed_cpu_matvec_max_rows};
pub use quant::Tensor;

use crate::Result;
use crate::tensor_parallel::TensorParallel;

/// Appends the arrays of a weight (dense, or packed values, scales and biases) to `out`.
pub fn tensor_arrays(tensor: &Tensor, out: &mut Vec<Array>) {
    match tensor {
        Tensor::Dense(w) => out.push(w.clone()),
        Tensor::Quantized(q) => {
            out.push(q.weights.clone());
            out.push(q.scales.clone());
            out.extend(q.biases.iter().cloned());
        }
        Tensor::KBlocks(k) => out.push(k.array().clone()),
    }
}

/// A fully connected layer over a `[out, in]` weight, dense or quantized in any MLX mode
/// (multiplied without dequantizing).
///
/// A dense layer may also hold the same matrix packed (see [`Linear::with_packed`]): inputs of
/// a few rows, a decode step's, then read the packed form, larger ones the dense one.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Array>,
    packed: Option<Quantized>,
    /// A row-parallel projection's group: its partial products are summed over it before the
    /// bias ([`crate::tensor_parallel`]).
    summed_over: Option<TensorParallel>,
}

impl Linear {
    /// A layer over `weight` (`[out, in]`) with an optional bias (`[out]`).
    pub fn new(weight: Tensor, bias: Option<Array>) -> Linear {
        Linear {
            weight,
            bias,
            packed: None,
            summed_over: None,
        }
    }

    /// The same layer as this rank's part of a row-parallel projection: its products are
    /// summed over `group`'s ranks before the bias is added (once).
    pub(crate) fn summed_over(mut self, group: TensorParallel) -> Linear {
        self.summed_over = Some(group);
        self
    }

    /// Adds the packed form of the same matrix, used for inputs of at most
    /// [`packed_cpu_matvec_max_rows`] rows. On a CPU a dense f32 matrix is fastest through BLAS
    /// for a prompt, while a decode step is bound by the bytes it reads, 5–8× fewer packed.
    pub fn with_packed(mut self, packed: Option<Quantized>) -> Linear {
        self.packed = packed;
        self
    }

    /// The packed copy, when the layer holds one.
    pub fn packed(&self) -> Option<&Quantized> {
        self.packed.as_ref()
    }

    /// Its weight and bias, taken apart.
    pub(crate) fn into_parts(self) -> (Tensor, Option<Array>) {
        (self.weight, self.bias)
    }

    /// The weight, without bias or packed copy.
    pub fn into_weight(self) -> Tensor {
        self.weight
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
            Tensor::KBlocks(k) => k.shape()[0] as i32,
        })
    }

    /// Appends every array this layer holds to `out`.
    pub fn collect_arrays(&self, out: &mut Vec<Array>) {
        tensor_arrays(&self.weight, out);
        out.extend(self.bias.iter().cloned());
        if let Some(p) = &self.packed {
            tensor_arrays(&Tensor::Quantized(p.clone()), out);
        }
    }

    /// Computes every array of the layer now rather than with the rest of the model, so that
    /// what it was made from can be freed as loading goes.
    pub fn evaluated(self) -> Result<Linear> {
        let mut arrays = Vec::new();
        self.collect_arrays(&mut arrays);
        mlx::eval(&arrays)?;
        Ok(self)
    }

    /// `x Wᵀ + b` over the last axis of `x`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = match (&self.packed, &self.weight) {
            (Some(p), _) if rows(x)? <= packed_cpu_matvec_max_rows() => p.matmul(x, true)?,
            (_, Tensor::Dense(w)) => x.matmul(&w.transpose(&[1, 0])?)?,
            (_, Tensor::Quantized(q)) => q.matmul(x, true)?,
            (_, Tensor::KBlocks(k)) => k.matmul(x)?,
        };
        let y = match &self.summed_over {
            Some(group) => group.all_sum(&y)?,
            None => y,
        };
        Ok(match &self.bias {
            Some(b) => y.add(b)?,
            None => y,
        })
    }
}

/// The rows of `x` as a matrix: every axis but the last.
fn rows(x: &Array) -> Result<usize> {
    let last = x.dim(-1)?.max(1) as usize;
    Ok(x.size() / last)
}
