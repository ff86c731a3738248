//! Grammar token masks: host bitmasks expanded on the device.
//!
//! A mask is llguidance's layout: bit `i % 32` of word `i / 32` set means token `i` is allowed.
//! The host uploads only the words (`V / 32` of them); the device expands them to one boolean
//! per token. MLX has no bit shifts, so bit `k` of a word is `(word mod 2^(k+1)) ≥ 2^k`, in u64
//! so that `2^32` fits.

use mlx::Array;

use crate::ring::to_i32;
use crate::{Error, Result};

/// Words a vocabulary of `vocab` tokens needs.
pub fn mask_words(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

/// Expands one mask per row (`None`: everything allowed) to `[rows, vocab]` booleans.
/// Bits past the vocabulary are ignored; a mask that allows nothing is an error.
pub(crate) fn expand(masks: &[Option<&[u32]>], vocab: usize) -> Result<Array> {
    let needed = mask_words(vocab);
    let mut words = Vec::with_capacity(masks.len() * needed);
    for (row, mask) in masks.iter().enumerate() {
        match mask {
            None => words.extend(std::iter::repeat_n(u64::from(u32::MAX), needed)),
            Some(mask) => {
                if mask.len() < needed {
                    return Err(Error::MaskTooShort {
                        row,
                        words: mask.len(),
                        vocab,
                        needed,
                    });
                }
                let mask = &mask[..needed];
                if !allows_any(mask, vocab) {
                    return Err(Error::MaskEmpty { row });
                }
                words.extend(mask.iter().map(|&w| u64::from(w)));
            }
        }
    }
    let rows = to_i32(masks.len())?;
    let words = Array::from_slice(&words, &[rows, to_i32(needed)?, 1])?;
    let (moduli, thresholds): (Vec<u64>, Vec<u64>) =
        (0..32).map(|k| (2u64 << k, 1u64 << k)).unzip();
    let moduli = Array::from_slice(&moduli, &[32])?;
    let thresholds = Array::from_slice(&thresholds, &[32])?;
    let bits = words.remainder(&moduli)?.greater_equal(&thresholds)?;
    let bits = bits.reshape(&[rows, to_i32(needed * 32)?])?;
    Ok(bits.slice_axis(1, 0, to_i32(vocab)?)?)
}

fn allows_any(mask: &[u32], vocab: usize) -> bool {
    let full = vocab / 32;
    if mask[..full].iter().any(|&w| w != 0) {
        return true;
    }
    let tail = vocab % 32;
    tail > 0 && mask[full] & ((1u32 << tail) - 1) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_expand_to_tokens() {
        let vocab = 70;
        let mut mask = vec![0u32; mask_words(vocab)];
        for t in [0usize, 5, 31, 32, 63, 69] {
            mask[t / 32] |= 1 << (t % 32);
        }
        mask[2] |= 1 << 10; // token 74: past the vocabulary, ignored
        let allowed = expand(&[Some(&mask), None], vocab).unwrap();
        assert_eq!(allowed.shape(), vec![2, 70]);
        let allowed = allowed.to_bools().unwrap();
        let first: Vec<usize> = (0..vocab).filter(|&t| allowed[t]).collect();
        assert_eq!(first, vec![0, 5, 31, 32, 63, 69]);
        assert!(allowed[vocab..].iter().all(|&b| b));
    }

    #[test]
    fn short_and_empty_masks_are_errors() {
        assert!(matches!(
            expand(&[Some(&[1u32])], 40),
            Err(Error::MaskTooShort { needed: 2, .. })
        ));
        // Only a bit past the vocabulary is set.
        assert!(matches!(
            expand(&[Some(&[0u32, 1 << 9])], 40),
            Err(Error::MaskEmpty { row: 0 })
        ));
    }
}
