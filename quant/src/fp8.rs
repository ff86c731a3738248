//! FP8 (E4M3) weights as other quantizers publish them, decoded to f32.
//!
//! Two layouts are read, both a `F8_E4M3` weight with an f32 scale beside it:
//! - HF "fine-grained" FP8 (DeepSeek-V3, Qwen3-FP8; `quant_method: fp8`): `weight_scale_inv`
//!   holds one scale per `weight_block_size` block (128x128 in released models), edge blocks
//!   partial; the name says "inverse" because the quantizer divided by it, so the weight is
//!   the E4M3 value times it;
//! - compressed-tensors FP8 (`format: float-quantized`): `weight_scale` of one scale per tensor,
//!   per output row (`[out, 1]`) or per group of columns (`[out, in / group]`).
//!
//! Each weight is its E4M3 value times its scale, one f32 product, so the result is exactly what
//! the publisher's dequantizer gives in f32.
//!
//! NVFP4 (E2M1 values two per byte, an E4M3 scale per 16, an f32 scale per tensor) is read here
//! too, in NVIDIA ModelOpt's layout (`weight`, `weight_scale`, `weight_scale_2`, multiplied) and
//! compressed-tensors' (`weight_packed`, `weight_scale`, `weight_global_scale`, divided by).

use mlx::Array;

use crate::{Error, Result};

/// The value of an E4M3 (`float8_e4m3fn`) byte: 1 sign, 4 exponent (bias 7), 3 mantissa bits;
/// no infinities, and `S.1111.111` is NaN.
pub fn e4m3_to_f32(byte: u8) -> f32 {
    let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((byte >> 3) & 0xF);
    let mantissa = f32::from(byte & 0x7);
    if exponent == 0xF && byte & 0x7 == 0x7 {
        return f32::NAN;
    }
    if exponent == 0 {
        return sign * mantissa / 8.0 * 2f32.powi(-6);
    }
    sign * (1.0 + mantissa / 8.0) * 2f32.powi(exponent - 7)
}

/// How an FP8 weight's scales map onto it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Scales {
    /// One scale per `rows x cols` block (`weight_scale_inv`).
    Blocks {
        /// Block height.
        rows: usize,
        /// Block width.
        cols: usize,
    },
    /// A scale per tensor, per row or per column group, read from the scale's own shape
    /// (`weight_scale`).
    Shaped,
}

/// Dequantizes a `[rows, cols]` E4M3 matrix with `scales` (f32, shaped `scale_shape`) laid out
/// as `layout` says; errors name `name` when the scales do not fit the weight.
pub fn dequantize_fp8(
    name: &str,
    codes: &[u8],
    shape: &[i32],
    scales: &[f32],
    scale_shape: &[i32],
    layout: Fp8Scales,
) -> Result<Array> {
    let bad = |what: String| Error::Unsupported {
        name: name.to_string(),
        what,
    };
    let (rows, cols) = matrix(name, shape, "FP8")?;
    let dims: Vec<usize> = scale_shape.iter().map(|&d| to_usize(d)).collect();
    // (scale rows, scale columns, rows per scale, columns per scale)
    let (scale_rows, scale_cols, per_row, per_col) = match layout {
        Fp8Scales::Blocks { rows: br, cols: bc } if br > 0 && bc > 0 => {
            (rows.div_ceil(br), cols.div_ceil(bc), br, bc)
        }
        Fp8Scales::Blocks { .. } => return Err(bad("a block size of zero".into())),
        Fp8Scales::Shaped => match dims.as_slice() {
            [] | [1] | [1, 1] => (1, 1, rows.max(1), cols.max(1)),
            [r] | [r, 1] if *r == rows => (rows, 1, 1, cols.max(1)),
            [r, g] if *r == rows && *g > 0 && cols % g == 0 => (rows, *g, 1, cols / g),
            _ => {
                return Err(bad(format!(
                    "scale shape {scale_shape:?} does not fit {shape:?}"
                )));
            }
        },
    };
    if scales.len() != scale_rows * scale_cols
        || (layout != Fp8Scales::Shaped && dims != [scale_rows, scale_cols])
    {
        return Err(bad(format!(
            "scale shape {scale_shape:?} does not fit {shape:?} (expected [{scale_rows}, {scale_cols}])"
        )));
    }
    if codes.len() != rows * cols {
        return Err(bad(format!(
            "{} bytes for an FP8 {shape:?} weight",
            codes.len()
        )));
    }
    let table: Vec<f32> = (0..=255u8).map(e4m3_to_f32).collect();
    let mut values = Vec::with_capacity(codes.len());
    for (r, row) in codes.chunks(cols.max(1)).enumerate() {
        let scale_row = &scales[(r / per_row) * scale_cols..][..scale_cols];
        values.extend(
            row.iter()
                .enumerate()
                .map(|(c, &code)| table[usize::from(code)] * scale_row[c / per_col]),
        );
    }
    Ok(Array::from_slice(&values, shape)?)
}

/// The value of an E2M1 (FP4) code: bit 3 the sign, bits 0-2 index {0, .5, 1, 1.5, 2, 3, 4, 6}.
pub fn e2m1_to_f32(code: u8) -> f32 {
    const MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let magnitude = MAGNITUDES[usize::from(code & 0x7)];
    if code & 0x8 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// How an NVFP4 tensor's per-tensor scale applies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Nvfp4Global {
    /// Multiplied (ModelOpt's `weight_scale_2`).
    Times(f32),
    /// Divided by (compressed-tensors' `weight_global_scale`).
    Over(f32),
}

/// Dequantizes an NVFP4 `[rows, cols]` matrix: `packed` holds two E2M1 codes per byte (element
/// `2i` in the low nibble), `scales` one E4M3 code per 16 elements of a row. Each element is
/// `(e2m1 · e4m3) ∘ global` in f32, in the publishers' order.
pub fn dequantize_nvfp4(
    name: &str,
    packed: &[u8],
    shape: &[i32],
    scales: &[u8],
    global: Nvfp4Global,
) -> Result<Array> {
    let bad = |what: String| Error::Unsupported {
        name: name.to_string(),
        what,
    };
    let (rows, cols) = matrix(name, shape, "NVFP4")?;
    if cols % 16 != 0 || packed.len() * 2 != rows * cols || scales.len() * 16 != rows * cols {
        return Err(bad(format!(
            "{} packed bytes and {} scales do not make an NVFP4 {shape:?} weight",
            packed.len(),
            scales.len()
        )));
    }
    let values: Vec<f32> = (0..rows * cols)
        .map(|i| {
            let code = (packed[i / 2] >> (4 * (i % 2))) & 0xF;
            let scaled = e2m1_to_f32(code) * e4m3_to_f32(scales[i / 16]);
            match global {
                Nvfp4Global::Times(g) => scaled * g,
                Nvfp4Global::Over(g) => scaled / g,
            }
        })
        .collect();
    Ok(Array::from_slice(&values, shape)?)
}

/// The rows and columns of a 2-D `shape`; an error naming `name` otherwise.
fn matrix(name: &str, shape: &[i32], kind: &str) -> Result<(usize, usize)> {
    match shape {
        [rows, cols] => Ok((to_usize(*rows), to_usize(*cols))),
        _ => Err(Error::Unsupported {
            name: name.to_string(),
            what: format!("an {kind} weight of shape {shape:?} is not a matrix"),
        }),
    }
}

fn to_usize(d: i32) -> usize {
    usize::try_from(d).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_decodes_its_landmarks() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0xB8), -1.0);
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert!(e4m3_to_f32(0x7F).is_nan());
    }

    #[test]
    fn block_scales_cover_partial_edge_blocks_and_wrong_shapes_are_named() {
        // A 3x3 matrix of ones with 2x2 blocks: scales [[1, 2], [3, 4]].
        let codes = [0x38u8; 9];
        let a = dequantize_fp8(
            "w",
            &codes,
            &[3, 3],
            &[1.0, 2.0, 3.0, 4.0],
            &[2, 2],
            Fp8Scales::Blocks { rows: 2, cols: 2 },
        )
        .unwrap();
        assert_eq!(
            a.to_vec::<f32>().unwrap(),
            vec![1.0, 1.0, 2.0, 1.0, 1.0, 2.0, 3.0, 3.0, 4.0]
        );
        let err = dequantize_fp8(
            "model.w",
            &codes,
            &[3, 3],
            &[1.0],
            &[1, 1],
            Fp8Scales::Blocks { rows: 2, cols: 2 },
        )
        .unwrap_err();
        assert!(err.to_string().contains("model.w"), "{err}");
        let rows = dequantize_fp8(
            "w",
            &codes,
            &[3, 3],
            &[1.0, 2.0, 3.0],
            &[3, 1],
            Fp8Scales::Shaped,
        )
        .unwrap();
        assert_eq!(rows.to_vec::<f32>().unwrap()[3..6], [2.0, 2.0, 2.0]);
    }
}
