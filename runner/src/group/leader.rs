//! Rank 0's side of a split model ([`Leader`]): the engine drives it as any model, and each
//! forward is first told to every worker, so that all ranks run the same forwards over the
//! same rows in the same order.
//!
//! A worker keeps a cache per row tag and learns nothing else from rank 0's caches, so rank 0
//! refuses, before telling anyone, a forward the workers could not follow: a row starting
//! where its tag's caches do not end (caches restored from the prefix trie; not served across
//! ranks yet). Once a worker has left, every forward fails at once with the reason: MLX's ring
//! stops serving a group whose peer is gone, and waiting on it would hang the step loop.
//!
//! It offers only the text path: no image or audio side, drafter head or layer taps, whose
//! forwards the workers are not told. A split model so reads as a text model, and a request
//! with an image is refused as for any text model.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kvcache::LayerCache;
use mlx::Array;
use mlx::distributed::Group;
use nn::{Batch, Forward, Model, ModelSpec};

use crate::group::control::{Row, ToWorker};
use crate::group::rank_0::Formation;

/// How long a failed forward waits to learn which rank left.
const LOSS_NOTICE: std::time::Duration = std::time::Duration::from_secs(2);

/// Rank 0's part of a model split across a group.
pub struct Leader {
    inner: Box<dyn Model>,
    /// The forming of the group the workers loaded their parts in.
    formation: Arc<Formation>,
    group: Group,
    /// Per row tag, the position the workers' caches end at.
    ends: Mutex<HashMap<u64, usize>>,
}

impl Leader {
    /// `inner`, rank 0's part of a model the workers loaded theirs of.
    pub fn new(inner: Box<dyn Model>, formation: Arc<Formation>) -> nn::Result<Leader> {
        let group = formation.group()?;
        Ok(Leader {
            inner,
            formation,
            group,
            ends: Mutex::new(HashMap::new()),
        })
    }

    /// The rows of `batch` as the workers are told them, after checking they can follow.
    fn rows(&self, batch: &Batch) -> nn::Result<Vec<Row>> {
        if batch.row_tags.len() != batch.row_count() {
            return Err(nn::Error::Group(
                "a forward across processes needs every row's tag".into(),
            ));
        }
        let ends = self.ends.lock().unwrap_or_else(|p| p.into_inner());
        let mut rows = Vec::with_capacity(batch.row_count());
        for (&tag, &position) in batch.row_tags.iter().zip(&batch.positions) {
            let end = ends.get(&tag).copied().unwrap_or(0);
            if position > end {
                return Err(nn::Error::Group(format!(
                    "a row resumes at position {position} from caches the other ranks do not \
                     hold (restoring a cached prefix is not served across processes yet)"
                )));
            }
            rows.push(Row { tag, position });
        }
        Ok(rows)
    }
}

impl Model for Leader {
    fn spec(&self) -> &ModelSpec {
        self.inner.spec()
    }

    fn new_caches_rewindable(&self, slack: usize) -> nn::Result<Vec<Option<LayerCache>>> {
        self.inner.new_caches_rewindable(slack)
    }

    fn forward_rows(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> nn::Result<Forward> {
        if let Some(lost) = self.formation.links.lost() {
            return Err(nn::Error::Group(lost));
        }
        let rows = self.rows(batch)?;
        let width = batch.width()?;
        self.formation
            .links
            .tell(&ToWorker::Forward {
                rows: rows.clone(),
                width,
                rope_deltas: batch.rope_deltas.clone(),
            })
            .map_err(nn::Error::Group)?;
        {
            let mut ends = self.ends.lock().unwrap_or_else(|p| p.into_inner());
            for row in &rows {
                ends.insert(row.tag, row.position + width);
            }
        }
        // The workers take the tokens from rank 0 through the group. They are computed first,
        // and their sum on its own: a rank never has two collectives in flight, since MLX's
        // ring would leave one queued behind a failed one waiting forever (see `nn`'s
        // `TensorParallel::all_sum`); the tokens may depend on the last step's transfers.
        let tokens = batch.tokens.astype(mlx::Dtype::I32)?;
        mlx::eval([&tokens])?;
        let mut shared = batch.clone();
        shared.tokens = self.group.all_sum(&tokens)?;
        mlx::eval([&shared.tokens])?;
        let out = self.inner.forward_rows(&shared, caches)?;
        // Every forward's collectives start in the order the workers run them, whether or not
        // the engine reads all of its outputs.
        mlx::async_eval([&out.hidden])?;
        Ok(out)
    }

    fn unembed(&self, hidden: &Array) -> nn::Result<Array> {
        self.inner.unembed(hidden)
    }

    fn parameters(&self) -> Vec<Array> {
        self.inner.parameters()
    }

    /// The rank that left, once its control connection has closed: MLX's ring fails the
    /// forward in flight with its own words (`connection to a peer was lost`) about when the
    /// connection closes, so this waits a moment for the name.
    fn unavailable(&self) -> Option<String> {
        self.formation.links.lost_within(LOSS_NOTICE)
    }

    fn release_rows(&self, row_tags: &[u64]) -> nn::Result<()> {
        {
            let mut ends = self.ends.lock().unwrap_or_else(|p| p.into_inner());
            for tag in row_tags {
                ends.remove(tag);
            }
        }
        if self.formation.links.lost().is_some() {
            return Ok(());
        }
        self.formation
            .links
            .tell(&ToWorker::Release {
                tags: row_tags.to_vec(),
            })
            .map_err(nn::Error::Group)
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        if self.formation.links.lost().is_none() {
            let _ = self.formation.links.tell(&ToWorker::Unload);
        }
    }
}
