//! A Gemma 4 assistant as a drafter (`nn::Assistant`, loaded beside its target as its draft
//! model: a Modelfile's `DRAFT` of a `gemma4_assistant` checkpoint).
//!
//! It keeps nothing per sequence: every step attends over the target's own caches, which the
//! round's verification and rollback keep exact. A round starting from `first` (the token at
//! the caches' length `P`, not yet in them) reads the target's final state at `P − 1`, which
//! every forward over the sequence left in its `head_states`; each further draft feeds the
//! previous step's draft and state back, at the same position `P`. Every step runs once for
//! all the sequences still drafting, one row each, and the round's drafts are read back
//! together. Drafts are each step's argmax, so any sampling verifies them losslessly.

use mlx::{Array, Dtype};
use nn::{Assistant, Batch};
use speculate::{Draft, Drafter, Proposal};

use crate::engine::draft_context::DraftContext;
use crate::engine::step::StepError;

/// A loaded assistant, by the name requests call it.
pub struct AssistantDrafter {
    name: String,
    assistant: Box<dyn Assistant>,
}

/// A sequence's drafts so far in a round, on the device.
struct Chain {
    /// Its index among the step's sequences.
    index: usize,
    /// The proposal it fills.
    slot: usize,
    depth: usize,
    position: usize,
    /// The last step's state, `[1, 1, target hidden]`, and the token it reads, `[1, 1]`.
    state: Array,
    token: Array,
    drafts: Vec<Array>,
}

impl AssistantDrafter {
    /// `assistant`, which requests call `name`.
    pub fn new(name: String, assistant: Box<dyn Assistant>) -> AssistantDrafter {
        AssistantDrafter { name, assistant }
    }

    /// Its name, as requests give it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The chain of the sequence at `index`, drafting for `proposals[slot]`: `None` when the
    /// target's state at the position before the round is not there to read (a prefix
    /// restored from the trie and nothing run since).
    fn start(
        ctx: &mut DraftContext<'_>,
        index: usize,
        slot: usize,
        proposal: &Proposal,
    ) -> Result<Option<Chain>, StepError> {
        let seq = &mut ctx.sequences[index];
        let position = seq.tokens.len();
        let Some((from, states)) = seq.head_states.take()? else {
            return Ok(None);
        };
        let rows = usize::try_from(states.dim(1)?).unwrap_or(0);
        if rows == 0 || from + rows != position {
            seq.head_states.clear();
            return Ok(None);
        }
        let last = rows as i32;
        Ok(Some(Chain {
            index,
            slot,
            depth: proposal.depth,
            position,
            state: states.slice_axis(1, last - 1, last)?,
            token: Array::from_slice(&[proposal.first as i32], &[1, 1])?,
            drafts: Vec::new(),
        }))
    }
}

impl<'a> Drafter<DraftContext<'a>, StepError> for AssistantDrafter {
    fn name(&self) -> &str {
        &self.name
    }

    fn propose(
        &mut self,
        ctx: &mut DraftContext<'a>,
        proposals: &mut [Proposal],
    ) -> Result<(), StepError> {
        let mut chains = Vec::new();
        for (slot, proposal) in proposals.iter().enumerate().filter(|(_, p)| p.depth > 0) {
            let index = ctx.index_of(proposal.sequence)?;
            if let Some(chain) = Self::start(ctx, index, slot, proposal)? {
                chains.push(chain);
            }
        }
        let deepest = chains.iter().map(|c| c.depth).max().unwrap_or(0);
        for step in 0..deepest {
            let going: Vec<usize> = (0..chains.len())
                .filter(|&i| chains[i].depth > step)
                .collect();
            let tokens: Vec<Array> = going.iter().map(|&i| chains[i].token.clone()).collect();
            let states: Vec<Array> = going.iter().map(|&i| chains[i].state.clone()).collect();
            let positions = going.iter().map(|&i| chains[i].position).collect();
            let batch = Batch::from_device(&mlx::concatenate(&tokens, 0)?, positions)?;
            let caches: Vec<&[Option<kvcache::LayerCache>]> = going
                .iter()
                .map(|&i| ctx.sequences[chains[i].index].caches.as_slice())
                .collect();
            let out = self.assistant.draft_step(
                ctx.target,
                &batch,
                &mlx::concatenate(&states, 0)?,
                &caches,
            )?;
            let next = out.logits.argmax(2, false)?.astype(Dtype::I32)?;
            for (row, &i) in going.iter().enumerate() {
                let chain = &mut chains[i];
                let row = row as i32;
                chain.state = out.state.slice_axis(0, row, row + 1)?;
                chain.token = next.slice_axis(0, row, row + 1)?;
                chain.drafts.push(chain.token.clone());
            }
        }
        // One read for every draft of the round.
        let all: Vec<Array> = chains
            .iter()
            .flat_map(|c| c.drafts.iter().cloned())
            .collect();
        let mut read = if all.is_empty() {
            Vec::new()
        } else {
            mlx::concatenate(&all, 1)?.to_vec::<i32>()?
        }
        .into_iter()
        .map(|t| u32::try_from(t).unwrap_or(0));
        for chain in &chains {
            let tokens: Vec<u32> = read.by_ref().take(chain.drafts.len()).collect();
            proposals[chain.slot].draft = Draft::one_hot(tokens);
        }
        Ok(())
    }
}
