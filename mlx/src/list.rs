//! Conversion between Rust slices of arrays and the shim's array lists.

use mlx_sys::{UniquePtr, ffi};

use crate::{Array, Result};

/// Builds a shim list holding references to `arrays`.
pub(crate) fn to_list<'a>(
    arrays: impl IntoIterator<Item = &'a Array>,
) -> Result<UniquePtr<ffi::ArrayList>> {
    let mut list = ffi::list_new()?;
    for array in arrays {
        ffi::list_push(list.pin_mut(), array.raw())?;
    }
    Ok(list)
}

/// Takes the arrays out of a shim list.
pub(crate) fn from_list(list: &ffi::ArrayList) -> Result<Vec<Array>> {
    let len = ffi::list_len(list)?;
    (0..len)
        .map(|i| Array::from_raw(ffi::list_get(list, i)?))
        .collect()
}

/// Takes the arrays out of an owned shim list returned by MLX.
pub(crate) fn from_owned_list(list: UniquePtr<ffi::ArrayList>) -> Result<Vec<Array>> {
    match list.as_ref() {
        Some(list) => from_list(list),
        None => Err(crate::Error::Mlx("MLX returned no array list".into())),
    }
}
