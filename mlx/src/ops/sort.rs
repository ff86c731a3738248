//! Sorting, partitioning and top-k.

use mlx_sys::ffi;

use crate::{Array, Result};

impl Array {
    /// Sorted copy along `axis`, ascending.
    pub fn sort(&self, axis: i32) -> Result<Array> {
        Array::from_raw(ffi::sort(self.raw(), axis)?)
    }

    /// Indices that sort along `axis`, ascending (u32).
    pub fn argsort(&self, axis: i32) -> Result<Array> {
        Array::from_raw(ffi::argsort(self.raw(), axis)?)
    }

    /// Indices that partition along `axis`: the element at `kth` is in sorted position, smaller
    /// ones before it and larger ones after, in no particular order (u32).
    pub fn argpartition(&self, kth: i32, axis: i32) -> Result<Array> {
        Array::from_raw(ffi::argpartition(self.raw(), kth, axis)?)
    }

    /// The `k` largest values along `axis`, in no particular order.
    pub fn topk(&self, k: i32, axis: i32) -> Result<Array> {
        Array::from_raw(ffi::topk(self.raw(), k, axis)?)
    }
}
