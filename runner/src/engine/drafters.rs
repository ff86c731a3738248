//! The drafters of a loaded model, one per kind its sequences ask for, each a
//! [`speculate::Drafter`]: prompt lookup ([`speculate::NgramDrafter`] per sequence), the target's
//! own first layers (`layer_skip`), the draft model loaded beside it (`draft_model`, or an
//! assistant that reads the target's caches in its place: `assistant`) and the head the
//! target's checkpoint ships (`mtp`). The
//! rounds in `speculation` reach every kind through that one trait; this registry is the only
//! place that knows which object serves which kind.

use std::collections::BTreeMap;

use speculate::{NgramConfig, NgramDrafter, PerSequence};

use crate::engine::assistant::AssistantDrafter;
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
    model: Option<DraftModel>,
    /// A Gemma 4 assistant loaded as the draft model: requests name it as they would one.
    assistant: Option<AssistantDrafter>,
    mtp: Mtp,
}

impl Default for Drafters {
    fn default() -> Drafters {
        Drafters {
            ngram: PerSequence::new(NgramDrafter::new(NgramConfig::default())),
            layer_skip: BTreeMap::new(),
            model: None,
            assistant: None,
            mtp: Mtp::default(),
        }
    }
}

impl Drafters {
    /// Puts `model` beside the target as its draft model, replacing any other.
    pub fn attach_model(&mut self, model: DraftModel) {
        self.model = Some(model);
        self.assistant = None;
    }

    /// Puts `assistant` beside the target as its draft model, replacing any other.
    pub fn attach_assistant(&mut self, assistant: AssistantDrafter) {
        self.assistant = Some(assistant);
        self.model = None;
    }

    /// The draft model, when one with caches of its own is loaded.
    pub fn model(&self) -> Option<&DraftModel> {
        self.model.as_ref()
    }

    /// The name of the draft model loaded (either kind), when one is.
    pub fn draft_name(&self) -> Option<&str> {
        match (&self.model, &self.assistant) {
            (Some(model), _) => Some(model.name()),
            (None, Some(assistant)) => Some(assistant.name()),
            (None, None) => None,
        }
    }

    /// Whether the draft model reads the target's final states (an assistant does).
    pub fn model_reads_target_states(&self) -> bool {
        self.assistant.is_some()
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
            DrafterKind::Model => match (&mut self.model, &mut self.assistant) {
                (Some(model), _) => Some(model as &mut EngineDrafter),
                (None, Some(assistant)) => Some(assistant as &mut EngineDrafter),
                (None, None) => None,
            },
            DrafterKind::Mtp => Some(&mut self.mtp),
        }
    }

    /// The drafter of `kind`, or an error saying it is not there.
    pub fn of(&mut self, kind: DrafterKind) -> Result<&mut EngineDrafter, StepError> {
        self.get(kind).ok_or(StepError::NoDraftModel)
    }
}
