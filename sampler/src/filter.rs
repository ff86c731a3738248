//! Temperature, top-k, top-p and min-p: from adjusted logits to the candidates a token is
//! drawn from.
//!
//! Filters never renormalise explicitly: a dropped token's logit becomes `-inf`, and the draw
//! (Gumbel-max) or the final softmax normalises over what is left, which is exactly sequential
//! application with renormalisation in between. Top-p reads probabilities renormalised over
//! the top-k survivors; min-p compares with the most likely survivor, so whether top-p
//! renormalised first does not change it.
//!
//! With top-k set, only the `k` survivors of one partition are sorted for top-p, so top-k and
//! top-p together never pay for a full sort of the vocabulary.

use mlx::{Array, Dtype};

use crate::Result;
use crate::options::Options;
use crate::ring::to_i32;

/// Scaled logits of the tokens still in the running.
#[derive(Debug, Clone)]
pub(crate) struct Candidates {
    /// `[B, K]` u32 token ids of the columns of `logits`; `None` when the columns are the whole
    /// vocabulary in order.
    pub(crate) ids: Option<Array>,
    /// `[B, K]` (or `[B, V]`) f32 logits divided by the temperature, `-inf` where filtered.
    pub(crate) logits: Array,
}

impl Candidates {
    /// Applies temperature, top-k, top-p and min-p of `options` (temperature > 0) to `logits`
    /// (`[B, V]` f32).
    pub(crate) fn filter(logits: &Array, options: &Options) -> Result<Candidates> {
        let vocab = logits.dim(1)?;
        // Top-k first, on the unscaled logits: dividing by a positive temperature keeps the
        // order, and then only the k survivors need scaling. Partitioning at `V - k` puts the
        // k largest last, which spares negating the whole row.
        let (kept, mut ids) = if options.top_k > 0 && options.top_k < vocab as usize {
            let k = to_i32(options.top_k)?;
            let best = logits
                .argpartition(vocab - k, 1)?
                .slice_axis(1, vocab - k, vocab)?;
            (logits.take_along_axis(&best, 1)?, Some(best))
        } else {
            (logits.clone(), None)
        };
        let mut scaled = if options.temperature == 1.0 {
            kept
        } else {
            kept.multiply(1.0 / options.temperature)?
        };
        if options.top_p < 1.0 {
            let order = scaled.negative()?.argsort(1)?;
            let sorted = scaled.take_along_axis(&order, 1)?;
            let before = sorted.softmax(&[1], false)?.cumsum(1, false, false)?;
            let columns = sorted.dim(1)?;
            let first = Array::arange(0.0, f64::from(columns), 1.0, Dtype::I32)?
                .reshape(&[1, columns])?
                .equal(0)?;
            // The most likely token always survives, so top_p = 0 means greedy-like, not empty.
            let keep = before.less(options.top_p)?.logical_or(&first)?;
            scaled = keep.select(&sorted, f32::NEG_INFINITY)?;
            ids = Some(match ids {
                Some(ids) => ids.take_along_axis(&order, 1)?,
                None => order,
            });
        }
        if options.min_p > 0.0 {
            let max = scaled.max(&[1], true)?;
            let keep = scaled.greater_equal(&max.add(options.min_p.ln())?)?;
            scaled = keep.select(&scaled, f32::NEG_INFINITY)?;
        }
        Ok(Candidates {
            ids,
            logits: scaled,
        })
    }

    /// The probabilities over the whole vocabulary, `[B, vocab]` f32.
    pub(crate) fn dense_probabilities(&self, vocab: i32) -> Result<Array> {
        let probs = self.logits.softmax(&[1], false)?;
        match &self.ids {
            None => Ok(probs),
            Some(ids) => {
                let rows = probs.dim(0)?;
                Ok(Array::zeros(&[rows, vocab], Dtype::F32)?.put_along_axis(ids, &probs, 1)?)
            }
        }
    }

    /// Maps column choices (`[B]` u32) back to token ids.
    pub(crate) fn token_ids(&self, columns: &Array) -> Result<Array> {
        match &self.ids {
            None => Ok(columns.clone()),
            Some(ids) => Ok(ids
                .take_along_axis(&columns.expand_dims(&[1])?, 1)?
                .squeeze(&[1])?),
        }
    }
}
