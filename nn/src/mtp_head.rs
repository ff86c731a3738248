//! `MtpHead`: a multi-token-prediction head in the layout Qwen3.5 ships under `mtp.*` and
//! DeepSeek-V3 (and GLM-4-MoE-Lite) under the decoder layer after its last ([`HeadNames`]):
//! the next token's embedding and the target's state, each RMS-normed, side by side
//! (embedding first) through a projection, one decoder layer of the family's own kind, and a
//! final norm. Embedding and output head are the target's.
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

/// Where a checkpoint keeps its head's tensors, and the one way the layouts' forwards differ.
pub(crate) struct HeadNames {
    embedding_norm: String,
    hidden_norm: String,
    projection: String,
    /// The prefix of the decoder layer's own tensors.
    layer: String,
    final_norm: String,
    /// DeepSeek-V3's head reads a zero embedding at position 0 (vLLM's `deepseek_mtp`, the
    /// reference serving stack for these checkpoints, masks it; the position has no previous
    /// token whose state the pair would join).
    zero_first_embedding: bool,
}

impl HeadNames {
    /// Qwen3.5's `mtp.*`, which an attached head (`nn::load::load_with_head`) also uses.
    pub(crate) fn mtp() -> HeadNames {
        HeadNames {
            embedding_norm: "mtp.pre_fc_norm_embedding.weight".into(),
            hidden_norm: "mtp.pre_fc_norm_hidden.weight".into(),
            projection: "mtp.fc".into(),
            layer: "mtp.layers.0".into(),
            final_norm: "mtp.norm.weight".into(),
            zero_first_embedding: false,
        }
    }

    /// DeepSeek-V3's next-token-prediction layer `model.layers.{index}`: `enorm`, `hnorm`,
    /// `eh_proj` and `shared_head.norm` beside the layer's own tensors. Its copies of the
    /// embedding and output head (`embed_tokens`, `shared_head.head`) are the target's and
    /// are not read.
    pub(crate) fn next_n(index: usize) -> HeadNames {
        let p = format!("model.layers.{index}");
        HeadNames {
            embedding_norm: format!("{p}.enorm.weight"),
            hidden_norm: format!("{p}.hnorm.weight"),
            projection: format!("{p}.eh_proj"),
            final_norm: format!("{p}.shared_head.norm.weight"),
            layer: p,
            zero_first_embedding: true,
        }
    }

    /// Whether `weights` carry a head under these names.
    pub(crate) fn present(&self, weights: &Weights) -> bool {
        weights.contains(&format!("{}.weight", self.projection))
    }

    /// The prefix of the head's decoder layer.
    pub(crate) fn layer(&self) -> &str {
        &self.layer
    }
}

/// A head's tensors.
pub(crate) struct MtpHead<L> {
    /// The target's token embedding.
    embed_tokens: Embedding,
    pre_fc_norm_embedding: RmsNorm,
    pre_fc_norm_hidden: RmsNorm,
    fc: Linear,
    layer: L,
    norm: RmsNorm,
    cache: LayerState,
    zero_first_embedding: bool,
}

impl<L: HeadLayer> MtpHead<L> {
    /// Reads the head named by `names` beside the target's `embed_tokens`:
    /// `norm(weights, name)` reads each norm the family's way (Qwen3.5's unit offset),
    /// `layer(weights, names.layer())` its decoder layer, whose cache is `cache`.
    pub(crate) fn load(
        weights: &mut Weights,
        names: &HeadNames,
        embed_tokens: &Embedding,
        hidden: i32,
        cache: LayerState,
        norm: impl Fn(&mut Weights, &str) -> Result<RmsNorm>,
        layer: impl FnOnce(&mut Weights, &str) -> Result<L>,
    ) -> Result<MtpHead<L>> {
        Ok(MtpHead {
            embed_tokens: embed_tokens.clone(),
            pre_fc_norm_embedding: norm(weights, &names.embedding_norm)?,
            pre_fc_norm_hidden: norm(weights, &names.hidden_norm)?,
            fc: weights.matrix(&names.projection, hidden, 2 * hidden)?,
            layer: layer(weights, &names.layer)?,
            norm: norm(weights, &names.final_norm)?,
            cache,
            zero_first_embedding: names.zero_first_embedding,
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
        let mut embedded = self.embed_tokens.forward(&batch.tokens)?;
        if self.zero_first_embedding {
            embedded = zero_first_position(embedded, batch)?;
        }
        let embedded = self.pre_fc_norm_embedding.forward(&embedded)?;
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

/// `embedded` (`[rows, tokens, hidden]`) with the token at position 0 zeroed: only a row
/// whose first position is 0 has one, so a decode step (every row past 0) is returned as is.
fn zero_first_position(embedded: Array, batch: &Batch) -> Result<Array> {
    if !batch.positions.contains(&0) {
        return Ok(embedded);
    }
    let shape = embedded.shape();
    let (rows, tokens) = (shape[0], shape[1]);
    let mut keep = vec![1.0f32; (rows * tokens) as usize];
    for (row, &first) in batch.positions.iter().enumerate() {
        if first == 0 {
            keep[row * tokens as usize] = 0.0;
        }
    }
    let keep = Array::from_slice(&keep, &[rows, tokens, 1])?.astype(embedded.dtype())?;
    Ok(embedded.multiply(&keep)?)
}
