//! The layer-skip draft: the target's first `k` layers, its final norm and its head propose
//! the argmax, fed back for the next. No weights of its own; its keys and values for those
//! layers are the target's own, so it keeps nothing per sequence.

use std::collections::HashMap;

use mlx::{Array, Dtype};
use nn::Batch;
use speculate::{Draft, Drafter, Proposal};

use crate::engine::draft_context::DraftContext;
use crate::engine::rollback;
use crate::engine::step::{StepError, caches_of, of_sequences};

/// Drafts through the target's first `layers` layers.
pub struct LayerSkip {
    layers: usize,
    name: String,
}

impl LayerSkip {
    /// The draft of the first `layers` layers (`self:<layers>`).
    pub fn new(layers: usize) -> LayerSkip {
        LayerSkip {
            layers,
            name: format!("self:{layers}"),
        }
    }
}

impl<'a> Drafter<DraftContext<'a>, StepError> for LayerSkip {
    fn name(&self) -> &str {
        &self.name
    }

    /// From each round's first token, the first `layers` layers, the final norm and the head
    /// propose the argmax, fed back for the next: the rows of one depth in one forward per
    /// draft position, the drafts read back once. Those layers' caches then rewind to where the
    /// round starts, since the verification forward writes the same positions.
    fn propose(
        &mut self,
        ctx: &mut DraftContext<'a>,
        proposals: &mut [Proposal],
    ) -> Result<(), StepError> {
        // Each row drafts exactly its depth: its caches may not be able to take back more.
        let mut groups: HashMap<usize, Vec<(usize, usize)>> = HashMap::new();
        for (p, proposal) in proposals.iter().enumerate() {
            if proposal.depth > 0 {
                let index = ctx.index_of(proposal.sequence)?;
                groups.entry(proposal.depth).or_default().push((index, p));
            }
        }
        for (depth, mut group) in groups {
            // Rows follow the order of the step's sequences, as their caches are borrowed.
            group.sort_unstable();
            let indices: Vec<usize> = group.iter().map(|&(i, _)| i).collect();
            let firsts: Vec<u32> = group.iter().map(|&(_, p)| proposals[p].first).collect();
            let drafted = self.draft_rows(ctx, &indices, &firsts, depth)?;
            for (row, &(_, p)) in group.iter().enumerate() {
                proposals[p].draft =
                    Draft::one_hot(drafted[row * depth..(row + 1) * depth].to_vec());
            }
        }
        Ok(())
    }
}

impl LayerSkip {
    /// `depth` drafts for each of the sequences at `indices` (ascending), from its round's
    /// first token in `firsts`: `depth` ids per row, row after row.
    fn draft_rows(
        &self,
        ctx: &mut DraftContext<'_>,
        indices: &[usize],
        firsts: &[u32],
        depth: usize,
    ) -> Result<Vec<u32>, StepError> {
        let sequences = &mut *ctx.sequences;
        let model = ctx.target;
        let starts: Vec<usize> = indices.iter().map(|&i| sequences[i].tokens.len()).collect();
        let saved = indices
            .iter()
            .map(|&i| rollback::save_recurrent(&sequences[i].caches, self.layers))
            .collect::<Result<Vec<_>, StepError>>()?;
        let firsts: Vec<i32> = firsts
            .iter()
            .map(|&t| i32::try_from(t).unwrap_or(i32::MAX))
            .collect();
        let mut tokens = Array::from_slice(&firsts, &[indices.len() as i32, 1])?;
        let mut drafted = Vec::with_capacity(depth);
        for step in 0..depth {
            let positions = starts.iter().map(|&s| s + step).collect();
            let batch = Batch::from_device(&tokens, positions)?;
            let batch = of_sequences(batch, sequences, indices)?;
            let out = {
                let mut caches = caches_of(sequences, indices)?;
                model.forward_rows_through(&batch, &mut caches, self.layers)?
            };
            tokens = model
                .unembed(&out.hidden)?
                .argmax(2, false)?
                .astype(Dtype::I32)?;
            drafted.push(tokens.clone());
        }
        let drafted = mlx::concatenate(&drafted, 1)?.to_vec::<i32>()?;
        for ((&i, saved), &start) in indices.iter().zip(&saved).zip(&starts) {
            rollback::restore_recurrent(&mut sequences[i].caches, saved, start)?;
        }
        Ok(drafted
            .into_iter()
            .map(|t| u32::try_from(t).unwrap_or(0))
            .collect())
    }
}
