//! Widening affine-quantized matrices to 8 bits, exactly.
//!
//! A value `q` of `b < 8` bits is also a valid 8-bit value, so repacking the integers one per
//! byte and keeping every scale and bias represents the same matrix. Kernels that read only
//! 4- and 8-bit layouts (mlxkit's packed CPU matvec) can then use 5- and 6-bit weights (GGUF
//! Q5_0, Q5_1, Q5_K), at 8 bits of memory each.

use mlx::Array;
use mlx::quantized::{QuantMode, QuantSpec, Quantized};

use crate::gguf_tensor::pack_bits;
use crate::{Error, Result};

/// `q` with its integers repacked at 8 bits; an 8-bit matrix comes back unchanged.
pub fn widen_to_8_bits(q: &Quantized) -> Result<Quantized> {
    let QuantSpec {
        group_size,
        bits,
        mode,
    } = q.spec;
    if bits == 8 {
        return Ok(q.clone());
    }
    if mode != QuantMode::Affine || !(1..8).contains(&bits) {
        return Err(Error::Unsupported {
            name: "quantized matrix".into(),
            what: format!("cannot widen {mode:?} {bits}-bit weights to 8 bits"),
        });
    }
    let words = q.weights.to_vec::<u32>()?;
    let values = unpack_bits(&words, bits as u32);
    let mut packed = Vec::with_capacity(values.len() / 4);
    pack_bits(&values, 8, &mut packed);
    let mut shape = q.weights.shape();
    if let Some(last) = shape.last_mut() {
        *last = *last * 32 / bits / 4;
    }
    Ok(Quantized {
        weights: Array::from_slice(&packed, &shape)?,
        scales: q.scales.clone(),
        biases: q.biases.clone(),
        spec: QuantSpec::affine(group_size, 8),
    })
}

/// The values of a little-endian bit stream of `bits`-bit integers held in `words`.
fn unpack_bits(words: &[u32], bits: u32) -> Vec<u8> {
    let mask = (1u64 << bits) - 1;
    let mut out = Vec::with_capacity(words.len() * 32 / bits as usize);
    let mut buffer: u64 = 0;
    let mut filled = 0u32;
    for &word in words {
        buffer |= u64::from(word) << filled;
        filled += 32;
        while filled >= bits {
            out.push((buffer & mask) as u8);
            buffer >>= bits;
            filled -= bits;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpack_inverts_pack_for_every_width() {
        for bits in 1..=8u32 {
            let values: Vec<u8> = (0..64u32)
                .map(|i| ((i * 7 + 3) % (1 << bits)) as u8)
                .collect();
            let mut words = Vec::new();
            pack_bits(&values, bits, &mut words);
            assert_eq!(unpack_bits(&words, bits), values, "{bits} bits");
        }
    }

    #[test]
    fn widened_matrices_dequantize_to_the_same_values() {
        let w: Vec<f32> = (0..8 * 64)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let w = Array::from_slice(&w, &[8, 64]).unwrap();
        for bits in [2, 3, 4, 5, 6] {
            let q = mlx::quantized::quantize(&w, QuantSpec::affine(32, bits)).unwrap();
            let wide = widen_to_8_bits(&q).unwrap();
            assert_eq!(wide.spec, QuantSpec::affine(32, 8));
            assert_eq!(wide.weights.shape(), vec![8, 16]);
            let a = q.dequantize(None).unwrap().to_vec::<f32>().unwrap();
            let b = wide.dequantize(None).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(a, b, "{bits} bits");
        }
    }
}
