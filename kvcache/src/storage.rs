//! How an attention cache stores keys and values: in a float dtype, or quantized to 8 bits.
//!
//! A quantized cache keeps one byte array per tensor, `[batch, heads, tokens, 5 · dim / 4]`:
//! each token's row is its `dim` 8-bit codes, then an f32 scale per group of [`Q8_GROUP`]
//! elements, then an f32 bias per group, all as bytes. One array per tensor, with the token
//! axis where a float cache has it, means the buffers, lazy snapshots, rewinds, gathers and the
//! prefix trie's merges and splits handle a quantized cache exactly as a float one: every one of
//! them only cuts and joins along the token axis. Attention reads the rows (the CPU kernel) or
//! their dequantization ([`KvHistory::floats`]).

use mlx::{Array, Dtype, QuantSpec, concatenate};

use crate::error::{Error, Result};
use crate::mask::KvHistory;

/// Elements sharing one scale and bias in a quantized cache (llama.cpp's `q8_0` block size).
pub const Q8_GROUP: i32 = 32;

/// Bytes of one group's scale or bias (f32).
const PARAM_BYTES: i32 = 4;

/// How an attention cache stores keys and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvStorage {
    /// As floats of this dtype (f32, f16 or bf16); the history comes back in it.
    Float(Dtype),
    /// Affine 8-bit codes with an f32 scale and bias per [`Q8_GROUP`] elements: 1.25 bytes
    /// an element against f16's 2. The history comes back dequantized, as f32. Head
    /// dimensions must be multiples of [`Q8_GROUP`].
    Q8,
}

impl KvStorage {
    /// Bytes `elements` keys or values take in this form.
    pub fn bytes(self, elements: usize) -> usize {
        match self {
            KvStorage::Float(dtype) => elements.saturating_mul(dtype.size_of()),
            // A byte of code each, and 8 bytes of scale and bias per 32.
            KvStorage::Q8 => elements.saturating_add(elements / 4),
        }
    }
}

impl From<Dtype> for KvStorage {
    fn from(dtype: Dtype) -> KvStorage {
        KvStorage::Float(dtype)
    }
}

impl std::fmt::Display for KvStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvStorage::Float(Dtype::F32) => f.write_str("f32"),
            KvStorage::Float(Dtype::F16) => f.write_str("f16"),
            KvStorage::Float(Dtype::Bf16) => f.write_str("bf16"),
            KvStorage::Float(other) => write!(f, "{other:?}"),
            KvStorage::Q8 => f.write_str("q8"),
        }
    }
}

/// Checks that a cache may take a storage now: only before its first write, so one buffer
/// never holds two formats.
pub(crate) fn check_storage(storage: KvStorage, written: bool, kind: &str) -> Result<()> {
    if written {
        return Err(Error::Config(format!(
            "the {kind} cache's storage is set before its first write"
        )));
    }
    if let KvStorage::Float(dtype) = storage
        && !matches!(dtype, Dtype::F32 | Dtype::F16 | Dtype::Bf16)
    {
        return Err(Error::Config(format!(
            "a {kind} cache stores keys and values as f32, f16, bf16 or q8, not {dtype:?}"
        )));
    }
    Ok(())
}

/// `keys` and `values` in the form a cache stores them in: as given without a storage. Input
/// already quantized (a quantized cache's snapshot) is kept or dequantized as the storage asks.
pub(crate) fn stored_as(
    storage: Option<KvStorage>,
    keys: &Array,
    values: &Array,
) -> Result<(Array, Array)> {
    let encoded = is_quantized(keys) || is_quantized(values);
    match storage {
        Some(KvStorage::Q8) if encoded => Ok((keys.clone(), values.clone())),
        Some(KvStorage::Q8) => {
            if keys.dtype() != values.dtype() {
                return Err(Error::Dtype {
                    what: "values",
                    expected: keys.dtype(),
                    found: values.dtype(),
                });
            }
            Ok((quantize(keys, "keys")?, quantize(values, "values")?))
        }
        Some(KvStorage::Float(dtype)) => {
            let (keys, values) = attendable(keys, values)?;
            if keys.dtype() == dtype && values.dtype() == dtype {
                return Ok((keys, values));
            }
            Ok((keys.astype(dtype)?, values.astype(dtype)?))
        }
        None => attendable(keys, values),
    }
}

impl KvHistory {
    /// The keys and values as floats: an 8-bit cache's rows dequantized (as f32, lazily: only
    /// a path that cannot read the rows builds this), float ones as they are.
    pub fn floats(&self) -> Result<(Array, Array)> {
        attendable(&self.keys, &self.values)
    }
}

/// Stored keys and values in the form attention reads: quantized ones dequantized (as f32),
/// float ones as they are.
pub(crate) fn attendable(keys: &Array, values: &Array) -> Result<(Array, Array)> {
    let keys = if is_quantized(keys) {
        dequantize(keys, "keys")?
    } else {
        keys.clone()
    };
    let values = if is_quantized(values) {
        dequantize(values, "values")?
    } else {
        values.clone()
    };
    Ok((keys, values))
}

/// Whether `array` is a quantized cache's byte form (no model hands a cache bytes).
fn is_quantized(array: &Array) -> bool {
    array.dtype() == Dtype::U8
}

/// `x` `[.., dim]` as byte rows of codes, scales and biases (see the module documentation).
fn quantize(x: &Array, what: &'static str) -> Result<Array> {
    let shape = x.shape();
    let dim = shape.last().copied().unwrap_or(0);
    if shape.len() < 2 || dim % Q8_GROUP != 0 {
        return Err(Error::Config(format!(
            "an 8-bit cache quantizes {what} in groups of {Q8_GROUP}, and their last dimension \
             is {dim} (shape {shape:?}); use a float KV cache for this model"
        )));
    }
    // Scales and biases in f32 whatever the compute dtype: they are a tenth of the bytes, and
    // f16 scales would add their own rounding to the codes'.
    let x = match x.dtype() {
        Dtype::F32 => x.clone(),
        _ => x.astype(Dtype::F32)?,
    };
    let quantized = mlx::quantized::quantize(&x, QuantSpec::affine(Q8_GROUP, 8))?;
    let Some(biases) = quantized.biases else {
        return Err(Error::Config(
            "affine quantization returned no biases".into(),
        ));
    };
    Ok(concatenate(
        &[
            quantized.weights.view_as(Dtype::U8)?,
            quantized.scales.view_as(Dtype::U8)?,
            biases.view_as(Dtype::U8)?,
        ],
        -1,
    )?)
}

/// The f32 values of byte rows made by [`quantize`].
fn dequantize(bytes: &Array, what: &'static str) -> Result<Array> {
    let row = bytes.shape().last().copied().unwrap_or(0);
    // A row is dim codes and 2 · 4 bytes per group of 32: 5 · dim / 4 bytes.
    let groups_bytes = PARAM_BYTES * (row / (Q8_GROUP + 2 * PARAM_BYTES));
    let dim = row - 2 * groups_bytes;
    if row == 0 || row % (Q8_GROUP + 2 * PARAM_BYTES) != 0 {
        return Err(Error::Config(format!(
            "{what} of {row} bytes a token are not an 8-bit cache's rows"
        )));
    }
    let codes = bytes.slice_axis(-1, 0, dim)?.view_as(Dtype::U32)?;
    let scales = bytes
        .slice_axis(-1, dim, dim + groups_bytes)?
        .view_as(Dtype::F32)?;
    let biases = bytes
        .slice_axis(-1, dim + groups_bytes, row)?
        .view_as(Dtype::F32)?;
    let quantized = mlx::Quantized {
        weights: codes,
        scales,
        biases: Some(biases),
        spec: QuantSpec::affine(Q8_GROUP, 8),
    };
    Ok(quantized.dequantize(Some(Dtype::F32))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_within_a_step_of_their_group() {
        let x = Array::arange(-64.0, 64.0, 0.37, Dtype::F32)
            .unwrap()
            .slice_axis(0, 0, 4 * 64)
            .unwrap()
            .reshape(&[1, 2, 2, 64])
            .unwrap();
        let bytes = quantize(&x, "keys").unwrap();
        assert_eq!(bytes.shape(), vec![1, 2, 2, 80]);
        assert_eq!(
            KvStorage::Q8.bytes(64),
            80,
            "the budget counts what is stored"
        );
        let back = dequantize(&bytes, "keys").unwrap();
        let (x, back) = (x.to_vec::<f32>().unwrap(), back.to_vec::<f32>().unwrap());
        for (group, (a, b)) in x.chunks(32).zip(back.chunks(32)).enumerate() {
            let (lo, hi) = a
                .iter()
                .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
            // 255 steps span the group. MLX puts the largest-magnitude element exactly on a
            // code, which can leave the far end up to a step outside the grid: one step, plus
            // f32 rounding of the scale and bias arithmetic.
            let bound = (hi - lo) / 255.0 * 1.01 + 1e-5;
            for (u, v) in a.iter().zip(b) {
                assert!((u - v).abs() <= bound, "group {group}: {u} came back {v}");
            }
        }
    }

    #[test]
    fn dimensions_that_do_not_group_are_errors() {
        let x = Array::ones(&[1, 1, 3, 40], Dtype::F32).unwrap();
        let err = stored_as(Some(KvStorage::Q8), &x, &x)
            .unwrap_err()
            .to_string();
        assert!(err.contains("groups of 32") && err.contains("40"), "{err}");
        let bytes = Array::ones(&[1, 1, 3, 41], Dtype::U8).unwrap();
        let err = attendable(&bytes, &bytes).unwrap_err().to_string();
        assert!(err.contains("41 bytes"), "{err}");
    }
}
