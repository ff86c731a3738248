//! Pipeline parallelism: one model's layers split into contiguous ranges, one per rank of a
//! group (as mlx-lm's pipeline splits them). Each rank holds only its range's layers and their
//! caches; a forward passes the hidden states from rank to rank (MLX's `send`/`recv`), and the
//! last rank sends its final, normed states back to rank 0, which alone unembeds and samples.
//! Each layer runs whole on one rank, so the arithmetic is exactly one process's.
//!
//! A family splits by asking [`crate::Weights::pipeline_stage`] which layers to read and
//! running its forward through [`PipelineStage::forward`].

use std::ops::Range;
use std::sync::{Arc, Mutex};

use mlx::distributed::Group;
use mlx::{Array, Dtype};

use crate::model::{LayerState, ModelSpec};
use crate::{Error, Result};

/// This process's stage of a pipeline.
#[derive(Debug, Clone)]
pub struct PipelineStage {
    rank: usize,
    size: usize,
    layers: Range<usize>,
    group: Arc<Mutex<Group>>,
}

impl PipelineStage {
    /// This process's stage in `group` of a model of `layers` layers: an even, contiguous share
    /// of them (the first ranks take one more when they do not divide). Every rank must hold
    /// at least one layer.
    pub fn new(group: Group, layers: usize) -> Result<PipelineStage> {
        let (rank, size) = (group.rank()?, group.size()?);
        if size == 0 || layers < size {
            return Err(Error::Config(format!(
                "{layers} layers cannot be split over {size} pipeline ranks"
            )));
        }
        let (base, extra) = (layers / size, layers % size);
        let start = rank * base + rank.min(extra);
        let end = start + base + usize::from(rank < extra);
        Ok(PipelineStage {
            rank,
            size,
            layers: start..end,
            group: Arc::new(Mutex::new(group)),
        })
    }

    /// The layers this rank holds.
    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Whether this rank embeds the tokens and unembeds the final states: rank 0 only, where
    /// the pipeline starts and ends. The others need neither the token table nor the head.
    pub fn holds_ends(&self) -> bool {
        self.rank == 0
    }

    /// What a rank past the first passes [`PipelineStage::forward`] for input embeddings:
    /// zeros shaped as the states it receives (`[rows, tokens, hidden]`, in `dtype`), of
    /// which only the shape and dtype are read.
    pub(crate) fn states_like(tokens: &Array, hidden: i32, dtype: Dtype) -> Result<Array> {
        let mut shape = tokens.shape();
        shape.push(hidden);
        Ok(Array::zeros(&shape, dtype)?)
    }

    /// Whether this rank holds layer `layer`.
    pub fn holds(&self, layer: usize) -> bool {
        self.layers.contains(&layer)
    }

    /// Marks every layer of `spec` outside this rank's range stateless: only this rank's
    /// layers keep caches here.
    pub(crate) fn keep_own_caches(&self, spec: &mut ModelSpec) {
        for (i, state) in spec.layers.iter_mut().enumerate() {
            if !self.holds(i) {
                *state = LayerState::Stateless;
            }
        }
    }

    /// One forward through the pipeline. `embedded` is rank 0's input (and every rank's shape
    /// and dtype of the states passed along); `layers` runs this rank's range over the states
    /// it receives; `norm` is the final norm, run by the last rank. Rank 0 returns the final
    /// states, the others what they sent.
    pub fn forward(
        &self,
        embedded: Array,
        layers: impl FnOnce(Array) -> Result<Array>,
        norm: impl FnOnce(&Array) -> Result<Array>,
    ) -> Result<Array> {
        let group = self
            .group
            .lock()
            .map_err(|_| Error::InvalidInput("the pipeline group was poisoned".into()))?;
        let last = self.size - 1;
        // Each transfer is computed on its own: a collective queued behind one that failed
        // would wait forever in MLX's ring (see `TensorParallel::all_sum`).
        let input = match self.rank {
            0 => embedded,
            rank => {
                let received = group.recv_like(&embedded, rank - 1)?;
                mlx::eval([&received])?;
                received
            }
        };
        let h = layers(input)?;
        if self.rank < last {
            // Sent before anything waits on the answer: a receive does not depend on it.
            mlx::eval([&group.send(&h, self.rank + 1)?])?;
            return match self.rank {
                0 => Ok(group.recv_like(&h, last)?),
                _ => Ok(h),
            };
        }
        let out = norm(&h)?;
        if self.rank == 0 {
            return Ok(out);
        }
        let sent = group.send(&out, 0)?;
        mlx::eval([&sent])?;
        Ok(out)
    }
}

/// Runs a model's decoder layers over `h`, its input embeddings, then its final `norm`: over a
/// pipeline when `stage` is set (this rank's range, `layers` holding just those, and every
/// layer run), else the first `depth` of `layers` in this process. `layer` runs one layer,
/// given its index in the whole model.
pub(crate) fn run_decoder<L>(
    stage: Option<&PipelineStage>,
    h: Array,
    layers: &[L],
    depth: usize,
    total: usize,
    mut layer: impl FnMut(&L, Array, usize) -> Result<Array>,
    norm: impl FnOnce(&Array) -> Result<Array>,
) -> Result<Array> {
    let Some(stage) = stage else {
        let mut h = h;
        for (i, l) in layers.iter().enumerate().take(depth) {
            h = layer(l, h, i)?;
        }
        return norm(&h);
    };
    if depth != total {
        return Err(Error::InvalidInput(
            "a pipeline stage runs its whole range of layers".into(),
        ));
    }
    let first = stage.layers().start;
    stage.forward(
        h,
        |mut h| {
            for (i, l) in layers.iter().enumerate() {
                h = layer(l, h, first + i)?;
            }
            Ok(h)
        },
        norm,
    )
}
