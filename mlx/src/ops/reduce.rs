//! Reductions over axes.

use mlx_sys::ffi::{self, ReduceOp};

use crate::{Array, Result};

macro_rules! reductions {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Array {
            $(
                $(#[$doc])*
                pub fn $name(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
                    Array::from_raw(ffi::reduce(ReduceOp::$op, self.raw(), axes, keepdims)?)
                }
            )*
        }
    };
}

reductions! {
    /// Sum over `axes`.
    sum => Sum;
    /// Mean over `axes`.
    mean => Mean;
    /// Maximum over `axes`.
    max => Max;
    /// Minimum over `axes`.
    min => Min;
    /// Product over `axes`.
    prod => Prod;
    /// `log(sum(exp(x)))` over `axes`, computed stably.
    logsumexp => LogSumExp;
    /// Whether every element over `axes` is true.
    all => All;
    /// Whether any element over `axes` is true.
    any => Any;
}

impl Array {
    /// Index of the largest element along `axis` (u32).
    pub fn argmax(&self, axis: i32, keepdims: bool) -> Result<Array> {
        Array::from_raw(ffi::argreduce(true, self.raw(), axis, keepdims)?)
    }

    /// Index of the smallest element along `axis` (u32).
    pub fn argmin(&self, axis: i32, keepdims: bool) -> Result<Array> {
        Array::from_raw(ffi::argreduce(false, self.raw(), axis, keepdims)?)
    }

    /// Softmax over `axes`. `precise` accumulates in f32 for low-precision inputs.
    pub fn softmax(&self, axes: &[i32], precise: bool) -> Result<Array> {
        Array::from_raw(ffi::softmax(self.raw(), axes, precise)?)
    }

    /// Running sum along `axis`.
    pub fn cumsum(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
        Array::from_raw(ffi::cumsum(self.raw(), axis, reverse, inclusive)?)
    }
}
