//! `Conv1d`: one-dimensional convolution over `[batch, length, channels]`.

use mlx::Array;

use crate::Result;

/// A 1-D convolution with weight `[out, kernel, in / groups]` as MLX lays it out.
#[derive(Debug, Clone)]
pub struct Conv1d {
    weight: Array,
    bias: Option<Array>,
    stride: i32,
    padding: i32,
    groups: i32,
}

impl Conv1d {
    /// A convolution; `weight` must already be in MLX's `[out, kernel, in / groups]` layout
    /// (PyTorch checkpoints store `[out, in / groups, kernel]`: use [`Conv1d::from_torch`]).
    pub fn new(
        weight: Array,
        bias: Option<Array>,
        stride: i32,
        padding: i32,
        groups: i32,
    ) -> Conv1d {
        Conv1d {
            weight,
            bias,
            stride,
            padding,
            groups,
        }
    }

    /// A convolution from a PyTorch-layout weight `[out, in / groups, kernel]`.
    pub fn from_torch(
        weight: &Array,
        bias: Option<Array>,
        stride: i32,
        padding: i32,
        groups: i32,
    ) -> Result<Conv1d> {
        Ok(Conv1d::new(
            weight.swap_axes(1, 2)?,
            bias,
            stride,
            padding,
            groups,
        ))
    }

    /// Appends the weight and bias to `out`.
    pub fn collect_arrays(&self, out: &mut Vec<Array>) {
        out.push(self.weight.clone());
        out.extend(self.bias.iter().cloned());
    }

    /// Convolves `x: [batch, length, in]` → `[batch, length', out]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = mlx::conv1d(x, &self.weight, self.stride, self.padding, 1, self.groups)?;
        Ok(match &self.bias {
            Some(b) => y.add(b)?,
            None => y,
        })
    }
}
