//! `Tensor`: what a checkpoint hands to model code, dense or quantized.

use mlx::quantized::Quantized;
use mlx::{Array, Dtype};

use crate::Result;

/// One checkpoint tensor, ready for MLX.
#[derive(Debug, Clone)]
pub enum Tensor {
    /// A plain array.
    Dense(Array),
    /// A quantized matrix (quantized along its last axis); `shape()` reports it unpacked.
    Quantized(Quantized),
}

impl Tensor {
    /// The logical shape: for a quantized tensor, the shape of the matrix it stands for.
    pub fn shape(&self) -> Vec<i32> {
        match self {
            Tensor::Dense(a) => a.shape(),
            Tensor::Quantized(q) => {
                let mut shape = q.weights.shape();
                if let Some(last) = shape.last_mut() {
                    // Packed words hold 32 bits each.
                    *last = *last * 32 / q.spec.bits.max(1);
                }
                shape
            }
        }
    }

    /// Whether the tensor is quantized.
    pub fn is_quantized(&self) -> bool {
        matches!(self, Tensor::Quantized(_))
    }

    /// The dense array, if the tensor is dense.
    pub fn as_dense(&self) -> Option<&Array> {
        match self {
            Tensor::Dense(a) => Some(a),
            Tensor::Quantized(_) => None,
        }
    }

    /// The quantized matrix, if the tensor is quantized.
    pub fn as_quantized(&self) -> Option<&Quantized> {
        match self {
            Tensor::Dense(_) => None,
            Tensor::Quantized(q) => Some(q),
        }
    }

    /// A dense array, dequantizing (into `dtype`, or the scales' dtype) if needed.
    pub fn into_dense(self, dtype: Option<Dtype>) -> Result<Array> {
        match self {
            Tensor::Dense(a) => match dtype {
                Some(d) if d != a.dtype() => Ok(a.astype(d)?),
                _ => Ok(a),
            },
            Tensor::Quantized(q) => Ok(q.dequantize(dtype)?),
        }
    }

    /// The tensor with its floating-point parts in `dtype`: a dense float array is cast, a
    /// quantized one keeps its packed integers and casts its affine scales and biases (the
    /// dtype the quantized matmul computes in). Integer arrays and the byte-coded scales of
    /// the microscaling modes are left as they are.
    pub fn to_dtype(&self, dtype: Dtype) -> Result<Tensor> {
        let cast = |a: &Array| -> Result<Array> {
            if a.dtype().is_float() && a.dtype() != dtype {
                Ok(a.astype(dtype)?)
            } else {
                Ok(a.clone())
            }
        };
        Ok(match self {
            Tensor::Dense(a) => Tensor::Dense(cast(a)?),
            Tensor::Quantized(q) => Tensor::Quantized(Quantized {
                weights: q.weights.clone(),
                scales: cast(&q.scales)?,
                biases: q.biases.as_ref().map(cast).transpose()?,
                spec: q.spec,
            }),
        })
    }

    /// Rows `indices` (an integer array) of the second-to-last axis — the output rows of a
    /// weight matrix. Quantized tensors stay quantized: whole rows of packed words, scales and
    /// biases move together, so no block is ever split.
    pub fn take_rows(&self, indices: &Array) -> Result<Tensor> {
        let rows = |a: &Array| -> Result<Array> {
            let axis = if a.ndim() >= 2 { -2 } else { 0 };
            Ok(a.take(indices, axis)?)
        };
        Ok(match self {
            Tensor::Dense(a) => Tensor::Dense(rows(a)?),
            Tensor::Quantized(q) => Tensor::Quantized(Quantized {
                weights: rows(&q.weights)?,
                scales: rows(&q.scales)?,
                biases: q.biases.as_ref().map(rows).transpose()?,
                spec: q.spec,
            }),
        })
    }
}
