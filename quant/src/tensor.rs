//! `Tensor`: what a checkpoint hands to model code, dense or quantized.

use mlx::k_blocks::KBlocks;
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
    /// A GGUF k-quant matrix in the CPU's k-block form ([`KBlocks`]), which only mlxkit's CPU
    /// kernels read: the loader makes it last, from a `Quantized` one, for a layer to multiply
    /// or look rows up in.
    KBlocks(KBlocks),
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
            Tensor::KBlocks(k) => k.shape().iter().map(|&d| d as i32).collect(),
        }
    }

    /// `parts`, matrices of one shape and one layout (all dense, or all quantized alike),
    /// stacked along a new first axis: a `[parts, out, in]` tensor, such as one projection of
    /// every expert of a mixture. `name` names the stack in errors.
    pub fn stack(name: &str, parts: Vec<Tensor>) -> Result<Tensor> {
        let refuse = |what: &str| crate::Error::Unsupported {
            name: name.to_string(),
            what: what.to_string(),
        };
        let stack = |arrays: Vec<Array>| -> Result<Array> { Ok(mlx::stack(&arrays, 0)?) };
        let mut dense = Vec::new();
        let mut quantized = Vec::new();
        for part in parts {
            match part {
                Tensor::Dense(a) => dense.push(a),
                Tensor::Quantized(q) => quantized.push(q),
                Tensor::KBlocks(_) => return Err(refuse("a part is in the k-block form")),
            }
        }
        let Some(spec) = quantized.first().map(|q| q.spec) else {
            if dense.is_empty() {
                return Err(refuse("nothing to stack"));
            }
            return Ok(Tensor::Dense(stack(dense)?));
        };
        if !dense.is_empty() {
            return Err(refuse("its parts mix dense and quantized matrices"));
        }
        if quantized.iter().any(|q| q.spec != spec) {
            return Err(refuse("its parts are quantized differently"));
        }
        let biases = quantized
            .iter()
            .map(|q| q.biases.clone())
            .collect::<Option<Vec<Array>>>()
            .map(stack)
            .transpose()?;
        Ok(Tensor::Quantized(Quantized {
            weights: stack(quantized.iter().map(|q| q.weights.clone()).collect())?,
            scales: stack(quantized.iter().map(|q| q.scales.clone()).collect())?,
            biases,
            spec,
        }))
    }

    /// Whether the tensor is quantized.
    pub fn is_quantized(&self) -> bool {
        matches!(self, Tensor::Quantized(_))
    }

    /// The dense array, if the tensor is dense.
    pub fn as_dense(&self) -> Option<&Array> {
        match self {
            Tensor::Dense(a) => Some(a),
            Tensor::Quantized(_) | Tensor::KBlocks(_) => None,
        }
    }

    /// The quantized matrix, if the tensor is quantized.
    pub fn as_quantized(&self) -> Option<&Quantized> {
        match self {
            Tensor::Dense(_) | Tensor::KBlocks(_) => None,
            Tensor::Quantized(q) => Some(q),
        }
    }

    /// A dense array, dequantizing (into `dtype`, or the scales' dtype) if needed.
    ///
    /// Half-precision scales and biases are widened to f32 first: MLX dequantizes in their
    /// dtype, and f16 arithmetic on a CPU is emulated (twice as slow as f32 loading SmolLM2)
    /// and rounds every weight to f16 before the cast to `dtype`.
    pub fn into_dense(self, dtype: Option<Dtype>) -> Result<Array> {
        match self {
            Tensor::Dense(a) => match dtype {
                Some(d) if d != a.dtype() => Ok(a.astype(d)?),
                _ => Ok(a),
            },
            Tensor::Quantized(q) => {
                let out = dtype.unwrap_or(q.scales.dtype());
                let widen = |a: &Array| -> Result<Array> {
                    match a.dtype() {
                        Dtype::F16 | Dtype::Bf16 => Ok(a.astype(Dtype::F32)?),
                        _ => Ok(a.clone()),
                    }
                };
                let wide = Quantized {
                    scales: widen(&q.scales)?,
                    biases: q.biases.as_ref().map(widen).transpose()?,
                    ..q
                };
                Ok(wide.dequantize(Some(out))?)
            }
            Tensor::KBlocks(k) => {
                let dense = k.dequantize()?;
                match dtype {
                    Some(d) if d != dense.dtype() => Ok(dense.astype(d)?),
                    _ => Ok(dense),
                }
            }
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
            // Its products are computed in f32 whatever the model's dtype.
            Tensor::KBlocks(k) => Tensor::KBlocks(k.clone()),
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
            Tensor::KBlocks(_) => {
                return Err(crate::Error::Unsupported {
                    name: "a k-block matrix".into(),
                    what: "taking rows: the loader makes the form after every such change".into(),
                });
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use mlx::quantized::{QuantSpec, quantize};

    use super::*;

    fn matrix(seed: usize) -> Array {
        let values: Vec<f32> = (0..4 * 64)
            .map(|i| ((i + seed) % 13) as f32 * 0.1)
            .collect();
        Array::from_slice(&values, &[4, 64]).unwrap()
    }

    #[test]
    fn stacks_matrices_of_one_layout_and_names_the_stack_when_they_differ() {
        let q =
            |seed| Tensor::Quantized(quantize(&matrix(seed), QuantSpec::affine(32, 4)).unwrap());
        let stacked = Tensor::stack("e.w", vec![q(0), q(1), q(2)]).unwrap();
        assert!(stacked.is_quantized());
        assert_eq!(stacked.shape(), [3, 4, 64]);
        let dense = Tensor::stack(
            "e.w",
            vec![Tensor::Dense(matrix(0)), Tensor::Dense(matrix(1))],
        );
        assert_eq!(dense.unwrap().shape(), [2, 4, 64]);

        let mixed = Tensor::stack("e.w", vec![q(0), Tensor::Dense(matrix(1))]).unwrap_err();
        assert!(mixed.to_string().contains("e.w"), "{mixed}");
        let eight = Tensor::Quantized(quantize(&matrix(1), QuantSpec::affine(32, 8)).unwrap());
        let unlike = Tensor::stack("e.w", vec![q(0), eight]).unwrap_err();
        assert!(
            unlike.to_string().contains("quantized differently"),
            "{unlike}"
        );
        assert!(Tensor::stack("e.w", Vec::new()).is_err());
    }
}
