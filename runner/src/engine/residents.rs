//! The models resident on the MLX worker, each under the [`ModelSlot`] its load gave it.
//!
//! Every job, embedding and status names its model by slot, so a request can never reach a
//! model loaded after the one it leased (a name could: the same model reloaded with another
//! draft is a different resident).

use crate::engine::loaded_model::LoadedModel;

/// A resident model's place on the worker, handed out by [`crate::engine::Engine::load`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelSlot(pub(super) u64);

/// The resident models, in the order they were loaded.
#[derive(Default)]
pub struct Residents {
    models: Vec<(ModelSlot, LoadedModel)>,
}

impl Residents {
    /// The model in `slot`, unless it was unloaded.
    pub fn get(&self, slot: ModelSlot) -> Option<&LoadedModel> {
        self.models
            .iter()
            .find_map(|(s, model)| (*s == slot).then_some(model))
    }

    /// Like [`Residents::get`], to change it.
    pub fn get_mut(&mut self, slot: ModelSlot) -> Option<&mut LoadedModel> {
        self.models
            .iter_mut()
            .find_map(|(s, model)| (*s == slot).then_some(model))
    }

    /// Adds `model` in `slot`.
    pub fn insert(&mut self, slot: ModelSlot, model: LoadedModel) {
        self.models.push((slot, model));
    }

    /// Takes the model in `slot` out, if it is resident.
    pub fn remove(&mut self, slot: ModelSlot) -> Option<LoadedModel> {
        let index = self.models.iter().position(|(s, _)| *s == slot)?;
        Some(self.models.remove(index).1)
    }

    /// Every resident model with its slot.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (ModelSlot, &mut LoadedModel)> {
        self.models.iter_mut().map(|(slot, model)| (*slot, model))
    }

    /// KV bytes every resident model's running sequences reserve together.
    pub fn kv_reserved(&self) -> usize {
        self.models
            .iter()
            .map(|(_, model)| model.kv_reserved())
            .fold(0, usize::saturating_add)
    }

    /// Whether no resident model has anything running or waiting.
    pub fn all_idle(&self) -> bool {
        self.models.iter().all(|(_, model)| model.is_idle())
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }
}
