//! Reshaping, transposing, broadcasting, joining and splitting.

use mlx_sys::ffi;

use crate::list::{from_owned_list, to_list};
use crate::{Array, Result};

impl Array {
    /// The same elements in a new shape; one dimension may be `-1`.
    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        Array::from_raw(ffi::reshape(self.raw(), shape)?)
    }

    /// Permutes the axes.
    pub fn transpose(&self, axes: &[i32]) -> Result<Array> {
        Array::from_raw(ffi::transpose(self.raw(), axes)?)
    }

    /// Swaps two axes.
    pub fn swap_axes(&self, a: i32, b: i32) -> Result<Array> {
        let ndim = self.ndim();
        let a = crate::array::normalize_axis(a, ndim)?;
        let b = crate::array::normalize_axis(b, ndim)?;
        let mut axes: Vec<i32> = (0..ndim as i32).collect();
        axes.swap(a, b);
        self.transpose(&axes)
    }

    /// Inserts size-one axes.
    pub fn expand_dims(&self, axes: &[i32]) -> Result<Array> {
        Array::from_raw(ffi::expand_dims(self.raw(), axes)?)
    }

    /// Removes size-one axes.
    pub fn squeeze(&self, axes: &[i32]) -> Result<Array> {
        Array::from_raw(ffi::squeeze(self.raw(), axes)?)
    }

    /// Broadcasts to `shape` without copying.
    pub fn broadcast_to(&self, shape: &[i32]) -> Result<Array> {
        Array::from_raw(ffi::broadcast_to(self.raw(), shape)?)
    }

    /// Splits into `sections` equal parts along `axis`.
    pub fn split_equal(&self, sections: i32, axis: i32) -> Result<Vec<Array>> {
        from_owned_list(ffi::split_sections(self.raw(), sections, axis)?)
    }

    /// Splits along `axis` before each of `indices`.
    pub fn split_at(&self, indices: &[i32], axis: i32) -> Result<Vec<Array>> {
        from_owned_list(ffi::split_at(self.raw(), indices, axis)?)
    }

    /// A row-major copy, or the array itself when it already is one.
    pub fn contiguous(&self) -> Result<Array> {
        Array::from_raw(ffi::contiguous(self.raw())?)
    }
}

/// Joins arrays along an existing axis.
pub fn concatenate(arrays: &[Array], axis: i32) -> Result<Array> {
    let list = to_list(arrays)?;
    Array::from_raw(ffi::concatenate(&list, axis)?)
}

/// Joins arrays along a new axis.
pub fn stack(arrays: &[Array], axis: i32) -> Result<Array> {
    let list = to_list(arrays)?;
    Array::from_raw(ffi::stack(&list, axis)?)
}
