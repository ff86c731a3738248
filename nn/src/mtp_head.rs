//! `MtpHead`: a multi-token-prediction head in the layout Qwen3.5 ships under `mtp.*` (and
//! DeepSeek-V3 under its extra layer's names): the next token's embedding and the target's
//! state, each RMS-normed, side by side (embedding first) through `fc`, one decoder layer of
//! the family's own kind, and a final norm. Embedding and output head are the target's.
//!
//! The layer is the family's: each architecture that carries a head hands its own decoder
//! layer in through [`HeadLayer`], so the head's attention is computed exactly as the
//! decoder's. The head keeps a handle on the target's embedding (its arrays are shared, not
//! copied), so it is the model's [`DraftHead`] itself.

use kvcache::LayerCache;
use mlx::Array;

use crate::Result;
use crate::cached_attention::{BatchPositions, check_cache_sets};
use crate::embedding::Embedding;
use crate::linear::Linear;
use crate::model::{Batch, DraftHead, Forward, LayerState};
use crate::rms_norm::RmsNorm;
use crate::weights::Weights;

/// A decoder layer a head runs: the family's own, over cache slot `index` of each row.
pub(crate) trait HeadLayer {
    /// The layer over `h`, reading and appending to cache slot `index` of each row.
    fn forward(
        &self,
        h: &Array,
        caches: &mut [&mut [Option<LayerCache>]],
        index: usize,
        batch: &Batch,
        positions: &BatchPositions,
    ) -> Result<Array>;

    /// Its arrays, for evaluation and memory accounting.
    fn collect_arrays(&self, out: &mut Vec<Array>);
}

/// The head's tensors, read from `mtp.*`.
pub(crate) struct MtpHead<L> {
    /// The target's token embedding.
    embed_tokens: Embedding,
    pre_fc_norm_embedding: RmsNorm,
    pre_fc_norm_hidden: RmsNorm,
    fc: Linear,
    layer: L,
    norm: RmsNorm,
    cache: LayerState,
}

/// Whether `weights` carry a head to read.
pub(crate) fn present(weights: &Weights) -> bool {
    weights.contains("mtp.fc.weight")
}

impl<L: HeadLayer> MtpHead<L> {
    /// Reads the head beside the target's `embed_tokens`: `norm(weights, name)` reads each
    /// norm the family's way (Qwen3.5's unit offset), `layer(weights, "mtp.layers.0")` its
    /// decoder layer, whose cache is `cache`.
    pub(crate) fn load(
        weights: &mut Weights,
        embed_tokens: &Embedding,
        hidden: i32,
        cache: LayerState,
        norm: impl Fn(&mut Weights, &str) -> Result<RmsNorm>,
        layer: impl FnOnce(&mut Weights, &str) -> Result<L>,
    ) -> Result<MtpHead<L>> {
        Ok(MtpHead {
            embed_tokens: embed_tokens.clone(),
            pre_fc_norm_embedding: norm(weights, "mtp.pre_fc_norm_embedding.weight")?,
            pre_fc_norm_hidden: norm(weights, "mtp.pre_fc_norm_hidden.weight")?,
            fc: weights.matrix("mtp.fc", hidden, 2 * hidden)?,
            layer: layer(weights, "mtp.layers.0")?,
            norm: norm(weights, "mtp.norm.weight")?,
            cache,
        })
    }

    /// Its own arrays (the embedding is the target's, counted there).
    pub(crate) fn collect_arrays(&self, out: &mut Vec<Array>) {
        self.pre_fc_norm_embedding.collect_arrays(out);
        self.pre_fc_norm_hidden.collect_arrays(out);
        self.fc.collect_arrays(out);
        self.layer.collect_arrays(out);
        self.norm.collect_arrays(out);
    }
}

impl<L: HeadLayer> DraftHead for MtpHead<L> {
    fn new_head_caches(&self) -> Result<Vec<Option<LayerCache>>> {
        Ok(vec![self.cache.new_cache(0)?])
    }

    fn forward_head(
        &self,
        batch: &Batch,
        conditioning: &Array,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        check_cache_sets(batch, caches, 1)?;
        let positions = BatchPositions::new(batch)?;
        let embedded = self
            .pre_fc_norm_embedding
            .forward(&self.embed_tokens.forward(&batch.tokens)?)?;
        let state = self.pre_fc_norm_hidden.forward(conditioning)?;
        let h = self
            .fc
            .forward(&mlx::concatenate(&[embedded, state], -1)?)?;
        let h = self.layer.forward(&h, caches, 0, batch, &positions)?;
        Ok(Forward {
            hidden: self.norm.forward(&h)?,
            conditioning: None,
        })
    }
}
