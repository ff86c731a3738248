//! `ShortConv`: a causal depthwise convolution over a few tokens that carries its input tail
//! from one forward to the next (the convolution in front of gated delta nets, Mamba mixers and
//! LFM2's blocks).

use mlx::Array;

use crate::{Error, Result};

/// `y_t = Σ_j w_j ⊙ x_{t − K + 1 + j}` per channel over the last `K` inputs, `K` the kernel
/// size; the `K − 1` inputs before a forward come from the previous one (zeros at the start).
#[derive(Debug, Clone)]
pub struct ShortConv {
    /// One row of per-channel weights per tap, oldest input first: `[K, channels]`.
    taps: Vec<Array>,
    /// Added to every output (LFM2's `conv_bias`).
    bias: Option<Array>,
}

impl ShortConv {
    /// From a PyTorch depthwise `Conv1d` weight `[channels, 1, K]` (or `[channels, K]`).
    pub fn from_torch(weight: &Array, channels: i32) -> Result<ShortConv> {
        let shape = weight.shape();
        let kernel = match shape.as_slice() {
            [c, 1, k] | [c, k] if *c == channels && *k > 0 => *k,
            _ => {
                return Err(Error::Weights(format!(
                    "a depthwise convolution over {channels} channels has weight shape {shape:?}"
                )));
            }
        };
        let weight = weight.reshape(&[channels, kernel])?.transpose(&[1, 0])?;
        let taps = (0..kernel)
            .map(|j| Ok(weight.slice_axis(0, j, j + 1)?))
            .collect::<Result<_>>()?;
        Ok(ShortConv { taps, bias: None })
    }

    /// Adds `bias` (`[channels]`) to every output.
    pub fn with_bias(mut self, bias: Option<Array>) -> ShortConv {
        self.bias = bias;
        self
    }

    /// The kernel size `K`.
    pub fn kernel(&self) -> usize {
        self.taps.len()
    }

    /// Appends every array to `out`.
    pub fn collect_arrays(&self, out: &mut Vec<Array>) {
        out.extend(self.taps.iter().cloned());
        out.extend(self.bias.iter().cloned());
    }

    /// Convolves `x: [batch, tokens, channels]` after `tail: [batch, K − 1, channels]` (the
    /// inputs before it): the outputs `[batch, tokens, channels]` and the tail the next forward
    /// starts from.
    pub fn forward(&self, x: &Array, tail: &Array) -> Result<(Array, Array)> {
        let tokens = x.dim(1)?;
        let kernel = self.taps.len() as i32;
        let padded = mlx::concatenate(&[tail.astype(x.dtype())?, x.clone()], 1)?;
        let mut y: Option<Array> = None;
        for (j, tap) in self.taps.iter().enumerate() {
            let j = j as i32;
            let term = padded.slice_axis(1, j, j + tokens)?.multiply(tap)?;
            y = Some(match y {
                Some(sum) => sum.add(&term)?,
                None => term,
            });
        }
        let length = padded.dim(1)?;
        let next_tail = padded.slice_axis(1, length - (kernel - 1), length)?;
        let y = y.ok_or_else(|| Error::InvalidInput("a convolution without taps".into()))?;
        let y = match &self.bias {
            Some(bias) => y.add(bias)?,
            None => y,
        };
        Ok((y, next_tail))
    }
}
