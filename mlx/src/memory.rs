//! MLX's memory accounting and buffer pool.

use mlx_sys::ffi;

use crate::Result;

/// Bytes held by live arrays.
pub fn active_memory() -> Result<usize> {
    Ok(ffi::active_memory()?)
}

/// The highest [`active_memory`] since start or the last [`reset_peak_memory`].
pub fn peak_memory() -> Result<usize> {
    Ok(ffi::peak_memory()?)
}

/// Restarts peak tracking from the current active memory.
pub fn reset_peak_memory() -> Result<()> {
    Ok(ffi::reset_peak_memory()?)
}

/// Bytes of freed buffers MLX keeps pooled for reuse.
pub fn cache_memory() -> Result<usize> {
    Ok(ffi::cache_memory()?)
}

/// Returns pooled buffers to the system.
pub fn clear_cache() -> Result<()> {
    Ok(ffi::clear_cache()?)
}

/// Sets the memory limit MLX tries to stay under; returns the previous limit.
pub fn set_memory_limit(bytes: usize) -> Result<usize> {
    Ok(ffi::set_memory_limit(bytes)?)
}

/// Sets how many bytes of freed buffers MLX may pool; returns the previous limit.
pub fn set_cache_limit(bytes: usize) -> Result<usize> {
    Ok(ffi::set_cache_limit(bytes)?)
}
