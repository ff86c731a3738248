//! Convolutions.

use mlx_sys::ffi;

use crate::{Array, Result};

/// 1-D convolution of `input: [N, L, C_in]` with `weight: [C_out, K, C_in / groups]`.
pub fn conv1d(
    input: &Array,
    weight: &Array,
    stride: i32,
    padding: i32,
    dilation: i32,
    groups: i32,
) -> Result<Array> {
    Array::from_raw(ffi::conv1d(
        input.raw(),
        weight.raw(),
        stride,
        padding,
        dilation,
        groups,
    )?)
}
