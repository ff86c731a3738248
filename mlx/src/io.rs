//! Loading arrays from files through MLX's own readers.

use std::path::Path;

use mlx_sys::ffi;

use crate::list::from_owned_list;
use crate::{Array, Error, Result};

/// Loads every tensor of a safetensors file, in no particular order. MLX reads the data lazily.
pub fn load_safetensors(path: &Path) -> Result<Vec<(String, Array)>> {
    let path = path
        .to_str()
        .ok_or_else(|| Error::InvalidArgument(format!("path {} is not UTF-8", path.display())))?;
    let mut names = Vec::new();
    let mut list = ffi::list_new()?;
    ffi::load_safetensors(path, &mut names, list.pin_mut())?;
    let arrays = from_owned_list(list)?;
    Ok(names.into_iter().zip(arrays).collect())
}
