//! The Q/K row permutation of llama-family GGUF files, and its inverse.
//!
//! llama.cpp's converter reorders the output rows of `q_proj` and `k_proj` within each head so
//! that rotary embedding can rotate adjacent pairs (`x[2i], x[2i+1]`, "traditional" rope)
//! instead of the halves HF rotates (`x[i], x[i + d/2]`). Undoing it moves whole rows, so a
//! quantized weight stays quantized and bit-identical.

use mlx::Array;

use crate::tensor::Tensor;
use crate::{Error, Result};

/// Whether GGUF files of `architecture` store Q/K rows permuted for traditional rope.
pub fn qk_rows_permuted(architecture: &str) -> bool {
    // llama.cpp's LlamaModel converter (also used for Mistral-style, Mistral 3, Granite and
    // Nemotron-H checkpoints)
    // permutes; Qwen, Gemma and Phi converters keep HF's order.
    matches!(
        architecture,
        "llama"
            | "mistral"
            | "mistral3"
            | "granite"
            | "granitehybrid"
            | "nemotron_h"
            | "nemotron_h_moe"
    )
}

/// For each HF row, the GGUF row that holds it (`rows` rows in heads of `rows / n_heads`).
fn source_rows(rows: i32, n_heads: i32) -> Result<Vec<i32>> {
    if n_heads <= 0 || rows % n_heads != 0 || (rows / n_heads) % 2 != 0 {
        return Err(Error::Config(format!(
            "cannot undo the rope permutation of {rows} rows in {n_heads} heads: \
             heads must split the rows into even-sized parts"
        )));
    }
    let head_dim = rows / n_heads;
    let half = head_dim / 2;
    Ok((0..rows)
        .map(|row| {
            let (head, within) = (row / head_dim, row % head_dim);
            // HF row `j·half + i` of a head sits at GGUF row `2i + j`.
            let (j, i) = (within / half, within % half);
            head * head_dim + 2 * i + j
        })
        .collect())
}

/// Undoes llama.cpp's Q/K permutation on `tensor` (a weight `[rows, cols]`, quantized or
/// not, or a bias `[rows]`), where `n_heads` is the number of query heads for `q_proj` and of
/// key/value heads for `k_proj`.
pub fn unpermute_qk_rows(tensor: &Tensor, n_heads: usize) -> Result<Tensor> {
    let shape = tensor.shape();
    let rows = match shape.as_slice() {
        [rows] | [rows, _] => *rows,
        _ => {
            return Err(Error::Config(format!(
                "the rope permutation applies to matrices and vectors, not shape {shape:?}"
            )));
        }
    };
    let n_heads = i32::try_from(n_heads)
        .map_err(|_| Error::Config(format!("{n_heads} heads is not a head count")))?;
    let indices = source_rows(rows, n_heads)?;
    tensor.take_rows(&Array::from_slice(&indices, &[rows])?)
}

/// Applies llama.cpp's permutation (HF order → GGUF order); the inverse of
/// [`unpermute_qk_rows`], for writers and tests.
pub fn permute_qk_rows(tensor: &Tensor, n_heads: usize) -> Result<Tensor> {
    let rows = tensor.shape().first().copied().unwrap_or(0);
    let n_heads = i32::try_from(n_heads)
        .map_err(|_| Error::Config(format!("{n_heads} heads is not a head count")))?;
    let sources = source_rows(rows, n_heads)?;
    let mut inverse = vec![0i32; sources.len()];
    for (hf_row, &gguf_row) in sources.iter().enumerate() {
        inverse[gguf_row as usize] = hf_row as i32;
    }
    tensor.take_rows(&Array::from_slice(&inverse, &[rows])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_rows_match_the_converter_permutation() {
        // The converter: w.reshape(n_head, 2, d/2/… ).swapaxes(1, 2): GGUF row 2i + j of a head
        // holds HF row j·half + i. One head of 8: GGUF order is HF rows 0,4,1,5,2,6,3,7.
        let sources = source_rows(8, 1).unwrap();
        let mut gguf_order = vec![0; 8];
        for (hf, &g) in sources.iter().enumerate() {
            gguf_order[g as usize] = hf;
        }
        assert_eq!(gguf_order, vec![0, 4, 1, 5, 2, 6, 3, 7]);
        assert_eq!(
            source_rows(16, 2).unwrap()[8..],
            [8, 10, 12, 14, 9, 11, 13, 15]
        );
    }

    #[test]
    fn refuses_odd_heads() {
        assert!(source_rows(12, 5).is_err());
        assert!(source_rows(6, 2).is_err());
        assert!(source_rows(6, 0).is_err());
    }
}
