//! Compiling Rust closures into fused MLX graphs.

use mlx_sys::{RustClosure, UniquePtr, ffi};

use crate::list::{from_list, from_owned_list, to_list};
use crate::{Array, Error, Result};

/// A function MLX traced once and replays as a fused graph on inputs of the same shapes (or any
/// shapes, when compiled `shapeless`).
pub struct Compiled {
    raw: UniquePtr<ffi::Compiled>,
}

/// Compiles `f`. MLX traces it on the first call (and again for new input shapes); an `Err`
/// returned or a panic raised inside `f` comes out of [`Compiled::call`] as an error.
pub fn compile<F>(f: F, shapeless: bool) -> Result<Compiled>
where
    F: Fn(&[Array]) -> Result<Vec<Array>> + 'static,
{
    let closure = RustClosure(Box::new(move |inputs: &ffi::ArrayList| {
        let inputs = from_list(inputs).map_err(|e| e.to_string())?;
        let outputs = f(&inputs).map_err(|e| e.to_string())?;
        to_list(&outputs).map_err(|e| e.to_string())
    }));
    let raw = ffi::compile(Box::new(closure), shapeless)?;
    if raw.is_null() {
        return Err(Error::Mlx("compile returned no function".into()));
    }
    Ok(Compiled { raw })
}

impl Compiled {
    /// Runs the compiled function.
    pub fn call(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        let compiled = self
            .raw
            .as_ref()
            .ok_or_else(|| Error::Mlx("compiled function is null".into()))?;
        let list = to_list(inputs)?;
        from_owned_list(ffi::compiled_call(compiled, &list)?)
    }
}
