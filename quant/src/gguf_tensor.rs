//! GGUF tensor data turned into MLX tensors.
//!
//! Plain element types pass through. Block types whose groups are 32 elements wide (Q4_0,
//! Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K) are repacked into MLX's affine layout without
//! dequantizing: the integers go into little-endian `u32` bit streams, each group's map into
//! an f32 scale and bias (f32 so the biases `−8·d`, `d·sc` … are exact; call
//! `Tensor::to_dtype` for the compute dtype). Types with 16-element groups (Q2_K, Q3_K, Q6_K)
//! have no MLX equivalent and are dequantized into dense f32.

use mlx::quantized::{QuantSpec, Quantized};
use mlx::{Array, Dtype};

use crate::GgmlType;
use crate::block_formats::{BlockShape, block_shape, decode_block};
use crate::block_group::Group;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// The MLX array of a plain (not block-quantized) GGML type.
fn plain_dtype(ty: GgmlType) -> Option<Dtype> {
    use GgmlType::*;
    Some(match ty {
        F32 => Dtype::F32,
        F16 => Dtype::F16,
        Bf16 => Dtype::Bf16,
        F64 => Dtype::F64,
        I8 => Dtype::I8,
        I16 => Dtype::I16,
        I32 => Dtype::I32,
        I64 => Dtype::I64,
        _ => return None,
    })
}

/// Whether tensors of `ty` load as MLX affine-quantized matrices (rather than dense).
pub fn maps_to_mlx_affine(ty: GgmlType) -> bool {
    block_shape(ty).is_some_and(|s| s.group_size == 32)
}

/// The MLX layout [`gguf_tensor`] repacks a block type into, or for 16-element types the
/// layout of their packed form ([`PACKED_16`]); `None` for plain element types.
pub(crate) fn loaded_spec(ty: GgmlType) -> Option<QuantSpec> {
    let layout = block_shape(ty)?;
    Some(if layout.group_size == 32 {
        QuantSpec::affine(32, layout.bits as i32)
    } else {
        PACKED_16
    })
}

/// Turns the raw data of tensor `name` (`shape` outermost first) into a [`Tensor`].
pub fn gguf_tensor(name: &str, ty: GgmlType, shape: &[i32], bytes: &[u8]) -> Result<Tensor> {
    if let Some(dtype) = plain_dtype(ty) {
        return Ok(Tensor::Dense(Array::from_bytes(bytes, shape, dtype)?));
    }
    let Some(layout) = block_shape(ty) else {
        return Err(Error::Unsupported {
            name: name.to_string(),
            what: format!("GGML type {ty} is not supported"),
        });
    };
    check_length(name, ty, layout, bytes)?;
    check_shape(name, ty, layout, shape, bytes)?;
    if layout.group_size == 32 {
        Ok(Tensor::Quantized(repack_affine(
            ty,
            layout,
            shape,
            bytes,
            layout.bits,
        )?))
    } else {
        let values = dequantize_blocks(ty, layout, bytes);
        Ok(Tensor::Dense(Array::from_slice(&values, shape)?))
    }
}

/// The packed form of a GGUF tensor whose groups are 16 elements wide (Q2_K, Q3_K, Q6_K), for
/// mlxkit's packed CPU matvec: the same integers widened to a byte each, and each group's map
/// as an f32 scale and bias, so it stands for exactly the values [`gguf_tensor`] dequantizes
/// to. MLX's own kernels take no 16-element groups, so only decode-sized products may read it
/// (see `mlx::quantized::QuantSpec::has_packed_cpu_matvec`). `None` for every other type.
pub fn gguf_packed_16(
    name: &str,
    ty: GgmlType,
    shape: &[i32],
    bytes: &[u8],
) -> Result<Option<Quantized>> {
    let Some(layout) = block_shape(ty).filter(|l| l.group_size == 16) else {
        return Ok(None);
    };
    check_length(name, ty, layout, bytes)?;
    check_shape(name, ty, layout, shape, bytes)?;
    repack_affine(ty, layout, shape, bytes, 8).map(Some)
}

/// The layout of [`gguf_packed_16`]'s forms: affine, 16-element groups, a byte per integer.
/// MLX's kernels take no such groups, so a checkpoint holding one (a GGUF converted by
/// `create`) loads it dense through [`dequantize_packed_16`] and keeps it for the packed matvec.
pub const PACKED_16: QuantSpec = QuantSpec {
    group_size: 16,
    bits: 8,
    mode: mlx::quantized::QuantMode::Affine,
};

/// The dense f32 values of a [`PACKED_16`] matrix, bit for bit the values [`gguf_tensor`]
/// dequantizes its GGUF blocks to. Each is `q·scale + bias` rounded once (a fused
/// multiply-add): for the symmetric types (Q3_K, Q6_K) `bias = −zero·scale` exactly, so that
/// is GGML's `(q − zero)·scale`; for Q2_K `q·scale` is exact (at most 17 significant bits), so
/// it equals GGML's `scale·q + min`.
pub fn dequantize_packed_16(name: &str, q: &Quantized) -> Result<Array> {
    let bad = |what: String| Error::Unsupported {
        name: name.to_string(),
        what,
    };
    if q.spec != PACKED_16 {
        return Err(bad(format!(
            "{:?} is not the 16-element packed layout",
            q.spec
        )));
    }
    let biases = q
        .biases
        .as_ref()
        .ok_or_else(|| bad("affine weights without biases".into()))?;
    let f32_of = |a: &Array| -> Result<Vec<f32>> { Ok(a.astype(Dtype::F32)?.to_vec::<f32>()?) };
    let (scales, biases) = (f32_of(&q.scales)?, f32_of(biases)?);
    let words = q.weights.to_vec::<u32>()?;
    let group = PACKED_16.group_size as usize;
    if scales.len() != biases.len() || words.len() * 4 != scales.len() * group {
        return Err(bad(format!(
            "{} packed words do not match {} scales and {} biases",
            words.len(),
            scales.len(),
            biases.len()
        )));
    }
    let mut values = Vec::with_capacity(words.len() * 4);
    for ((words, &scale), &bias) in words.chunks_exact(group / 4).zip(&scales).zip(&biases) {
        for byte in words.iter().flat_map(|w| w.to_le_bytes()) {
            values.push(f32::from(byte).mul_add(scale, bias));
        }
    }
    let mut shape = q.weights.shape();
    if let Some(last) = shape.last_mut() {
        *last *= 4;
    }
    Ok(Array::from_slice(&values, &shape)?)
}

/// Dequantizes GGML data of type `ty` into f32, exactly as GGML's reference code does.
/// `bytes` must be a whole number of blocks.
pub fn dequantize(name: &str, ty: GgmlType, bytes: &[u8]) -> Result<Vec<f32>> {
    if let Some(layout) = block_shape(ty) {
        check_length(name, ty, layout, bytes)?;
        return Ok(dequantize_blocks(ty, layout, bytes));
    }
    let element_bytes = ty.block_layout().map_or(1, |(_, b)| b as usize);
    if !bytes.len().is_multiple_of(element_bytes) {
        return Err(Error::Unsupported {
            name: name.to_string(),
            what: format!("{} bytes are not whole {ty} elements", bytes.len()),
        });
    }
    let words = |size: usize| bytes.chunks_exact(size);
    let unsupported = || Error::Unsupported {
        name: name.to_string(),
        what: format!("cannot dequantize GGML type {ty}"),
    };
    Ok(match ty {
        GgmlType::F32 => words(4)
            .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect(),
        GgmlType::F16 => words(2)
            .map(|w| half::f16::from_le_bytes([w[0], w[1]]).to_f32())
            .collect(),
        GgmlType::Bf16 => words(2)
            .map(|w| half::bf16::from_le_bytes([w[0], w[1]]).to_f32())
            .collect(),
        _ => return Err(unsupported()),
    })
}

fn check_length(name: &str, ty: GgmlType, layout: BlockShape, bytes: &[u8]) -> Result<()> {
    if !bytes.len().is_multiple_of(layout.block_bytes) {
        return Err(Error::Unsupported {
            name: name.to_string(),
            what: format!(
                "{} bytes are not a whole number of {ty} blocks of {}",
                bytes.len(),
                layout.block_bytes
            ),
        });
    }
    Ok(())
}

/// The shape must describe exactly the elements `bytes` holds, in rows of whole blocks.
fn check_shape(
    name: &str,
    ty: GgmlType,
    layout: BlockShape,
    shape: &[i32],
    bytes: &[u8],
) -> Result<()> {
    let bad = |what: String| Error::Unsupported {
        name: name.to_string(),
        what,
    };
    let Some(&cols) = shape.last() else {
        return Err(bad("a quantized tensor needs at least one dimension".into()));
    };
    let elements = shape.iter().try_fold(1usize, |acc, &d| {
        usize::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    });
    let held = bytes.len() / layout.block_bytes * layout.block_elements;
    if elements != Some(held) {
        return Err(bad(format!(
            "shape {shape:?} does not match {held} {ty} elements"
        )));
    }
    if !(cols as usize).is_multiple_of(layout.block_elements) {
        return Err(bad(format!(
            "rows of {cols} elements are not whole {ty} blocks of {}",
            layout.block_elements
        )));
    }
    Ok(())
}

fn dequantize_blocks(ty: GgmlType, layout: BlockShape, bytes: &[u8]) -> Vec<f32> {
    let blocks = bytes.len() / layout.block_bytes;
    let mut out = Vec::with_capacity(blocks * layout.block_elements);
    let mut q = vec![0u8; layout.block_elements];
    let mut groups = vec![Group::default(); layout.block_elements / layout.group_size];
    for block in bytes.chunks_exact(layout.block_bytes) {
        decode_block(ty, block, &mut q, &mut groups);
        for (chunk, group) in q.chunks_exact(layout.group_size).zip(&groups) {
            out.extend(chunk.iter().map(|&v| group.value(v)));
        }
    }
    out
}

/// GGUF blocks as an MLX affine matrix of `bits`-bit integers (`bits` ≥ the type's own).
fn repack_affine(
    ty: GgmlType,
    layout: BlockShape,
    shape: &[i32],
    bytes: &[u8],
    bits: u32,
) -> Result<Quantized> {
    let blocks = bytes.len() / layout.block_bytes;
    let groups_per_block = layout.block_elements / layout.group_size;
    let words_per_block = layout.block_elements * bits as usize / 32;
    let mut words = Vec::with_capacity(blocks * words_per_block);
    let mut scales = Vec::with_capacity(blocks * groups_per_block);
    let mut biases = Vec::with_capacity(blocks * groups_per_block);
    let mut q = vec![0u8; layout.block_elements];
    let mut groups = vec![Group::default(); groups_per_block];
    for block in bytes.chunks_exact(layout.block_bytes) {
        decode_block(ty, block, &mut q, &mut groups);
        pack_bits(&q, bits, &mut words);
        for group in &groups {
            scales.push(group.scale);
            biases.push(group.mlx_bias());
        }
    }
    let (&cols, outer) = shape
        .split_last()
        .unwrap_or_else(|| unreachable!("check_shape refuses empty shapes"));
    let group = layout.group_size as i32;
    let with_last = |last: i32| -> Vec<i32> { outer.iter().copied().chain([last]).collect() };
    Ok(Quantized {
        weights: Array::from_slice(&words, &with_last(cols / 32 * bits as i32))?,
        scales: Array::from_slice(&scales, &with_last(cols / group))?,
        biases: Some(Array::from_slice(&biases, &with_last(cols / group))?),
        spec: QuantSpec::affine(group, bits as i32),
    })
}

/// Appends `values` (each `< 2^bits`) to `out` as MLX packs them: one little-endian bit
/// stream, value `i` at bits `i·bits ..`, cut into `u32` words. `values.len() · bits` must be
/// a multiple of 32.
pub(crate) fn pack_bits(values: &[u8], bits: u32, out: &mut Vec<u32>) {
    // Whole bytes and nibbles never straddle words: pack them word by word (most GGUF
    // weights are 4- or 8-bit, and this is the hot loop of loading them).
    match bits {
        8 => {
            out.extend(
                values
                    .chunks_exact(4)
                    .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])),
            );
            return;
        }
        4 => {
            out.extend(values.chunks_exact(8).map(|w| {
                w.iter()
                    .rev()
                    .fold(0u32, |word, &v| (word << 4) | u32::from(v))
            }));
            return;
        }
        _ => {}
    }
    let mut buffer: u64 = 0;
    let mut filled = 0u32;
    for &v in values {
        buffer |= u64::from(v) << filled;
        filled += bits;
        if filled >= 32 {
            out.push(buffer as u32);
            buffer >>= 32;
            filled -= 32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_that_disagree_with_the_data_are_refused() {
        let blocks = vec![0u8; 2 * 18];
        for shape in [&[][..], &[3, 32], &[1, 64, 2], &[4, 16], &[-2, -32]] {
            let err = gguf_tensor("t", GgmlType::Q4_0, shape, &blocks).unwrap_err();
            assert!(err.to_string().contains("\"t\""), "{shape:?}: {err}");
        }
        assert!(gguf_tensor("t", GgmlType::Q4_0, &[2, 32], &blocks).is_ok());
        assert!(dequantize("t", GgmlType::F32, &[0; 6]).is_err());
    }

    #[test]
    fn pack_bits_is_a_little_endian_stream() {
        let mut out = Vec::new();
        pack_bits(&[1, 2, 3, 4, 5, 6, 7, 8], 4, &mut out);
        assert_eq!(out, vec![0x8765_4321]);
        let mut out = Vec::new();
        let values: Vec<u8> = (0..32).map(|i| (i % 32) as u8).collect();
        pack_bits(&values, 5, &mut out);
        assert_eq!(out.len(), 5);
        // Value 1 sits at bits 5..10, value 6 straddles the first two words (bits 30..35).
        assert_eq!((out[0] >> 5) & 31, 1);
        assert_eq!((out[0] >> 30) | ((out[1] & 0b111) << 2), 6);
    }
}
