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
        if let AttentionMask::None = mask
            && let Some(out) = self.attend_unmasked_blocked(queries, keys, values)?
        {
            return Ok(out);
        }
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

    /// Every query over every key, nothing masked (a vision tower's patches), on the CPU: two
    /// BLAS products around the vectorized softmax, a block of queries at a time so that the
    /// scores held at once stay near [`UNMASKED_BLOCK_BYTES`]. MLX's attention forms the whole
    /// score matrix (1 GiB a layer for Gemma 3's 4,096 patches and 16 heads) and exponentiates
    /// one lane at a time. [`ScaledDotProduct::attend`] takes this path for every unmasked
    /// call it can. `None` where the softmax kernel does not apply (a GPU, other dtypes) or the
    /// logits are soft-capped or sunk.
    pub fn attend_unmasked_blocked(
        &self,
        queries: &Array,
        keys: &Array,
        values: &Array,
    ) -> Result<Option<Array>> {
        self.attend_unmasked_in_blocks(queries, keys, values, UNMASKED_BLOCK_BYTES)
    }

    fn attend_unmasked_in_blocks(
        &self,
        queries: &Array,
        keys: &Array,
        values: &Array,
        block_bytes: i64,
    ) -> Result<Option<Array>> {
        if self.logit_softcap.is_some()
            || self.sinks.is_some()
            || queries.dtype() != Dtype::F32
            || keys.dtype() != Dtype::F32
            || values.dtype() != Dtype::F32
        {
            return Ok(None);
        }
        let (batch, heads, length) = (queries.dim(0)?, queries.dim(1)?, queries.dim(2)?);
        let history = keys.dim(2)?;
        let groups = heads / keys.dim(1)?.max(1);
        // Heads split off a projection are strided views: made contiguous once here, not
        // copied again by every block's product.
        let keys_t = expand_groups(keys, groups)?
            .contiguous()?
            .swap_axes(-1, -2)?;
        let values = expand_groups(values, groups)?.contiguous()?;
        let queries = queries.contiguous()?;
        let row_bytes = 4 * i64::from(batch) * i64::from(heads) * i64::from(history.max(1));
        let block = (block_bytes / row_bytes).clamp(1, i64::from(length.max(1))) as i32;
        let mut blocks = Vec::new();
        let mut start = 0;
        while start < length {
            let end = (start + block).min(length);
            let q = queries.slice_axis(2, start, end)?.multiply(self.scale)?;
            let Some(probs) = mlx::fast::softmax_last_axis(&q.matmul(&keys_t)?)? else {
                return Ok(None);
            };
            blocks.push(probs.matmul(&values)?);
            start = end;
        }
        Ok(Some(match blocks.len() {
            1 => blocks.swap_remove(0),
            _ => mlx::concatenate(&blocks, 2)?,
        }))
    }

    /// Attention spelled out, for what the fused kernels cannot do: soft-capped logits
    /// (`cap · tanh(logits / cap)`) and sink columns.
    fn explicit(&self, q: &Array, k: &Array, v: &Array, mask: AttentionMask<'_>) -> Result<Array> {
        let groups = q.dim(1)? / k.dim(1)?.max(1);
        let (k, v) = (expand_groups(k, groups)?, expand_groups(v, groups)?);
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

/// About the most bytes of scores [`ScaledDotProduct::attend_unmasked_blocked`] holds at once.
pub const UNMASKED_BLOCK_BYTES: i64 = 64 << 20;

/// Key or value heads `[batch, kv_heads, len, d]` repeated for `groups` query heads each.
fn expand_groups(a: &Array, groups: i32) -> Result<Array> {
    if groups == 1 {
        return Ok(a.clone());
    }
    let s = a.shape();
    Ok(a.expand_dims(&[2])?
        .broadcast_to(&[s[0], s[1], groups, s[2], s[3]])?
        .reshape(&[s[0], s[1] * groups, s[2], s[3]])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(shape: &[i32], seed: u32) -> Array {
        let n: i32 = shape.iter().product();
        let data: Vec<f32> = (0..n as u32)
            .map(|i| ((i.wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 250.0 - 2.0)
            .collect();
        Array::from_slice(&data, shape).unwrap()
    }

    /// The blocked path equals MLX's own attention with no mask: grouped heads, two images, a
    /// query count no block divides (so the last block is short), blocks of one query and of
    /// all of them. The bound, 2e-6 on outputs of order 1, is f32 rounding of a 40-term softmax.
    #[test]
    fn blocks_of_queries_attend_as_one() {
        let kernel = ScaledDotProduct {
            scale: 0.3,
            logit_softcap: None,
            sinks: None,
        };
        let q = values(&[2, 4, 13, 8], 1);
        let k = values(&[2, 2, 40, 8], 2);
        let v = values(&[2, 2, 40, 8], 3);
        let want = mlx::fast::scaled_dot_product_attention(&q, &k, &v, 0.3, AttentionMask::None)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        // One query's scores: 4 bytes x 2 images x 4 heads x 40 keys.
        let one = 4 * 2 * 4 * 40;
        for block_bytes in [one, 5 * one, 1 << 30] {
            let got = kernel
                .attend_unmasked_in_blocks(&q, &k, &v, block_bytes)
                .unwrap()
                .expect("f32 on the CPU")
                .to_vec::<f32>()
                .unwrap();
            assert_eq!(got.len(), want.len());
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 2e-6, "blocks of {block_bytes} bytes: {worst}");
        }
        // Soft-capped logits are not its to compute.
        let capped = ScaledDotProduct {
            logit_softcap: Some(30.0),
            ..kernel
        };
        assert!(
            capped
                .attend_unmasked_blocked(&q, &k, &v)
                .unwrap()
                .is_none()
        );
    }
}
