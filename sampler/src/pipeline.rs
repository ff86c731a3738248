//! The steps shared by drawing tokens and building distribution rows: logit bias and
//! penalties, then either a draw or the probabilities it draws from.

use mlx::{Array, Dtype, random};

use crate::Result;
use crate::filter::Candidates;
use crate::options::Options;
use crate::penalty::Penalties;
use crate::ring::to_i32;

/// Adds the logit bias, then applies the penalties for `windows` (`[B, W]` i32) to `logits`
/// (`[B, V]` f32, already masked). Token ids must be below `V` (the caller checks).
pub(crate) fn adjust(logits: &Array, options: &Options, windows: Option<&Array>) -> Result<Array> {
    let mut logits = logits.clone();
    if !options.logit_bias.is_empty() {
        let rows = logits.dim(0)?;
        let n = to_i32(options.logit_bias.len())?;
        let ids: Vec<i32> = options.logit_bias.keys().map(|&t| t as i32).collect();
        let bias: Vec<f32> = options.logit_bias.values().copied().collect();
        let ids = Array::from_slice(&ids, &[1, n])?.broadcast_to(&[rows, n])?;
        let bias = Array::from_slice(&bias, &[1, n])?;
        let biased = logits.take_along_axis(&ids, 1)?.add(&bias)?;
        logits = logits.put_along_axis(&ids, &biased, 1)?;
    }
    if let Some(windows) = windows {
        let penalties = Penalties {
            repeat: options.repeat_penalty,
            presence: options.presence_penalty,
            frequency: options.frequency_penalty,
        };
        logits = penalties.apply(&logits, windows)?;
    }
    Ok(logits)
}

/// One token per row of adjusted `logits` (`[B, V]` f32): the argmax when greedy, else a
/// Gumbel-max draw over the filtered candidates with row `b` using `keys[b]`. `[B]` u32.
pub(crate) fn draw(logits: &Array, options: &Options, keys: &[Array]) -> Result<Array> {
    if options.is_greedy() {
        return Ok(logits.argmax(1, false)?);
    }
    let candidates = Candidates::filter(logits, options)?;
    let columns = candidates.logits.dim(1)?;
    let mut noise = keys
        .iter()
        .map(|key| random::gumbel(&[1, columns], Dtype::F32, key))
        .collect::<mlx::Result<Vec<_>>>()?;
    // One row per key, and callers pass one key per row (at least one).
    let noise = if noise.len() == 1 {
        noise.swap_remove(0)
    } else {
        mlx::concatenate(&noise, 0)?
    };
    let choice = candidates.logits.add(&noise)?.argmax(1, false)?;
    candidates.token_ids(&choice)
}

/// The distribution `draw` samples from, `[B, V]` f32 (one-hot when greedy).
pub(crate) fn probabilities(logits: &Array, options: &Options) -> Result<Array> {
    let vocab = logits.dim(1)?;
    if options.is_greedy() {
        let best = logits.argmax(1, true)?.astype(Dtype::I32)?;
        let tokens = Array::arange(0.0, f64::from(vocab), 1.0, Dtype::I32)?.reshape(&[1, vocab])?;
        return Ok(tokens.equal(&best)?.astype(Dtype::F32)?);
    }
    Candidates::filter(logits, options)?.dense_probabilities(vocab)
}
