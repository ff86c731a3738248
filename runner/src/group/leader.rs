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

use crate::group::Parallel;
use crate::group::control::{Row, ToWorker};
use crate::group::links::Links;

/// How long a failed forward waits to learn which rank left.
const LOSS_NOTICE: std::time::Duration = std::time::Duration::from_secs(2);

/// A formed group, as rank 0 holds it: the workers' control links and MLX's group.
pub struct GroupLink {
    /// The workers' control connections.
    pub links: Links,
    group: Mutex<Group>,
    /// How models are split across it.
    pub parallel: Parallel,
}

impl GroupLink {
    /// Rank 0's view of a group formed over `links`.
    pub fn new(links: Links, group: Group, parallel: Parallel) -> GroupLink {
        GroupLink {
            links,
            group: Mutex::new(group),
            parallel,
        }
    }

    /// What `/health` and `/api/ps` say of the group: its ranks, how it splits models, and
    /// whether it serves or lost a rank (and why).
    pub fn state_json(&self) -> serde_json::Value {
        let lost = self.links.lost();
        serde_json::json!({
            "ranks": self.links.size(),
            "parallel": self.parallel.name(),
            "state": if lost.is_some() { "lost" } else { "serving" },
            "lost": lost,
        })
    }

    /// Another handle on MLX's group, for a model split across it.
    pub fn group(&self) -> mlx::Result<Group> {
        self.group
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .try_clone()
    }
}

/// Rank 0's part of a model split across a group.
pub struct Leader {
    inner: Box<dyn Model>,
    link: Arc<GroupLink>,
    group: Group,
    /// Per row tag, the position the workers' caches end at.
    ends: Mutex<HashMap<u64, usize>>,
}

impl Leader {
    /// `inner`, rank 0's part of a model the workers loaded theirs of.
    pub fn new(inner: Box<dyn Model>, link: Arc<GroupLink>) -> nn::Result<Leader> {
        let group = link.group()?;
        Ok(Leader {
            inner,
            link,
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
        if let Some(lost) = self.link.links.lost() {
            return Err(nn::Error::Group(lost));
        }
        let rows = self.rows(batch)?;
        let width = batch.width()?;
        self.link
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
        // The workers take the tokens from rank 0 through the group: a decode step's tokens
        // are still being sampled on the device, and the host never waits for them.
        let mut shared = batch.clone();
        shared.tokens = self.group.all_sum(&batch.tokens.astype(mlx::Dtype::I32)?)?;
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
        self.link.links.lost_within(LOSS_NOTICE)
    }

    fn release_rows(&self, row_tags: &[u64]) -> nn::Result<()> {
        {
            let mut ends = self.ends.lock().unwrap_or_else(|p| p.into_inner());
            for tag in row_tags {
                ends.remove(tag);
            }
        }
        if self.link.links.lost().is_some() {
            return Ok(());
        }
        self.link
            .links
            .tell(&ToWorker::Release {
                tags: row_tags.to_vec(),
            })
            .map_err(nn::Error::Group)
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        if self.link.links.lost().is_none() {
            let _ = self.link.links.tell(&ToWorker::Unload);
        }
    }
}
