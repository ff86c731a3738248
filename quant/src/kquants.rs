//! The k-quant block formats (Q2_K … Q6_K): 256-element super-blocks whose groups carry
//! scales (and mins) quantized against one or two f16 super-scales.
//!
//! Each decoder writes the integers and the per-group map of `block_group::Group`, walking
//! the block in the same order as GGML's `dequantize_row_*` loops.

use crate::block_group::{Group, f16_at};

/// Q2_K: `scales[16]` (low nibble scale, high nibble min), `qs[64]`, `d`, `dmin`.
/// Groups of 16; element `32·j + l` (per 128-element half) is 2 bits at shift `2·j`.
pub(crate) fn q2_k(block: &[u8], q: &mut [u8], groups: &mut [Group]) {
    let scales = &block[0..16];
    let qs = &block[16..80];
    let d = f16_at(block, 80);
    let dmin = f16_at(block, 82);
    let mut element = 0;
    let mut group = 0;
    for half in 0..2 {
        let qs = &qs[32 * half..32 * half + 32];
        for shift in [0u32, 2, 4, 6] {
            for offset in [0, 16] {
                let sc = scales[group];
                groups[group] =
                    Group::with_min(d * f32::from(sc & 0x0f), -(dmin * f32::from(sc >> 4)));
                group += 1;
                for l in 0..16 {
                    q[element] = (qs[offset + l] >> shift) & 3;
                    element += 1;
                }
            }
        }
    }
}

/// Q3_K: `hmask[32]` (third bits), `qs[64]` (low two bits), `scales[12]` (sixteen 6-bit
/// scales, offset by 32), `d`. Groups of 16; `w = d · (scale − 32) · (q − 4)`.
pub(crate) fn q3_k(block: &[u8], q: &mut [u8], groups: &mut [Group]) {
    let hmask = &block[0..32];
    let qs = &block[32..96];
    let packed = &block[96..108];
    let d = f16_at(block, 108);
    let scales = unpack_q3_k_scales(packed);
    let mut element = 0;
    let mut group = 0;
    let mut high_bit = 1u8;
    for half in 0..2 {
        let qs = &qs[32 * half..32 * half + 32];
        for shift in [0u32, 2, 4, 6] {
            for offset in [0, 16] {
                let scale = d * f32::from(i16::from(scales[group]) - 32);
                groups[group] = Group::symmetric(scale, 4.0);
                group += 1;
                for l in 0..16 {
                    let low = (qs[offset + l] >> shift) & 3;
                    let high = if hmask[offset + l] & high_bit != 0 {
                        4
                    } else {
                        0
                    };
                    q[element] = low | high;
                    element += 1;
                }
            }
            high_bit = high_bit.wrapping_shl(1);
        }
    }
}

/// Sixteen 6-bit scales from 12 bytes: the low nibbles of bytes 0..8 (scales 0..8) and their
/// high nibbles (scales 8..16), with the two top bits of each in bytes 8..12.
fn unpack_q3_k_scales(packed: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, value) in out.iter_mut().enumerate() {
        let low = if i < 8 {
            packed[i] & 0x0f
        } else {
            packed[i - 8] >> 4
        };
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        *value = low | (high << 4);
    }
    out
}

/// The 6-bit scale and min of group `j` (0..8) of a Q4_K/Q5_K block.
fn scale_min_k4(j: usize, scales: &[u8]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

fn k4_groups(block: &[u8], groups: &mut [Group]) {
    let d = f16_at(block, 0);
    let dmin = f16_at(block, 2);
    let scales = &block[4..16];
    for (j, group) in groups.iter_mut().enumerate().take(8) {
        let (sc, m) = scale_min_k4(j, scales);
        *group = Group::with_min(d * f32::from(sc), -(dmin * f32::from(m)));
    }
}

/// Q4_K: `d`, `dmin`, `scales[12]`, `qs[128]`. Groups of 32; each 32 bytes of `qs` hold two
/// groups, the first in the low nibbles.
pub(crate) fn q4_k(block: &[u8], q: &mut [u8], groups: &mut [Group]) {
    k4_groups(block, groups);
    let qs = &block[16..144];
    for chunk in 0..4 {
        for l in 0..32 {
            let byte = qs[32 * chunk + l];
            q[64 * chunk + l] = byte & 0x0f;
            q[64 * chunk + 32 + l] = byte >> 4;
        }
    }
}

/// Q5_K: Q4_K plus `qh[32]`, whose bit `2·chunk` (low group) and `2·chunk + 1` (high group)
/// hold each element's fifth bit.
pub(crate) fn q5_k(block: &[u8], q: &mut [u8], groups: &mut [Group]) {
    k4_groups(block, groups);
    let qh = &block[16..48];
    let qs = &block[48..176];
    for chunk in 0..4 {
        for l in 0..32 {
            let byte = qs[32 * chunk + l];
            let low_high = ((qh[l] >> (2 * chunk)) & 1) << 4;
            let high_high = ((qh[l] >> (2 * chunk + 1)) & 1) << 4;
            q[64 * chunk + l] = (byte & 0x0f) | low_high;
            q[64 * chunk + 32 + l] = (byte >> 4) | high_high;
        }
    }
}

/// Q6_K: `ql[128]` (low four bits), `qh[64]` (high two bits), `scales[16]` (signed), `d`.
/// Groups of 16; `w = d · scale · (q − 32)`.
pub(crate) fn q6_k(block: &[u8], q: &mut [u8], groups: &mut [Group]) {
    let ql = &block[0..128];
    let qh = &block[128..192];
    let scales = &block[192..208];
    let d = f16_at(block, 208);
    for (group, &sc) in groups.iter_mut().zip(scales) {
        *group = Group::symmetric(d * f32::from(sc as i8), 32.0);
    }
    for half in 0..2 {
        let ql = &ql[64 * half..64 * half + 64];
        let qh = &qh[32 * half..32 * half + 32];
        let q = &mut q[128 * half..128 * half + 128];
        for l in 0..32 {
            q[l] = (ql[l] & 0x0f) | ((qh[l] & 3) << 4);
            q[l + 32] = (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4);
            q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
}
