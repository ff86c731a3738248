//! `LimitedVocabulary`: a model whose output head is cut to the ids its tokenizer can decode.
//!
//! Checkpoints often pad the head beyond the tokenizer (Qwen's 151,936 rows for 151,669
//! tokens; tiny test models with a byte tokenizer). The padded rows are never trained targets,
//! but random or near-zero logits there can still win a draw, and an id the tokenizer cannot
//! decode is then an error in the middle of a reply. Cutting the logits removes them from
//! every sampler, drafter and argmax at once.

use kvcache::LayerCache;
use mlx::Array;

use crate::Result;
use crate::model::{Audio, Batch, DraftHead, Forward, InputEmbeddings, Model, ModelSpec, Vision};

/// `inner` with logits for ids `0..vocab` only.
pub struct LimitedVocabulary {
    inner: Box<dyn Model>,
    spec: ModelSpec,
}

impl LimitedVocabulary {
    /// `model` limited to `vocab` ids; `model` itself when its head is no larger.
    pub fn wrap(model: Box<dyn Model>, vocab: usize) -> Box<dyn Model> {
        if vocab == 0 || vocab >= model.spec().vocab_size {
            return model;
        }
        let spec = ModelSpec {
            vocab_size: vocab,
            ..model.spec().clone()
        };
        Box::new(LimitedVocabulary { inner: model, spec })
    }
}

impl Model for LimitedVocabulary {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    fn new_caches_rewindable(&self, slack: usize) -> Result<Vec<Option<LayerCache>>> {
        self.inner.new_caches_rewindable(slack)
    }

    fn forward_rows(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        self.inner.forward_rows(batch, caches)
    }

    fn forward_rows_through(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
        layers: usize,
    ) -> Result<Forward> {
        self.inner.forward_rows_through(batch, caches, layers)
    }

    fn unembed(&self, hidden: &Array) -> Result<Array> {
        let logits = self.inner.unembed(hidden)?;
        Ok(logits.slice_axis(-1, 0, self.spec.vocab_size as i32)?)
    }

    fn parameters(&self) -> Vec<Array> {
        self.inner.parameters()
    }

    fn release_rows(&self, row_tags: &[u64]) -> Result<()> {
        self.inner.release_rows(row_tags)
    }

    fn unavailable(&self) -> Option<String> {
        self.inner.unavailable()
    }

    fn vision(&self) -> Option<&dyn Vision> {
        self.inner.vision()
    }

    fn audio(&self) -> Option<&dyn Audio> {
        self.inner.audio()
    }

    /// The inner model's embedding, which cutting the head leaves as it is (an assistant
    /// reads it).
    fn input_embeddings(&self) -> Option<&dyn InputEmbeddings> {
        self.inner.input_embeddings()
    }

    /// The inner model's head: its drafts' logits come through [`Model::unembed`], so they
    /// are cut here as the model's are.
    fn draft_head(&self) -> Option<&dyn DraftHead> {
        self.inner.draft_head()
    }

    fn tap_layers(&mut self, layers: &[usize]) -> Result<()> {
        self.inner.tap_layers(layers)
    }
}
