//! What llama.cpp's converter changes in recurrent mixers' tensors (Mamba-2, gated delta
//! nets), undone: `A_log` from the `A` it stores, and the convolution kernel's squeezed axis.

use mlx::Array;

use crate::Result;

/// `A_log` back from the `A = -exp(A_log)` llama.cpp's converter stores for recurrent mixers
/// (Mamba-2, gated delta nets), flattened from the column it may be written as.
pub(crate) fn a_log_of(stored: &Array) -> Result<Array> {
    Ok(stored.negative()?.log()?.reshape(&[-1])?)
}

/// A depthwise convolution kernel back to transformers' `[channels, 1, kernel]` from the
/// `[channels, kernel]` llama.cpp's converter squeezes it to.
pub(crate) fn unsqueezed_kernel(kernel: &Array) -> Result<Array> {
    Ok(kernel.expand_dims(&[1])?)
}
