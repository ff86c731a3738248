//! Least-recently-used eviction under a byte budget.

use std::cmp::Reverse;
use std::collections::HashSet;

use crate::error::Result;
use crate::node::NodeId;
use crate::snapshot::{LayerKind, Snapshot};
use crate::trie::PrefixTrie;

/// What `evict` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvictReport {
    /// Leaves removed with their snapshots.
    pub removed: usize,
    /// Interior nodes merged into their only child.
    pub merged: usize,
    /// Bytes released.
    pub freed: usize,
    /// Bytes held afterwards. Above the budget only when every remaining byte is protected
    /// (live sessions' restore nodes and frontiers, branch points, or range state the nodes
    /// below still need).
    pub bytes: usize,
}

impl<S: Snapshot> PrefixTrie<S> {
    /// Releases snapshots until the trie holds at most `budget` bytes.
    ///
    /// Byte counts are re-read first (lazy snapshots may have been copied out). Every node but
    /// the root, branch points (more than one child) and the nodes live sessions are pinned to
    /// (each one's restore node and frontier) is a candidate, on a live path or not; the least
    /// recently used goes first, then the deepest, then the largest. A leaf is removed. A node
    /// with one child is merged into it: its point snapshots go and its range snapshots join
    /// the child's, so an evicted turn costs only its restore point, and a request for it
    /// resumes at the newest checkpoint before. Candidates whose eviction would release nothing
    /// are skipped.
    ///
    /// Live sessions stay intact: the nodes of a live path other than its restore node and
    /// frontier all have a child on that path, so they are never removed, only merged into it,
    /// which keeps the path's keys, every id a session holds, and (since every node up to a
    /// restore point holds every range layer) each session's restore plan. A range snapshot
    /// dropped from a live path past its restore point is paged out again at its close.
    ///
    /// Fails when a snapshot merge fails; the trie stays consistent.
    pub fn evict(&mut self, budget: usize) -> Result<EvictReport> {
        let before = self.resync_bytes();
        // Eviction never removes or merges away a pinned node, so the set stays valid.
        let pinned = self.pinned();
        let mut report = EvictReport::default();
        while self.bytes > budget {
            let Some(victim) = self.eviction_candidate(&pinned) else {
                break;
            };
            if self.nodes[victim].children.is_empty() {
                self.remove_leaf(victim);
                report.removed += 1;
            } else {
                self.merge_into_child(victim)?;
                report.merged += 1;
            }
        }
        report.bytes = self.bytes;
        report.freed = before.saturating_sub(self.bytes);
        Ok(report)
    }

    fn eviction_candidate(&self, pinned: &HashSet<NodeId>) -> Option<NodeId> {
        self.nodes
            .iter()
            .filter(|&(id, node)| {
                id != self.root && !pinned.contains(&id) && node.children.len() <= 1
            })
            .filter(|&(id, _)| self.bytes_released_by_evicting(id) > 0)
            .min_by_key(|&(_, node)| (node.last_used, Reverse(node.end()), Reverse(node.bytes())))
            .map(|(id, _)| id)
    }

    /// Bytes evicting `id` releases: all of a leaf's; for a node with one child, its point
    /// snapshots plus range snapshots the merge must drop because only one side has them.
    fn bytes_released_by_evicting(&self, id: NodeId) -> usize {
        let node = &self.nodes[id];
        let [child] = node.children[..] else {
            return node.bytes();
        };
        let child = &self.nodes[child];
        let mut released = 0;
        for (layer, kind) in self.config.layers.iter().enumerate() {
            let upper = node.snapshots[layer].as_ref().map(|stored| stored.bytes);
            let lower = child.snapshots[layer].as_ref().map(|stored| stored.bytes);
            released += match (kind, upper, lower) {
                (LayerKind::Range, Some(_), Some(_)) => 0,
                (LayerKind::Range, upper, lower) => upper.unwrap_or(0) + lower.unwrap_or(0),
                (_, upper, _) => upper.unwrap_or(0),
            };
        }
        released
    }
}
