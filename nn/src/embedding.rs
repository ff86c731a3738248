//! `Embedding`: token ids to vectors, and the same table as a tied output head.

use mlx::Array;
use mlx::quantized::Quantized;

use crate::Result;
use crate::linear::{Linear, Tensor};
use crate::weights::Weights;

/// A `[vocab, dim]` lookup table, dense or quantized.
#[derive(Debug, Clone)]
pub struct Embedding {
    table: Tensor,
}

impl Embedding {
    /// A dense table.
    pub fn dense(table: Array) -> Embedding {
        Embedding::new(Tensor::Dense(table))
    }

    /// A quantized table: rows are gathered packed and dequantized after the gather.
    pub fn quantized(table: Quantized) -> Embedding {
        Embedding::new(Tensor::Quantized(table))
    }

    /// A table from a weight of either kind.
    pub fn new(table: Tensor) -> Embedding {
        Embedding { table }
    }

    /// The table in its packed form, when the checkpoint has one (see [`Linear::with_packed`]),
    /// in place of the dense one: lookups gather packed rows and dequantize only those, and a
    /// tied head multiplies the packed matrix at every batch size (its kernel takes any number
    /// of rows, and a head sees few: the last position of each sequence, or a speculative
    /// round's). Keeping the dense table as well cost 4 bytes per entry for nothing but a
    /// prompt's lookups: 113 MB in SmolLM2 135M, 671 MB in Gemma 3 270M, the largest
    /// allocation of either.
    pub fn with_packed(self, packed: Option<Quantized>) -> Embedding {
        match packed {
            Some(packed) => Embedding::quantized(packed),
            None => self,
        }
    }

    /// Looks up `ids` (any shape of integers) → `ids.shape + [dim]`, in `dtype` for dense
    /// tables converted on load and in the scales' dtype for quantized ones.
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match &self.table {
            Tensor::Dense(t) => Ok(t.take(ids, 0)?),
            Tensor::Quantized(q) => {
                let rows = Quantized {
                    weights: q.weights.take(ids, 0)?,
                    scales: q.scales.take(ids, 0)?,
                    biases: q.biases.as_ref().map(|b| b.take(ids, 0)).transpose()?,
                    spec: q.spec,
                };
                Ok(rows.dequantize(None)?)
            }
            Tensor::KBlocks(k) => Ok(k.rows(ids)?),
        }
    }

    /// Appends the table's arrays to `out`.
    pub fn collect_arrays(&self, out: &mut Vec<Array>) {
        crate::linear::tensor_arrays(&self.table, out);
    }

    /// The table used as an output projection (`x Eᵀ`), for tied heads.
    pub fn as_linear(&self) -> Linear {
        Linear::new(self.table.clone(), None)
    }

    /// The output head: this table when `tie` says so (or, when the config is silent, when the
    /// checkpoint has no `{head}.weight`), else the checkpoint's `head` `[vocab, hidden]`.
    pub fn output_head(
        &self,
        weights: &mut Weights,
        tie: Option<bool>,
        head: &str,
        vocab: i32,
        hidden: i32,
    ) -> Result<Linear> {
        let tied = tie.unwrap_or(!weights.contains(&format!("{head}.weight")));
        if tied {
            Ok(self.as_linear())
        } else {
            weights.linear(head, vocab, hidden)
        }
    }
}
