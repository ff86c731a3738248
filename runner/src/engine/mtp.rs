//! The multi-token-prediction drafter (`mtp`): the head a checkpoint ships beside its decoder
//! (`nn::DraftHead`, Qwen3.5's `mtp.*`), with caches of its own per sequence.
//!
//! Head slot `S` reads the target's final state at `S` and the token at `S + 1`, and predicts
//! the token at `S + 2`. A round starting from `first` (the token at the caches' length `L`,
//! not yet in them) first gives the head the target states it has not read (up to `L − 1`,
//! the last paired with `first`); that slot's prediction is the first draft. Each further
//! draft feeds the previous step's own output state and draft back, and those chained slots
//! are taken out of the head's cache at once: only slots made from the target's states stay.
//!
//! The head's cache starts where the target's states start (a prefix restored from the trie
//! has none): its positions count from there, which rotary embeddings, being relative, do not
//! notice. Drafts are the argmax of each step, so any sampling verifies them losslessly.

use std::collections::HashMap;

use kvcache::LayerCache;
use mlx::{Array, Dtype};
use nn::Batch;
use speculate::{Draft, Drafter, Proposal};

use crate::engine::draft_context::DraftContext;
use crate::engine::sequence::SequenceId;
use crate::engine::step::StepError;

/// The drafter of a model whose checkpoint ships a head.
#[derive(Default)]
pub struct Mtp {
    live: HashMap<SequenceId, HeadCache>,
}

/// A sequence's head cache: slots for the target positions `start..start + len`.
struct HeadCache {
    caches: Vec<Option<LayerCache>>,
    start: usize,
    len: usize,
}

impl HeadCache {
    /// A cache no states continue (it ends at no position), replaced at first use.
    fn unused() -> HeadCache {
        HeadCache {
            caches: Vec::new(),
            start: usize::MAX,
            len: 0,
        }
    }
}

impl<'a> Drafter<DraftContext<'a>, StepError> for Mtp {
    fn name(&self) -> &str {
        "mtp"
    }

    fn propose(
        &mut self,
        ctx: &mut DraftContext<'a>,
        proposals: &mut [Proposal],
    ) -> Result<(), StepError> {
        for proposal in proposals.iter_mut().filter(|p| p.depth > 0) {
            let index = ctx.index_of(proposal.sequence)?;
            let tokens = self.draft(ctx, index, proposal.first, proposal.depth)?;
            proposal.draft = Draft::one_hot(tokens);
        }
        Ok(())
    }

    fn end(&mut self, sequence: SequenceId, _context: &[u32], _intact: bool) {
        self.live.remove(&sequence);
    }
}

impl Mtp {
    /// At most `depth` drafts for the sequence at `index`, whose round starts from `first`;
    /// none when the head has not been given the state its first draft reads.
    fn draft(
        &mut self,
        ctx: &mut DraftContext<'_>,
        index: usize,
        first: u32,
        depth: usize,
    ) -> Result<Vec<u32>, StepError> {
        let model = ctx.target;
        let head = model
            .draft_head()
            .ok_or_else(|| StepError::Request("this model ships no drafter head".into()))?;
        let seq = &mut ctx.sequences[index];
        let held = seq.tokens.len();
        let Some((from, states)) = seq.head_states.take()? else {
            return Ok(Vec::new());
        };
        let rows = usize::try_from(states.dim(1)?).unwrap_or(0);
        // The states must reach the last position the caches hold, whose pair is `first`.
        if rows == 0 || from + rows != held {
            seq.head_states.clear();
            return Ok(Vec::new());
        }
        // The head's cache goes on where it stopped, or starts afresh where the states do.
        let cache = self.live.entry(seq.id).or_insert_with(HeadCache::unused);
        if cache.start + cache.len != from {
            *cache = HeadCache {
                caches: head.new_head_caches()?,
                start: from,
                len: 0,
            };
        }
        // Slot S pairs the state at S with the token at S + 1: the cached tokens, then `first`.
        let mut next_tokens: Vec<u32> = seq.tokens[from + 1..].to_vec();
        next_tokens.push(first);
        let mut out = forward(
            head,
            &mut cache.caches,
            &next_tokens,
            from - cache.start,
            &states,
        )?;
        cache.len += rows;
        // Each draft stays on the device and feeds the next step: the chain is one graph,
        // read back once.
        let mut state = out.hidden.slice_axis(1, rows as i32 - 1, rows as i32)?;
        let mut token = argmax(model, &state)?;
        let mut drafts = vec![token.clone()];
        for step in 1..depth {
            let position = held - cache.start + step - 1;
            let batch = Batch::from_device(&token, vec![position])?;
            out = head.forward_head(&batch, &state, &mut [&mut cache.caches])?;
            state = out.hidden;
            token = argmax(model, &state)?;
            drafts.push(token.clone());
        }
        let drafts: Vec<u32> = mlx::concatenate(&drafts, 1)?
            .to_vec::<i32>()?
            .into_iter()
            .map(|t| u32::try_from(t).unwrap_or(0))
            .collect();
        // The chained slots read the head's own guesses, not the target's states: drop them.
        for layer in cache.caches.iter_mut().flatten() {
            layer.rewind(cache.len)?;
        }
        Ok(drafts)
    }
}

/// The head over `tokens` at head position `position` on, conditioned on `states`.
fn forward(
    head: &dyn nn::DraftHead,
    caches: &mut [Option<LayerCache>],
    tokens: &[u32],
    position: usize,
    states: &Array,
) -> Result<nn::Forward, StepError> {
    let batch = Batch::single(tokens, position)?;
    Ok(head.forward_head(&batch, states, &mut [caches])?)
}

/// The argmax token of `state` (`[1, 1, hidden]`) through the target's head, as a `[1, 1]`
/// int32 array left on the device.
fn argmax(model: &dyn nn::Model, state: &Array) -> Result<Array, StepError> {
    Ok(model.unembed(state)?.argmax(2, false)?.astype(Dtype::I32)?)
}
