//! What every phase of a step shares: the step's error, the step's own state ([`Step`]: who
//! ends in it, whether MLX's pool is released after it), the tokens left in flight for the
//! next step ([`Pending`]), and the helpers that turn sequences into the rows of one batched
//! forward.
//!
//! This is the bottom of the step loop: admission, prefill, decode, speculation and
//! retirement all build on it, and it imports none of them.

use std::time::Instant;

use mlx::{Array, Dtype};
use nn::{Batch, Model};
use sampler::Sampled;

use crate::engine::job::TokenLogprobs;
use crate::engine::memory;
use crate::engine::prefix_cache::PrefixError;
use crate::engine::sequence::{Outcome, Sequence, SequenceId};

/// What went wrong in a step, by whose doing: the request (what the client asked cannot run as
/// asked), the model (what it or its memory layout refuses), or the step itself (a lower
/// crate failed, or one of the loop's own invariants broke).
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The request: its prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The request: its prompt leaves no room in the model's context for a generated token.
    #[error("the prompt is {prompt} tokens, the model's context is {context}")]
    PromptTooLong {
        /// Prompt tokens.
        prompt: usize,
        /// The model's context, tokens.
        context: usize,
    },
    /// The request: it drafts with a draft model, and none is loaded beside this one.
    #[error("this model was loaded without a draft model")]
    NoDraftModel,
    /// The request cannot run as asked (its media, its drafter), saying why.
    #[error("{0}")]
    Request(String),
    /// The model cannot serve as asked (a KV storage its heads do not fit, a draft model of
    /// another vocabulary), saying why.
    #[error("{0}")]
    Unsupported(String),
    /// The model failed.
    #[error(transparent)]
    Model(#[from] nn::Error),
    /// MLX failed (memory included).
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
    /// The sampler refused the options or failed.
    #[error(transparent)]
    Sampler(#[from] sampler::Error),
    /// The caches failed.
    #[error(transparent)]
    Cache(#[from] kvcache::Error),
    /// The prefix cache failed.
    #[error(transparent)]
    Prefix(#[from] PrefixError),
    /// The output constraint failed (a matcher error; a sampled token is always allowed).
    #[error("structured output: {0}")]
    Grammar(#[from] grammar::Error),
    /// The step broke one of its own invariants (a bug, not the request's doing), saying
    /// which.
    #[error("{0}")]
    Internal(String),
}

/// A step's result.
pub type Result<T> = std::result::Result<T, StepError>;

/// The sequences ending in this step, first outcome wins.
#[derive(Default)]
pub struct Ending {
    /// Each with how it ends, in the order they were noticed.
    pub outcomes: Vec<(SequenceId, Outcome)>,
}

impl Ending {
    /// Records that `id` ends with `outcome`, unless it already ends.
    pub fn add(&mut self, id: SequenceId, outcome: Outcome) {
        if !self.contains(id) {
            self.outcomes.push((id, outcome));
        }
    }

    /// Whether `id` ends in this step.
    pub fn contains(&self, id: SequenceId) -> bool {
        self.outcomes.iter().any(|(f, _)| *f == id)
    }
}

/// One step's own state, which every phase reads and adds to: the sequences that end in it
/// (retired when it ends) and whether MLX's buffer pool is released after it.
#[derive(Default)]
pub struct Step {
    /// The sequences ending in this step.
    pub ending: Ending,
    /// Whether the step crossed a point where MLX's pool is released: a long prefill, or a
    /// sequence's generated count crossing a multiple of [`memory::CLEAR_CACHE_EVERY`].
    pub clear_pool: bool,
}

impl Step {
    /// Hands `token`, read at `now`, to `seq` ([`Sequence::deliver`]), noting when its count
    /// crosses a point where the pool is released; returns how `seq` ends, if it does.
    pub fn deliver(
        &mut self,
        seq: &mut Sequence,
        token: u32,
        logprobs: Option<TokenLogprobs>,
        now: Instant,
    ) -> Option<Outcome> {
        let before = seq.stats.generated_tokens;
        let outcome = seq.deliver(token, logprobs, now);
        self.clear_pool |= memory::crosses_clear_point(before, seq.stats.generated_tokens);
        outcome
    }
}

/// The tokens the last step sampled, not yet read, and whose rows they are.
pub struct Pending {
    /// What the sampler returned (tokens, logprobs), still on the device.
    pub sampled: Sampled,
    /// The sequence of each row.
    pub rows: Vec<SequenceId>,
    /// When its forward was dispatched: the read a step later measures a step's cost.
    pub dispatched: Instant,
}

/// `batch`, whose rows are `sequences[i]` for each `i` of `indices`, carrying each one's id as
/// its row tag (a model split across processes finds the row's caches by it) and its rope
/// delta, unless every delta is 0 (no row follows an image of an M-RoPE family).
pub fn of_sequences(batch: Batch, sequences: &[Sequence], indices: &[usize]) -> Result<Batch> {
    let tags = indices.iter().map(|&i| sequences[i].id as u64).collect();
    let batch = batch.with_row_tags(tags)?;
    let deltas: Vec<i64> = indices.iter().map(|&i| sequences[i].rope_delta).collect();
    if deltas.iter().all(|&d| d == 0) {
        return Ok(batch);
    }
    Ok(batch.with_rope_deltas(deltas)?)
}

/// The caches of `sequences[i]` for each `i` of `indices` (ascending, as a batch's rows are
/// ordered), borrowed together for one forward.
pub fn caches_of<'a>(
    sequences: &'a mut [Sequence],
    indices: &[usize],
) -> Result<Vec<&'a mut [Option<kvcache::LayerCache>]>> {
    rows_of(sequences, indices, |seq| Some(seq.caches.as_mut_slice()))
}

/// The caches `pick` chooses of `sequences[i]` for each `i` of `indices` (ascending), borrowed
/// together for one forward; an error when a row has none.
pub fn rows_of<'a>(
    sequences: &'a mut [Sequence],
    indices: &[usize],
    pick: impl Fn(&'a mut Sequence) -> Option<&'a mut [Option<kvcache::LayerCache>]>,
) -> Result<Vec<&'a mut [Option<kvcache::LayerCache>]>> {
    let mut wanted = indices.iter().copied().peekable();
    let mut caches = Vec::with_capacity(indices.len());
    for (i, seq) in sequences.iter_mut().enumerate() {
        if wanted.peek() == Some(&i) {
            wanted.next();
            caches.extend(pick(seq));
        }
    }
    if caches.len() != indices.len() {
        return Err(StepError::Internal(
            "batch rows out of order or without caches".into(),
        ));
    }
    Ok(caches)
}

/// Splits planned chunks `(row, tokens)` into forwards of one width each: repeatedly, the
/// width that evaluates the most tokens (width × the chunks at least that long) takes every
/// chunk at least that long, cut to it; the shorter ones form the next forwards. Each group's
/// rows come out ascending.
pub fn equal_width_groups(mut planned: Vec<(usize, usize)>) -> Vec<(usize, Vec<usize>)> {
    let mut groups = Vec::new();
    while !planned.is_empty() {
        let covered = |width: usize| width * planned.iter().filter(|&&(_, n)| n >= width).count();
        let Some(width) = planned
            .iter()
            .map(|&(_, n)| n)
            .max_by_key(|&w| (covered(w), w))
        else {
            break;
        };
        let (mut taken, rest): (Vec<_>, Vec<_>) =
            planned.into_iter().partition(|&(_, n)| n >= width);
        taken.sort_unstable();
        groups.push((width, taken.into_iter().map(|(i, _)| i).collect()));
        planned = rest;
    }
    groups
}

/// Groups planned chunks `(row, tokens)` by their exact width, never cutting one; each group's
/// rows ascending, widest group first.
pub fn exact_width_groups(planned: Vec<(usize, usize)>) -> Vec<(usize, Vec<usize>)> {
    let mut groups: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for (i, n) in planned {
        groups.entry(n).or_default().push(i);
    }
    groups
        .into_iter()
        .rev()
        .map(|(width, mut group)| {
            group.sort_unstable();
            (width, group)
        })
        .collect()
}

/// The f32 logits `[rows, V]` after the last position of `hidden` `[rows, tokens, H]`.
pub fn last_logits(model: &dyn Model, hidden: &Array) -> Result<Array> {
    let last = hidden.slice_axis(1, -1, hidden.dim(1)?)?;
    Ok(model.unembed(&last)?.squeeze(&[1])?.astype(Dtype::F32)?)
}

#[cfg(test)]
mod tests {
    use super::equal_width_groups;
    use proptest::prelude::*;

    #[test]
    fn prompts_that_arrive_together_share_one_forward() {
        // Eight 127-token chunks and one 126: all take 126 now; the rest waits for the next step.
        let mut planned: Vec<(usize, usize)> = (0..8).map(|i| (i, 127)).collect();
        planned.push((8, 126));
        assert_eq!(equal_width_groups(planned), vec![(126, (0..9).collect())]);
        // A short chunk does not hold a long one back: two forwards.
        assert_eq!(
            equal_width_groups(vec![(3, 10), (1, 256)]),
            vec![(256, vec![1]), (10, vec![3])]
        );
    }

    proptest! {
        /// Every planned chunk lands in exactly one group, cut to at most its length, each group
        /// ascending; the first group evaluates the most tokens any single width could.
        #[test]
        fn groups_cover_every_chunk_once(lengths in proptest::collection::vec(1usize..300, 1..12)) {
            let planned: Vec<(usize, usize)> = lengths.iter().copied().enumerate().collect();
            let groups = equal_width_groups(planned.clone());
            let mut seen: Vec<usize> = groups.iter().flat_map(|(_, g)| g.clone()).collect();
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
            for (width, group) in &groups {
                prop_assert!(group.windows(2).all(|w| w[0] < w[1]));
                for &i in group {
                    prop_assert!(*width <= lengths[i]);
                }
            }
            let best = lengths
                .iter()
                .map(|&w| w * lengths.iter().filter(|&&n| n >= w).count())
                .max()
                .unwrap_or(0);
            prop_assert_eq!(groups[0].0 * groups[0].1.len(), best);
        }
    }
}
