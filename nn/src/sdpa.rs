//! `ScaledDotProduct`: attention of queries over keys and values, `softmax(scale · q kᵀ) v`,
//! optionally with `tanh` soft-capped logits or per-head attention sinks; the step every
//! attention block shares, whatever produced its queries, keys and values.

use mlx::fast::{AttentionMask, RowHistory};
use mlx::{Array, Dtype};

use crate::Result;

/// How queries attend: the logit scale and an optional soft cap.
#[derive(Debug, Clone)]
pub struct ScaledDotProduct {
    /// Multiplier of `q · k` (usually `head_dim^-0.5`).
    pub scale: f32,
    /// `tanh` soft cap of attention logits (Gemma 2).
    pub logit_softcap: Option<f32>,
    /// Per-head sink logits `[heads]` (gpt-oss): one more column in each softmax, attending
    /// to nothing, so a head can put its weight nowhere.
    pub sinks: Option<Array>,
}

impl ScaledDotProduct {
    /// `queries` `[batch, heads, tokens, d]` over `keys` `[batch, kv_heads, history, d]` and
    /// `values` `[batch, kv_heads, history, d_v]` (key/value heads shared by groups of query
    /// heads): `[batch, heads, tokens, d_v]`.
    pub fn attend(
        &self,
        queries: &Array,
        keys: &Array,
        values: &Array,
        mask: AttentionMask<'_>,
    ) -> Result<Array> {
        // A cache may store keys and values in a narrower dtype than the queries (an f16 KV
        // cache under f32 activations); MLX's attention takes one dtype.
        let widened;
        let (keys, values) = if keys.dtype() == queries.dtype() && values.dtype() == queries.dtype()
        {
            (keys, values)
        } else {
            widened = (
                keys.astype(queries.dtype())?,
                values.astype(queries.dtype())?,
            );
            (&widened.0, &widened.1)
        };
        if self.logit_softcap.is_none() && self.sinks.is_none() {
            return Ok(mlx::fast::scaled_dot_product_attention(
                queries, keys, values, self.scale, mask,
            )?);
        }
        self.explicit(queries, keys, values, mask)
    }

    /// Each row's queries over its own history, in one op: `queries` is
    /// `[rows, heads, tokens, head_dim]`, `history[r]` row r's keys and values and whether its
    /// queries see them causally. Each row's result is the same alone as in a batch. `None`
    /// where the kernel does not apply (a GPU, other dtypes); then attend each row with
    /// [`ScaledDotProduct::attend`].
    pub fn attend_rows(
        &self,
        queries: &Array,
        history: &[RowHistory<'_>],
    ) -> Result<Option<Array>> {
        if self.sinks.is_some() {
            return Ok(None);
        }
        Ok(mlx::fast::rows_attention(
            queries,
            history,
            self.scale,
            self.logit_softcap,
        )?)
    }

    /// Attention spelled out, for what the fused kernels cannot do: soft-capped logits
    /// (`cap · tanh(logits / cap)`) and sink columns.
    fn explicit(&self, q: &Array, k: &Array, v: &Array, mask: AttentionMask<'_>) -> Result<Array> {
        let groups = q.dim(1)? / k.dim(1)?.max(1);
        let expand = |a: &Array| -> Result<Array> {
            if groups == 1 {
                return Ok(a.clone());
            }
            let s = a.shape();
            Ok(a.expand_dims(&[2])?
                .broadcast_to(&[s[0], s[1], groups, s[2], s[3]])?
                .reshape(&[s[0], s[1] * groups, s[2], s[3]])?)
        };
        let (k, v) = (expand(k)?, expand(v)?);
        let logits = q.multiply(self.scale)?.matmul(&k.swap_axes(-1, -2)?)?;
        let logits = match self.logit_softcap {
            Some(cap) => logits.divide(cap)?.tanh()?.multiply(cap)?,
            None => logits,
        };
        let (queries, keys) = (logits.dim(-2)?, logits.dim(-1)?);
        let logits = match mask {
            AttentionMask::None => logits,
            AttentionMask::Causal => {
                // Query i sits at position keys − queries + i.
                let rows = Array::arange(0.0, f64::from(queries), 1.0, Dtype::I32)?
                    .add(keys - queries)?
                    .expand_dims(&[1])?;
                let cols =
                    Array::arange(0.0, f64::from(keys), 1.0, Dtype::I32)?.expand_dims(&[0])?;
                cols.less_equal(&rows)?.select(&logits, f32::NEG_INFINITY)?
            }
            AttentionMask::Array(m) if m.dtype() == Dtype::Bool => {
                m.select(&logits, f32::NEG_INFINITY)?
            }
            AttentionMask::Array(m) => logits.add(m)?,
        };
        let logits = logits.astype(Dtype::F32)?;
        let probs = match &self.sinks {
            Some(sinks) => {
                let s = logits.shape();
                let column = sinks
                    .astype(Dtype::F32)?
                    .reshape(&[1, -1, 1, 1])?
                    .broadcast_to(&[s[0], s[1], s[2], 1])?;
                mlx::concatenate(&[logits, column], -1)?
                    .softmax(&[-1], true)?
                    .slice_axis(-1, 0, keys)?
            }
            None => logits.softmax(&[-1], true)?,
        };
        Ok(probs.astype(v.dtype())?.matmul(&v)?)
    }
}
