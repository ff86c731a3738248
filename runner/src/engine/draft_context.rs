//! What the engine lends a drafter each round ([`DraftContext`]), and a drafter as the engine
//! holds it ([`EngineDrafter`]): the one trait every kind of drafter is reached through.

use nn::Model;
use sampler::Sampler;
use speculate::Drafter;

use crate::engine::sequence::{Sequence, SequenceId};
use crate::engine::step::StepError;

/// What the engine lends a drafter to draft with: the target, the sampler (a drafter that
/// draws its drafts applies the request's sampling chain) and the step's sequences, with their
/// committed tokens and the target's caches.
pub struct DraftContext<'a> {
    /// The target model.
    pub target: &'a dyn Model,
    /// The loaded model's sampler, one slot per sequence.
    pub sampler: &'a Sampler,
    /// The step's sequences.
    pub sequences: &'a mut [Sequence],
}

impl DraftContext<'_> {
    /// The index of sequence `id` among [`DraftContext::sequences`].
    pub fn index_of(&self, id: SequenceId) -> Result<usize, StepError> {
        self.sequences
            .iter()
            .position(|seq| seq.id == id)
            .ok_or_else(|| StepError::Internal(format!("sequence {id} is not in this step")))
    }
}

/// A drafter as the engine holds it: any kind, behind the one trait.
pub type EngineDrafter = dyn for<'a> Drafter<DraftContext<'a>, StepError>;
