//! The multi-token-prediction drafter (`mtp`): the head a checkpoint ships beside its decoder
//! (`nn::DraftHead`, Qwen3.5's `mtp.*`) or one trained apart and attached at load (the
//! project's `shipped_heads`), with caches of its own per sequence.
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

    /// Each sequence's head first reads the target states it has not read (one forward per
    /// sequence, as their counts differ); then every chained step runs once for all the
    /// sequences still drafting, one row each. Drafts stay on the device until all are made,
    /// and are read back together.
    fn propose(
        &mut self,
        ctx: &mut DraftContext<'a>,
        proposals: &mut [Proposal],
    ) -> Result<(), StepError> {
        let model = ctx.target;
        let mut chains = Vec::new();
        for (slot, proposal) in proposals.iter().enumerate().filter(|(_, p)| p.depth > 0) {
            let index = ctx.index_of(proposal.sequence)?;
            if let Some(chain) = self.first_draft(ctx, index, proposal.first, proposal.depth)? {
                chains.push((slot, chain));
            }
        }
        let deepest = chains.iter().map(|(_, c)| c.depth).max().unwrap_or(0);
        for step in 1..deepest {
            let going: Vec<usize> = (0..chains.len())
                .filter(|&i| chains[i].1.depth > step)
                .collect();
            let tokens: Vec<Array> = going.iter().map(|&i| chains[i].1.token.clone()).collect();
            let states: Vec<Array> = going.iter().map(|&i| chains[i].1.state.clone()).collect();
            let positions = going
                .iter()
                .map(|&i| chains[i].1.position + step - 1)
                .collect();
            let batch = Batch::from_device(&mlx::concatenate(&tokens, 0)?, positions)?;
            let ids: Vec<SequenceId> = going.iter().map(|&i| chains[i].1.sequence).collect();
            let mut caches = self.caches_of(&ids)?;
            let head = draft_head(model)?;
            let out = head.forward_head(&batch, &mlx::concatenate(&states, 0)?, &mut caches)?;
            let next = argmax(model, &out.hidden)?;
            for (row, &i) in going.iter().enumerate() {
                let chain = &mut chains[i].1;
                let row = row as i32;
                chain.state = out.hidden.slice_axis(0, row, row + 1)?;
                chain.token = next.slice_axis(0, row, row + 1)?;
                chain.drafts.push(chain.token.clone());
            }
        }
        // One read for every draft of the round.
        let all: Vec<Array> = chains
            .iter()
            .flat_map(|(_, c)| c.drafts.iter().cloned())
            .collect();
        let mut read = if all.is_empty() {
            Vec::new()
        } else {
            mlx::concatenate(&all, 1)?.to_vec::<i32>()?
        }
        .into_iter()
        .map(|t| u32::try_from(t).unwrap_or(0));
        for (slot, chain) in &chains {
            let tokens: Vec<u32> = read.by_ref().take(chain.drafts.len()).collect();
            proposals[*slot].draft = Draft::one_hot(tokens);
            // The chained slots read the head's own guesses, not the target's states.
            if let Some(cache) = self.live.get_mut(&chain.sequence) {
                for layer in cache.caches.iter_mut().flatten() {
                    layer.rewind(cache.len)?;
                }
            }
        }
        Ok(())
    }

    fn end(&mut self, sequence: SequenceId, _context: &[u32], _intact: bool) {
        self.live.remove(&sequence);
    }
}

/// A sequence's drafts so far in a round, on the device.
struct Chain {
    sequence: SequenceId,
    depth: usize,
    /// The head position of its next chained step's first slot, less the step.
    position: usize,
    /// The last step's output state, `[1, 1, hidden]`, and its draft, `[1, 1]`.
    state: Array,
    token: Array,
    drafts: Vec<Array>,
}

impl Mtp {
    /// The sequence at `index`'s first draft of a round that starts from `first`: its head
    /// reads the target states it has not read. `None` when the head has not been given the
    /// state that draft reads.
    fn first_draft(
        &mut self,
        ctx: &mut DraftContext<'_>,
        index: usize,
        first: u32,
        depth: usize,
    ) -> Result<Option<Chain>, StepError> {
        let model = ctx.target;
        let head = draft_head(model)?;
        let seq = &mut ctx.sequences[index];
        let held = seq.tokens.len();
        let Some((from, states)) = seq.head_states.take()? else {
            return Ok(None);
        };
        let rows = usize::try_from(states.dim(1)?).unwrap_or(0);
        // The states must reach the last position the caches hold, whose pair is `first`.
        if rows == 0 || from + rows != held {
            seq.head_states.clear();
            return Ok(None);
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
        let batch = Batch::single(&next_tokens, from - cache.start)?;
        let out = head.forward_head(&batch, &states, &mut [&mut cache.caches])?;
        cache.len += rows;
        let state = out.hidden.slice_axis(1, rows as i32 - 1, rows as i32)?;
        let token = argmax(model, &state)?;
        Ok(Some(Chain {
            sequence: seq.id,
            depth,
            position: held - cache.start,
            state,
            token: token.clone(),
            drafts: vec![token],
        }))
    }

    /// The head caches of `sequences`, in that order.
    fn caches_of(
        &mut self,
        sequences: &[SequenceId],
    ) -> Result<Vec<&mut [Option<LayerCache>]>, StepError> {
        let mut found: Vec<(usize, &mut [Option<LayerCache>])> = self
            .live
            .iter_mut()
            .filter_map(|(id, cache)| {
                let at = sequences.iter().position(|s| s == id)?;
                Some((at, cache.caches.as_mut_slice()))
            })
            .collect();
        if found.len() != sequences.len() {
            return Err(StepError::Request(
                "a drafting sequence lost its head cache".into(),
            ));
        }
        found.sort_by_key(|(at, _)| *at);
        Ok(found.into_iter().map(|(_, caches)| caches).collect())
    }
}

/// The model's drafter head.
fn draft_head(model: &dyn nn::Model) -> Result<&dyn nn::DraftHead, StepError> {
    model
        .draft_head()
        .ok_or_else(|| StepError::Request("this model ships no drafter head".into()))
}

/// The argmax token of each row of `state` (`[rows, 1, hidden]`) through the target's head,
/// as a `[rows, 1]` int32 array left on the device.
fn argmax(model: &dyn nn::Model, state: &Array) -> Result<Array, StepError> {
    Ok(model.unembed(state)?.argmax(2, false)?.astype(Dtype::I32)?)
}
