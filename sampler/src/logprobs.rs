//! Logprobs of the chosen tokens and their most likely alternatives.
//!
//! OpenAI semantics: a full-vocabulary log-softmax of the model's logits, before bias,
//! penalties, temperature and filters, so they describe the model rather than the sampler. The
//! one exception is the grammar mask, which applies first: a token the grammar forbids has
//! logprob `-inf`, and the remaining mass renormalises over what the grammar allows.

use mlx::{Array, Dtype};

use crate::Result;
use crate::ring::to_i32;

/// Logprobs of one call, on the device. Rows follow the call's slots.
#[derive(Debug, Clone)]
pub struct Logprobs {
    /// `[B]` f32: the logprob of each row's sampled token.
    pub chosen: Array,
    /// `[B, N]` u32: the `N` most likely tokens of each row, most likely first.
    pub top_ids: Array,
    /// `[B, N]` f32: their logprobs.
    pub top_logprobs: Array,
}

impl Logprobs {
    /// Logprobs from `logits` (`[B, V]` f32, masked) for the chosen `tokens` (`[B]` u32) and
    /// the `top` best alternatives (clamped to the vocabulary).
    pub(crate) fn compute(logits: &Array, tokens: &Array, top: usize) -> Result<Logprobs> {
        let rows = logits.dim(0)?;
        let vocab = logits.dim(1)?;
        // Only the chosen and the top entries are needed, so the log-softmax is never
        // materialised over the vocabulary: logits minus one log-sum-exp per row.
        let lse = logits.logsumexp(&[1], true)?;
        let chosen = logits
            .take_along_axis(&tokens.expand_dims(&[1])?, 1)?
            .subtract(&lse)?
            .squeeze(&[1])?;
        let top = to_i32(top.min(vocab as usize))?;
        if top == 0 {
            return Ok(Logprobs {
                chosen,
                top_ids: Array::zeros(&[rows, 0], Dtype::U32)?,
                top_logprobs: Array::zeros(&[rows, 0], Dtype::F32)?,
            });
        }
        // Partitioning at `V - top` puts the `top` largest last, in no order; sort just those.
        let best = logits
            .argpartition(vocab - top, 1)?
            .slice_axis(1, vocab - top, vocab)?;
        let best_values = logits.take_along_axis(&best, 1)?.subtract(&lse)?;
        let order = best_values.negative()?.argsort(1)?;
        Ok(Logprobs {
            chosen,
            top_ids: best.take_along_axis(&order, 1)?,
            top_logprobs: best_values.take_along_axis(&order, 1)?,
        })
    }
}
