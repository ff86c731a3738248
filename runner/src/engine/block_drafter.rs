//! A DFlash block drafter (`nn::arch::dflash`, loaded beside its target as its draft model: a
//! Modelfile's `DRAFT` of a DFlash checkpoint), which proposes a whole block in one forward.
//!
//! The target offers the outputs of the layers the drafter taps as every forward's
//! conditioning, and each sequence keeps the rows its drafter has not read (`head_states`).
//! A round starting from `first` (the token at the caches' length `P`) first appends those
//! rows, the committed positions up to `P − 1`, to the sequence's context caches, then drafts
//! the block `[first, mask, …]` at `P`; the block's own keys and values are never cached, so
//! nothing is rolled back after verification, and only committed positions' rows ever reach
//! the context. The caches start where the rows do (a prefix restored from the trie has
//! none): positions count from there, which rotary embeddings, being relative, do not notice.
//! A round proposes at most `block_size − 1` tokens, the argmax at each mask, so any sampling
//! verifies them losslessly; the depth controller never searches deeper
//! (`LoadedModel::attach_block_drafter`).

use std::collections::HashMap;

use kvcache::LayerCache;
use mlx::{Array, Dtype};
use nn::arch::dflash::DFlash;
use speculate::{Draft, Drafter, Proposal};

use crate::engine::draft_context::DraftContext;
use crate::engine::sequence::SequenceId;
use crate::engine::step::StepError;

/// A loaded block drafter, by the name requests call it.
pub struct BlockDrafter {
    name: String,
    dflash: DFlash,
    live: HashMap<SequenceId, ContextCache>,
}

/// A sequence's context caches: the target positions `start..start + len`.
struct ContextCache {
    caches: Vec<Option<LayerCache>>,
    start: usize,
    len: usize,
}

impl BlockDrafter {
    /// `dflash`, which requests call `name`.
    pub fn new(name: String, dflash: DFlash) -> BlockDrafter {
        BlockDrafter {
            name,
            dflash,
            live: HashMap::new(),
        }
    }

    /// Its name, as requests give it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The deepest proposal it makes: a block's masks.
    pub fn max_depth(&self) -> usize {
        self.dflash.block_size() - 1
    }

    /// The drafts of the sequence at `index` for a round from `first`, `[1, block − 1]` int32
    /// on the device; `None` when its context does not reach the round's position.
    fn draft(
        &mut self,
        ctx: &mut DraftContext<'_>,
        index: usize,
        first: u32,
    ) -> Result<Option<Array>, StepError> {
        let seq = &mut ctx.sequences[index];
        let position = seq.tokens.len();
        let cache = self.live.entry(seq.id).or_insert_with(|| ContextCache {
            caches: Vec::new(),
            start: usize::MAX,
            len: 0,
        });
        let context = match seq.head_states.take()? {
            Some((from, rows)) => {
                let n = usize::try_from(rows.dim(1)?).unwrap_or(0);
                if n == 0 || from + n != position {
                    seq.head_states.clear();
                    return Ok(None);
                }
                // The caches go on where they stopped, or start afresh where the rows do.
                if cache.start.saturating_add(cache.len) != from {
                    *cache = ContextCache {
                        caches: self.dflash.new_caches(),
                        start: from,
                        len: 0,
                    };
                }
                cache.len += n;
                Some(rows)
            }
            None if cache.start.saturating_add(cache.len) == position => None,
            None => return Ok(None),
        };
        let hidden = self
            .dflash
            .draft(ctx.target, first, context.as_ref(), &mut cache.caches)?;
        let logits = ctx.target.unembed(&hidden)?;
        Ok(Some(logits.argmax(2, false)?.astype(Dtype::I32)?))
    }
}

impl<'a> Drafter<DraftContext<'a>, StepError> for BlockDrafter {
    fn name(&self) -> &str {
        &self.name
    }

    fn propose(
        &mut self,
        ctx: &mut DraftContext<'a>,
        proposals: &mut [Proposal],
    ) -> Result<(), StepError> {
        let mut drafted = Vec::new();
        for (slot, proposal) in proposals.iter().enumerate().filter(|(_, p)| p.depth > 0) {
            let index = ctx.index_of(proposal.sequence)?;
            if let Some(tokens) = self.draft(ctx, index, proposal.first)? {
                drafted.push((slot, tokens));
            }
        }
        if drafted.is_empty() {
            return Ok(());
        }
        // One read for every sequence's block.
        let all: Vec<Array> = drafted.iter().map(|(_, t)| t.clone()).collect();
        let read: Vec<i32> = mlx::concatenate(&all, 1)?.to_vec()?;
        let block = self.max_depth();
        for ((slot, _), tokens) in drafted.iter().zip(read.chunks(block)) {
            let depth = proposals[*slot].depth.min(block);
            proposals[*slot].draft = Draft::one_hot(
                tokens[..depth]
                    .iter()
                    .map(|&t| u32::try_from(t).unwrap_or(0))
                    .collect(),
            );
        }
        Ok(())
    }

    fn end(&mut self, sequence: SequenceId, _context: &[u32], _intact: bool) {
        self.live.remove(&sequence);
    }
}
