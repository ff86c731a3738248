//! `Mlp`: the gated feed-forward block, with gate and up projections fused into one matmul.

use mlx::Array;
use mlx::quantized::Quantized;

use crate::activation::Activation;
use crate::linear::{Linear, Tensor};
use crate::weights::Weights;
use crate::{Error, Result};

/// `down(act(gate(x)) · up(x))`.
#[derive(Debug, Clone)]
pub struct Mlp {
    gate_up: Linear,
    down: Linear,
    hidden: i32,
    activation: Activation,
}

impl Mlp {
    /// Loads the block saved under `prefix` as `gate_proj`, `up_proj` (`[inter, hidden]`, no
    /// bias) and `down_proj` (`[hidden, inter]`, optional bias): the layout every family here
    /// that has a gated MLP uses.
    pub fn load(
        weights: &mut Weights,
        prefix: &str,
        inter: i32,
        hidden: i32,
        activation: Activation,
    ) -> Result<Mlp> {
        // Split by its hidden columns when `weights` load a tensor-parallel slice.
        Mlp::new(
            weights.column_parallel(&format!("{prefix}.gate_proj"), inter, hidden, false)?,
            weights.column_parallel(&format!("{prefix}.up_proj"), inter, hidden, false)?,
            weights.row_parallel(&format!("{prefix}.down_proj"), hidden, inter, true)?,
            activation,
        )
    }

    /// Builds the block; `gate` and `up` (bias-free) are concatenated along their output rows
    /// once, here, and so are their packed copies when both have one of the same layout.
    pub fn new(gate: Linear, up: Linear, down: Linear, activation: Activation) -> Result<Mlp> {
        let packed = match (gate.packed(), up.packed()) {
            (Some(a), Some(b)) if a.spec == b.spec => {
                match fuse_rows(Tensor::Quantized(a.clone()), Tensor::Quantized(b.clone()))?.0 {
                    Tensor::Quantized(q) => Some(q),
                    Tensor::Dense(_) | Tensor::KBlocks(_) => None,
                }
            }
            _ => None,
        };
        let (gate_up, hidden) = fuse_rows(gate.into_weight(), up.into_weight())?;
        // Fused now rather than with the rest of the model, so that the separate halves, which
        // loading has already evaluated, are freed one block at a time.
        let gate_up = Linear::new(gate_up, None).with_packed(packed).evaluated()?;
        Ok(Mlp {
            gate_up,
            down,
            hidden,
            activation,
        })
    }

    /// Builds the block from gate and up already fused along their output rows
    /// (`[2 · hidden, dim]`, gate first: Phi-3's `gate_up_proj`).
    pub fn from_fused(gate_up: Linear, down: Linear, activation: Activation) -> Result<Mlp> {
        let rows = gate_up.out_features()?;
        if rows % 2 != 0 {
            return Err(Error::Weights(format!(
                "a fused gate/up projection has {rows} rows, not two halves"
            )));
        }
        Ok(Mlp {
            gate_up,
            down,
            hidden: rows / 2,
            activation,
        })
    }

    /// Appends every array of the block to `out`.
    pub fn collect_arrays(&self, out: &mut Vec<Array>) {
        self.gate_up.collect_arrays(out);
        self.down.collect_arrays(out);
    }

    /// Applies the block to `x: [..., dim]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let both = self.gate_up.forward(x)?;
        let parts = both.split_at(&[self.hidden], -1)?;
        let [gate, up] = <[Array; 2]>::try_from(parts)
            .map_err(|_| Error::Weights("gate/up split did not give two parts".into()))?;
        self.down.forward(&self.activation.gated(&gate, &up)?)
    }
}

/// Stacks two `[out, in]` weights of the same kind into `[out_a + out_b, in]`, returning the
/// row count of the first.
pub(crate) fn fuse_rows(a: Tensor, b: Tensor) -> Result<(Tensor, i32)> {
    match (a, b) {
        (Tensor::Dense(a), Tensor::Dense(b)) => {
            let rows = a.dim(0)?;
            Ok((Tensor::Dense(mlx::concatenate(&[a, b], 0)?), rows))
        }
        (Tensor::KBlocks(a), Tensor::KBlocks(b)) => match a.concat_rows(&b)? {
            Some(both) => Ok((Tensor::KBlocks(both), a.shape()[0] as i32)),
            // Two k-quants (Q4_K gate, Q6_K up): fuse in floating point, as mixed storage is.
            None => fuse_rows(
                Tensor::Dense(a.dequantize()?),
                Tensor::Dense(b.dequantize()?),
            ),
        },
        (Tensor::Quantized(a), Tensor::Quantized(b)) if a.spec == b.spec => {
            let rows = a.weights.dim(0)?;
            let biases = match (&a.biases, &b.biases) {
                (Some(x), Some(y)) => Some(mlx::concatenate(&[x.clone(), y.clone()], 0)?),
                (None, None) => None,
                _ => {
                    return Err(Error::Weights(
                        "gate and up disagree on quantization biases".into(),
                    ));
                }
            };
            Ok((
                Tensor::Quantized(Quantized {
                    weights: mlx::concatenate(&[a.weights, b.weights], 0)?,
                    scales: mlx::concatenate(&[a.scales, b.scales], 0)?,
                    biases,
                    spec: a.spec,
                }),
                rows,
            ))
        }
        (a, b) => {
            // Mixed storage (e.g. different quantization per tensor): fuse in floating point.
            let dense = |w: Tensor| -> Result<Array> {
                Ok(match w {
                    Tensor::Dense(w) => w,
                    Tensor::Quantized(q) => q.dequantize(None)?,
                    Tensor::KBlocks(k) => k.dequantize()?,
                })
            };
            let (a, b) = (dense(a)?, dense(b)?);
            let dtype = a.dtype();
            fuse_rows(Tensor::Dense(a), Tensor::Dense(b.astype(dtype)?))
        }
    }
}
