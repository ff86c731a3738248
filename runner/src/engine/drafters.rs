//! The drafters of a loaded model, one per kind its sequences ask for, each a
//! [`speculate::Drafter`]: prompt lookup ([`speculate::NgramDrafter`] per sequence), the target's
//! own first layers (`layer_skip`), the draft model loaded beside it (`draft_model`; in its
//! place a Gemma 4 assistant that reads the target's caches, `assistant`, or a DFlash block
//! drafter that reads its tapped layers, `block_drafter`) and the head the target's checkpoint
//! ships (`mtp`). The
//! rounds in `speculation` reach every kind through that one trait; this registry is the only
//! place that knows which object serves which kind.

use std::collections::BTreeMap;

use speculate::{NgramConfig, NgramDrafter, PerSequence};

use crate::engine::assistant::AssistantDrafter;
use crate::engine::block_drafter::BlockDrafter;
use crate::engine::draft_context::EngineDrafter;
use crate::engine::draft_model::DraftModel;
use crate::engine::job::DrafterKind;
use crate::engine::layer_skip::LayerSkip;
use crate::engine::mtp::Mtp;
use crate::engine::step::StepError;

/// The drafters of a loaded model.
pub struct Drafters {
    ngram: PerSequence<NgramDrafter>,
    /// One per number of layers asked for (`self:4`, `self:8`, ...).
    layer_skip: BTreeMap<usize, LayerSkip>,
    /// What requests name as the draft model, when one is loaded.
    draft: Option<Draft>,
    mtp: Mtp,
}

/// The draft model loaded beside the target, of whichever kind.
enum Draft {
    /// A model with caches of its own.
    Model(DraftModel),
    /// A Gemma 4 assistant over the target's caches.
    Assistant(AssistantDrafter),
    /// A DFlash block drafter over the target's tapped layers.
    Block(BlockDrafter),
}

impl Default for Drafters {
    fn default() -> Drafters {
        Drafters {
            ngram: PerSequence::new(NgramDrafter::new(NgramConfig::default())),
            layer_skip: BTreeMap::new(),
            draft: None,
            mtp: Mtp::default(),
        }
    }
}

impl Drafters {
    /// Puts `model` beside the target as its draft model, replacing any other.
    pub fn attach_model(&mut self, model: DraftModel) {
        self.draft = Some(Draft::Model(model));
    }

    /// Puts `assistant` beside the target as its draft model, replacing any other.
    pub fn attach_assistant(&mut self, assistant: AssistantDrafter) {
        self.draft = Some(Draft::Assistant(assistant));
    }

    /// Puts `block` beside the target as its draft model, replacing any other.
    pub fn attach_block(&mut self, block: BlockDrafter) {
        self.draft = Some(Draft::Block(block));
    }

    /// The draft model, when one with caches of its own is loaded.
    pub fn model(&self) -> Option<&DraftModel> {
        match &self.draft {
            Some(Draft::Model(model)) => Some(model),
            _ => None,
        }
    }

    /// The name of the draft model loaded (any kind), when one is.
    pub fn draft_name(&self) -> Option<&str> {
        match self.draft.as_ref()? {
            Draft::Model(model) => Some(model.name()),
            Draft::Assistant(assistant) => Some(assistant.name()),
            Draft::Block(block) => Some(block.name()),
        }
    }

    /// Whether the draft model reads the target's final or tapped states (an assistant and a
    /// block drafter do).
    pub fn model_reads_target_states(&self) -> bool {
        matches!(self.draft, Some(Draft::Assistant(_) | Draft::Block(_)))
    }

    /// The drafter of `kind`; `None` for a draft model when none is loaded.
    pub fn get(&mut self, kind: DrafterKind) -> Option<&mut EngineDrafter> {
        match kind {
            DrafterKind::Ngram => Some(&mut self.ngram),
            DrafterKind::SelfDraft(layers) => Some(
                self.layer_skip
                    .entry(layers)
                    .or_insert_with(|| LayerSkip::new(layers)),
            ),
            DrafterKind::Model => match self.draft.as_mut()? {
                Draft::Model(model) => Some(model as &mut EngineDrafter),
                Draft::Assistant(assistant) => Some(assistant as &mut EngineDrafter),
                Draft::Block(block) => Some(block as &mut EngineDrafter),
            },
            DrafterKind::Mtp => Some(&mut self.mtp),
        }
    }

    /// The drafter of `kind`, or an error saying it is not there.
    pub fn of(&mut self, kind: DrafterKind) -> Result<&mut EngineDrafter, StepError> {
        self.get(kind).ok_or(StepError::NoDraftModel)
    }
}
