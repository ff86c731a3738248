//! Small array helpers shared by the caches: checked index conversion, owned copies, shape checks.

use mlx::{Array, Dtype};

use crate::error::{Error, Result};

/// `value` as an MLX dimension or index.
pub(crate) fn dim(value: usize, what: &'static str) -> Result<i32> {
    i32::try_from(value).map_err(|_| Error::TooLarge { what, value })
}

/// A copy of `start..stop` along `axis` that owns a buffer of exactly its own size.
///
/// A slice is a view: kept alive, it pins the whole buffer it was cut from, and it keeps that
/// buffer shared so MLX cannot update it in place. A gather always writes a fresh buffer.
pub(crate) fn owned_range(array: &Array, axis: i32, start: usize, stop: usize) -> Result<Array> {
    let indices = Array::arange(start as f64, stop as f64, 1.0, Dtype::I32)?;
    Ok(array.take(&indices, axis)?)
}

/// The elements at `indices` along `axis`, in that order, in a fresh buffer.
pub(crate) fn gather(array: &Array, axis: i32, indices: &[i32]) -> Result<Array> {
    let len = dim(indices.len(), "gather length")?;
    let indices = Array::from_slice(indices, &[len])?;
    Ok(array.take(&indices, axis)?)
}

/// A copy of the whole array in a buffer of its own, so a boundary state cut out of a
/// forward-sized buffer does not pin that buffer (see the recurrent cache).
pub fn compact(array: &Array) -> Result<Array> {
    let shape = array.shape();
    if shape.is_empty() {
        return Ok(array.clone());
    }
    let rows = usize::try_from(shape[0]).unwrap_or(0);
    owned_range(array, 0, 0, rows)
}

/// The shape of what a KV cache stores, fixed by its first write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KvShape {
    pub batch: i32,
    pub heads: i32,
    pub key_dim: i32,
    pub value_dim: i32,
    pub dtype: Dtype,
}

impl KvShape {
    /// Checks a `[batch, kv_heads, new_tokens, head_dim]` pair of keys and values and returns
    /// its shape and the number of new tokens.
    pub fn of(keys: &Array, values: &Array) -> Result<(KvShape, usize)> {
        let k = keys.shape();
        let v = values.shape();
        if k.len() != 4 || k[2] < 1 {
            return Err(Error::Shape {
                what: "keys",
                expected: "[batch, kv_heads, new_tokens >= 1, head_dim]".into(),
                found: k,
            });
        }
        if v.len() != 4 || v[..3] != k[..3] {
            return Err(Error::Shape {
                what: "values",
                expected: format!("[{}, {}, {}, value_dim]", k[0], k[1], k[2]),
                found: v,
            });
        }
        if values.dtype() != keys.dtype() {
            return Err(Error::Dtype {
                what: "values",
                expected: keys.dtype(),
                found: values.dtype(),
            });
        }
        let shape = KvShape {
            batch: k[0],
            heads: k[1],
            key_dim: k[3],
            value_dim: v[3],
            dtype: keys.dtype(),
        };
        Ok((shape, k[2] as usize))
    }

    /// Errors unless `other` (new input) matches this stored shape.
    pub fn check_same(&self, other: &KvShape, what: &'static str) -> Result<()> {
        if self.dtype != other.dtype {
            return Err(Error::Dtype {
                what,
                expected: self.dtype,
                found: other.dtype,
            });
        }
        if (self.batch, self.heads, self.key_dim, self.value_dim)
            != (other.batch, other.heads, other.key_dim, other.value_dim)
        {
            return Err(Error::Shape {
                what,
                expected: format!(
                    "[{}, {}, tokens, {}] keys and [.., {}] values, as the cache holds",
                    self.batch, self.heads, self.key_dim, self.value_dim
                ),
                found: vec![other.batch, other.heads, -1, other.key_dim],
            });
        }
        Ok(())
    }

    /// Zeroed key and value buffers of `slots` tokens.
    pub fn zeros(&self, slots: usize) -> Result<(Array, Array)> {
        let slots = dim(slots, "cache capacity")?;
        let keys = Array::zeros(&[self.batch, self.heads, slots, self.key_dim], self.dtype)?;
        let values = Array::zeros(&[self.batch, self.heads, slots, self.value_dim], self.dtype)?;
        Ok((keys, values))
    }
}

/// The token axis of `[batch, heads, tokens, dim]` arrays.
pub(crate) const TOKENS: i32 = 2;

/// Overwrites tokens `at..at + update_len` of `buffer` with `update`.
pub(crate) fn write_tokens(buffer: &Array, update: &Array, at: usize) -> Result<Array> {
    let shape = buffer.shape();
    let len = update.dim(TOKENS)?;
    let start = dim(at, "write offset")?;
    let spec = mlx::SliceSpec::along(&shape, TOKENS as usize, start, start + len);
    Ok(buffer.slice_update(update, &spec)?)
}
