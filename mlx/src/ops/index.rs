//! Slicing, slice updates, gathers and scatters.

use mlx_sys::ffi;

use crate::{Array, Result};

/// A strided box within an array: `start..stop` by `strides` on every axis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceSpec {
    /// First index per axis.
    pub start: Vec<i32>,
    /// One past the last index per axis.
    pub stop: Vec<i32>,
    /// Step per axis.
    pub strides: Vec<i32>,
}

impl SliceSpec {
    /// A box with unit strides.
    pub fn new(start: &[i32], stop: &[i32]) -> SliceSpec {
        SliceSpec {
            start: start.to_vec(),
            stop: stop.to_vec(),
            strides: vec![1; start.len()],
        }
    }

    /// `start..stop` on `axis` and everything on the other axes of an array of `shape`.
    pub fn along(shape: &[i32], axis: usize, start: i32, stop: i32) -> SliceSpec {
        let mut begin = vec![0; shape.len()];
        let mut end = shape.to_vec();
        if axis < shape.len() {
            begin[axis] = start;
            end[axis] = stop;
        }
        SliceSpec::new(&begin, &end)
    }
}

impl Array {
    /// The elements inside `spec` (a view until written).
    pub fn slice(&self, spec: &SliceSpec) -> Result<Array> {
        Array::from_raw(ffi::slice(
            self.raw(),
            &spec.start,
            &spec.stop,
            &spec.strides,
        )?)
    }

    /// `start..stop` along `axis`, everything on the other axes.
    pub fn slice_axis(&self, axis: i32, start: i32, stop: i32) -> Result<Array> {
        let shape = self.shape();
        let axis = crate::array::normalize_axis(axis, shape.len())?;
        self.slice(&SliceSpec::along(&shape, axis, start, stop))
    }

    /// A slice whose start on `axes` is read from the array `start` at run time, so the graph's
    /// shape does not depend on it.
    pub fn slice_dynamic(&self, start: &Array, axes: &[i32], sizes: &[i32]) -> Result<Array> {
        Array::from_raw(ffi::slice_dynamic(self.raw(), start.raw(), axes, sizes)?)
    }

    /// A copy of `self` with the box `spec` replaced by `update` (broadcast to the box).
    pub fn slice_update(&self, update: &Array, spec: &SliceSpec) -> Result<Array> {
        Array::from_raw(ffi::slice_update(
            self.raw(),
            update.raw(),
            &spec.start,
            &spec.stop,
            &spec.strides,
        )?)
    }

    /// Like [`Array::slice_update`] with the start on `axes` read from an array at run time.
    pub fn slice_update_dynamic(
        &self,
        update: &Array,
        start: &Array,
        axes: &[i32],
    ) -> Result<Array> {
        Array::from_raw(ffi::slice_update_dynamic(
            self.raw(),
            update.raw(),
            start.raw(),
            axes,
        )?)
    }

    /// Gathers slices at `indices` along `axis`.
    pub fn take(&self, indices: &Array, axis: i32) -> Result<Array> {
        Array::from_raw(ffi::take(self.raw(), indices.raw(), axis)?)
    }

    /// Gathers one element per position along `axis`; `indices` broadcasts against `self`.
    pub fn take_along_axis(&self, indices: &Array, axis: i32) -> Result<Array> {
        Array::from_raw(ffi::take_along_axis(self.raw(), indices.raw(), axis)?)
    }

    /// A copy with `values` written at `indices` along `axis`.
    pub fn put_along_axis(&self, indices: &Array, values: &Array, axis: i32) -> Result<Array> {
        Array::from_raw(ffi::put_along_axis(
            self.raw(),
            indices.raw(),
            values.raw(),
            axis,
        )?)
    }
}
