//! GGUF block formats decoded into integers plus an affine map per group.
//!
//! Every block type GGUF uses for weights stores small unsigned integers `q` and, per group
//! of 16 or 32 elements, a map to real values: `w = scale · (q − zero) + min`. Writing all of
//! them in that one form lets the same decoder serve two purposes: dequantizing (the reference,
//! evaluated exactly as GGML's own loops do, so results match bit for bit) and repacking into
//! MLX's affine layout (`w = scale · q + bias`, with `bias = min − zero · scale`) without
//! dequantizing. The legacy 32-element formats live here; the k-quants in `kquants.rs`.

use crate::GgmlType;
use crate::block_group::{Group, f16_at};
use crate::kquants;

/// How a block type decodes: elements per block and group, bits per integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockShape {
    pub block_elements: usize,
    pub block_bytes: usize,
    pub group_size: usize,
    pub bits: u32,
}

/// The decoded shape of a block-quantized type, or `None` for plain element types.
pub(crate) fn block_shape(ty: GgmlType) -> Option<BlockShape> {
    use GgmlType::*;
    let (group_size, bits) = match ty {
        Q4_0 | Q4_1 => (32, 4),
        Q5_0 | Q5_1 => (32, 5),
        Q8_0 => (32, 8),
        Q2K => (16, 2),
        Q3K => (16, 3),
        Q4K => (32, 4),
        Q5K => (32, 5),
        Q6K => (16, 6),
        _ => return None,
    };
    let (block_elements, block_bytes) = ty.block_layout()?;
    Some(BlockShape {
        block_elements: block_elements as usize,
        block_bytes: block_bytes as usize,
        group_size,
        bits,
    })
}

/// Decodes one block: its integers into `q` (one per element, in element order) and its
/// groups into `groups`. `block`, `q` and `groups` must have the sizes of [`block_shape`].
pub(crate) fn decode_block(ty: GgmlType, block: &[u8], q: &mut [u8], groups: &mut [Group]) {
    use GgmlType::*;
    match ty {
        Q4_0 => q4_0(block, q, groups),
        Q4_1 => q4_1(block, q, groups),
        Q5_0 => q5_0(block, q, groups),
        Q5_1 => q5_1(block, q, groups),
        Q8_0 => q8_0(block, q, groups),
        Q2K => kquants::q2_k(block, q, groups),
        Q3K => kquants::q3_k(block, q, groups),
        Q4K => kquants::q4_k(block, q, groups),
        Q5K => kquants::q5_k(block, q, groups),
        Q6K => kquants::q6_k(block, q, groups),
        _ => unreachable!("decode_block called for non-block type {ty}"),
    }
}

/// Low nibbles are elements 0..16, high nibbles 16..32.
fn nibbles(qs: &[u8], q: &mut [u8]) {
    for (j, &byte) in qs.iter().enumerate().take(16) {
        q[j] = byte & 0x0f;
        q[j + 16] = byte >> 4;
    }
}

fn q4_0(block: &[u8], q: &mut [u8], groups: &mut [Group]) {
    groups[0] = Group::symmetric(f16_at(block, 0), 8.0);
    nibbles(&block[2..18], q);
}

fn q4_1(block: &[u8], q: &mut [u8], groups: &mut [Group]) {
    groups[0] = Group::with_min(f16_at(block, 0), f16_at(block, 2));
    nibbles(&block[4..20], q);
}

/// The fifth bit of element `j` is bit `j` of the little-endian word `qh`.
fn fifth_bits(qh: &[u8], q: &mut [u8]) {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    for (j, value) in q.iter_mut().enumerate().take(32) {
        *value |= (((qh >> j) & 1) as u8) << 4;
    }
}

fn q5_0(block: &[u8], q: &mut [u8], groups: &mut [Group]) {
    groups[0] = Group::symmetric(f16_at(block, 0), 16.0);
    nibbles(&block[6..22], q);
    fifth_bits(&block[2..6], q);
}

fn q5_1(block: &[u8], q: &mut [u8], groups: &mut [Group]) {
    groups[0] = Group::with_min(f16_at(block, 0), f16_at(block, 2));
    nibbles(&block[8..24], q);
    fifth_bits(&block[4..8], q);
}

fn q8_0(block: &[u8], q: &mut [u8], groups: &mut [Group]) {
    groups[0] = Group::symmetric(f16_at(block, 0), 128.0);
    for (value, &byte) in q.iter_mut().zip(&block[2..34]) {
        // Signed byte s becomes s + 128: the same bits with the top one flipped.
        *value = byte ^ 0x80;
    }
}
