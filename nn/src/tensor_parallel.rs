//! Tensor parallelism: one model split across the ranks of a group (Megatron-LM's layout, as
//! mlx-lm's `shard_linear` does it). A column-parallel projection holds this rank's slice of
//! its output rows, so it computes this rank's heads or MLP columns alone; the row-parallel
//! projection after it holds the matching slice of its input columns, and its partial products
//! are summed over the group ([`crate::linear::Linear::forward`]). Attention splits its heads
//! and key/value heads evenly (each rank's KV cache is ~1/N), an MLP its hidden columns;
//! norms, embeddings and the output head stay whole on every rank.
//!
//! Layers decide how they shard: a loader asks [`crate::Weights::column_parallel`] and
//! [`crate::Weights::row_parallel`] for its projections and [`TensorParallel::part`] for its
//! head counts, and gets the whole model when no group is set.

use std::sync::{Arc, Mutex};

use mlx::Array;
use mlx::distributed::Group;

use crate::{Error, Result};

/// This process's place in a tensor-parallel group.
#[derive(Debug, Clone)]
pub struct TensorParallel {
    rank: usize,
    size: usize,
    group: Arc<Mutex<Group>>,
}

impl TensorParallel {
    /// This process's place in `group`.
    pub fn new(group: Group) -> Result<TensorParallel> {
        Ok(TensorParallel {
            rank: group.rank()?,
            size: group.size()?,
            group: Arc::new(Mutex::new(group)),
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks share the model.
    pub fn size(&self) -> usize {
        self.size
    }

    /// This rank's share of `n` `what` (heads, rows): `n / size`, which must be whole.
    pub fn part(&self, n: usize, what: &str) -> Result<usize> {
        if self.size == 0 || !n.is_multiple_of(self.size) {
            return Err(Error::Config(format!(
                "{n} {what} do not split evenly over {} ranks",
                self.size
            )));
        }
        Ok(n / self.size)
    }

    /// The range of `n` items this rank holds.
    pub(crate) fn slice(&self, n: i32, what: &str) -> Result<(i32, i32)> {
        let n = usize::try_from(n).unwrap_or(0);
        let part = self.part(n, what)?;
        let start = self.rank * part;
        Ok((start as i32, (start + part) as i32))
    }

    /// `x` summed over every rank, computed now.
    ///
    /// Computed now, with what it is made from, so that a rank never has two collectives in
    /// flight: MLX's ring gives up on a peer's connection once it fails, and a collective
    /// queued behind the one that failed would wait on it forever, and the process with it.
    /// One at a time, a rank gone fails the forward instead. The cost is a wait on the device
    /// at each of these sums, two a layer.
    pub(crate) fn all_sum(&self, x: &Array) -> Result<Array> {
        let group = self
            .group
            .lock()
            .map_err(|_| Error::InvalidInput("the tensor-parallel group was poisoned".into()))?;
        let summed = group.all_sum(x)?;
        mlx::eval([&summed])?;
        Ok(summed)
    }
}
