//! Counter-based random numbers: explicit keys, so results depend only on the seed.

use mlx_sys::ffi;

use crate::list::from_owned_list;
use crate::{Array, Dtype, Result};

/// A PRNG key derived from `seed`.
pub fn key(seed: u64) -> Result<Array> {
    Array::from_raw(ffi::random_key(seed)?)
}

/// `n` independent keys derived from `key`.
pub fn split(key: &Array, n: i32) -> Result<Vec<Array>> {
    from_owned_list(ffi::random_split(key.raw(), n)?)
}

/// Uniform samples in `[0, 1)`.
pub fn uniform(shape: &[i32], dtype: Dtype, key: &Array) -> Result<Array> {
    Array::from_raw(ffi::random_uniform(shape, dtype.code(), key.raw())?)
}

/// Standard Gumbel samples.
pub fn gumbel(shape: &[i32], dtype: Dtype, key: &Array) -> Result<Array> {
    Array::from_raw(ffi::random_gumbel(shape, dtype.code(), key.raw())?)
}

/// One sample per row from the categorical distribution `softmax(logits)` along `axis`.
pub fn categorical(logits: &Array, axis: i32, key: &Array) -> Result<Array> {
    Array::from_raw(ffi::random_categorical(logits.raw(), axis, key.raw())?)
}
