//! Forcing lazy graphs: blocking and asynchronous evaluation.

use mlx_sys::ffi;

use crate::list::to_list;
use crate::{Array, Result};

/// Evaluates every array (and what it depends on), blocking until done. An error raised while
/// computing, not only while building the graph, comes back as [`crate::Error::Mlx`].
pub fn eval<'a>(arrays: impl IntoIterator<Item = &'a Array>) -> Result<()> {
    let list = to_list(arrays)?;
    Ok(ffi::eval(&list)?)
}

/// Schedules evaluation and returns at once; a later [`eval`] or read waits for it. This is what
/// lets the next decode step be dispatched before the host reads the current token.
pub fn async_eval<'a>(arrays: impl IntoIterator<Item = &'a Array>) -> Result<()> {
    let list = to_list(arrays)?;
    Ok(ffi::async_eval(&list)?)
}
