//! Structural edits: splitting an edge, merging a node into its only child, growing a
//! session's path, and compacting it.
//!
//! Every edit keeps the rule that a range snapshot covers exactly its node's edge and a point
//! snapshot sits at its node's end. When a snapshot's own split or merge fails, the edit still
//! completes without that layer on the nodes concerned and the error is returned afterwards.

use crate::error::{Error, Result};
use crate::node::{Node, NodeId, Stored};
use crate::restore::common_prefix;
use crate::session::SessionId;
use crate::snapshot::{LayerKind, Snapshot};
use crate::trie::PrefixTrie;

impl<S: Snapshot> PrefixTrie<S> {
    /// Splits `id` at `at` (strictly inside its edge). The existing id keeps the tail, so ids
    /// held elsewhere (sessions' frontiers and restore nodes) stay valid; the new head is returned.
    pub(crate) fn split(&mut self, id: NodeId, at: usize) -> Result<NodeId> {
        let layer_count = self.config.layers.len();
        let (head_keys, start, parent, last_used, tail_snapshots) = {
            let node = &mut self.nodes[id];
            let cut = at - node.start;
            let head_keys: Vec<_> = node.keys.drain(..cut).collect();
            let start = node.start;
            node.start = at;
            let snapshots = std::mem::replace(
                &mut node.snapshots,
                (0..layer_count).map(|_| None).collect(),
            );
            (head_keys, start, node.parent, node.last_used, snapshots)
        };
        let mut head_snapshots: Vec<Option<Stored<S>>> = (0..layer_count).map(|_| None).collect();
        let mut tail_snapshots = tail_snapshots;
        let mut failure = None;
        for layer in 0..layer_count {
            if self.config.layers[layer] != LayerKind::Range {
                continue;
            }
            let Some(stored) = tail_snapshots[layer].take() else {
                continue;
            };
            self.bytes -= stored.bytes;
            match stored.snapshot.split(at) {
                Ok((head, tail)) => {
                    head_snapshots[layer] = Some(self.store(head));
                    tail_snapshots[layer] = Some(self.store(tail));
                }
                Err(error) => {
                    failure.get_or_insert(Error::Snapshot {
                        op: "split",
                        layer,
                        source: Box::new(error),
                    });
                }
            }
        }
        self.nodes[id].snapshots = tail_snapshots;
        let head = self.nodes.insert(Node {
            keys: head_keys,
            start,
            parent,
            children: vec![id],
            last_used,
            checkpoint: false,
            snapshots: head_snapshots,
        });
        self.nodes[id].parent = Some(head);
        if let Some(parent) = parent {
            self.replace_child(parent, id, head);
        }
        failure.map_or(Ok(head), Err)
    }

    /// Merges `upper` into its only child; the child keeps its id and takes the upper's edge.
    /// Range snapshots concatenate when both nodes have them and are dropped otherwise; point
    /// snapshots keep the child's.
    pub(crate) fn merge_into_child(&mut self, upper: NodeId) -> Result<NodeId> {
        let Some(removed) = self.nodes.remove(upper) else {
            return Err(Error::Invariant(format!(
                "merging missing node {}",
                upper.index()
            )));
        };
        let [lower] = removed.children[..] else {
            return Err(Error::Invariant(format!(
                "merging node {} with {} children",
                upper.index(),
                removed.children.len()
            )));
        };
        let mut failure = None;
        for (layer, upper_snapshot) in removed.snapshots.into_iter().enumerate() {
            if let Some(stored) = &upper_snapshot {
                self.bytes -= stored.bytes;
            }
            if self.config.layers[layer] != LayerKind::Range {
                continue;
            }
            let lower_snapshot = self.nodes[lower].snapshots[layer].take();
            match (upper_snapshot, lower_snapshot) {
                (Some(earlier), Some(later)) => {
                    self.bytes -= later.bytes;
                    match earlier.snapshot.merge(later.snapshot) {
                        Ok(merged) => {
                            let stored = self.store(merged);
                            self.nodes[lower].snapshots[layer] = Some(stored);
                        }
                        Err(error) => {
                            failure.get_or_insert(Error::Snapshot {
                                op: "merge",
                                layer,
                                source: Box::new(error),
                            });
                        }
                    }
                }
                (_, Some(alone)) => self.bytes -= alone.bytes,
                _ => {}
            }
        }
        let mut keys = removed.keys;
        let node = &mut self.nodes[lower];
        keys.append(&mut node.keys);
        node.keys = keys;
        node.start = removed.start;
        node.parent = removed.parent;
        node.last_used = node.last_used.max(removed.last_used);
        if let Some(parent) = removed.parent {
            self.replace_child(parent, upper, lower);
        }
        failure.map_or(Ok(lower), Err)
    }

    /// Removes a leaf and its snapshots.
    pub(crate) fn remove_leaf(&mut self, id: NodeId) {
        if let Some(node) = self.nodes.remove(id) {
            self.bytes -= node.bytes();
            if let Some(parent) = node.parent {
                self.nodes[parent].children.retain(|&child| child != id);
            }
        }
    }

    /// The node of `root + path` ending exactly at `offset`, splitting the one it falls inside.
    pub(crate) fn boundary_on_path(&mut self, path: &[NodeId], offset: usize) -> Result<NodeId> {
        if offset == 0 {
            return Ok(self.root);
        }
        for &id in path {
            let node = &self.nodes[id];
            if node.end() == offset {
                return Ok(id);
            }
            if node.start < offset && offset < node.end() {
                return self.split(id, offset);
            }
        }
        Err(Error::Invariant(format!(
            "offset {offset} is not on the matched path"
        )))
    }

    /// Makes `offset` a node boundary on the session's path and returns the node ending there.
    /// Past the session's frontier the path grows along its keys, walking into stored nodes
    /// that agree (another session's included) and splitting the edge where they stop
    /// agreeing; the frontier moves there. Nodes ending at a scheduled offset become
    /// checkpoints.
    pub(crate) fn session_boundary(&mut self, session: SessionId, offset: usize) -> Result<NodeId> {
        let frontier = self.session(session)?.frontier;
        let node = if offset <= self.nodes[frontier].end() {
            let path = self.path_to(frontier);
            self.boundary_on_path(&path[1..], offset)?
        } else {
            let grown = self.grow_frontier(session, offset)?;
            self.session_mut(session)?.frontier = grown;
            grown
        };
        let checkpoints = &self.session(session)?.checkpoints;
        if checkpoints.binary_search(&offset).is_ok() {
            self.nodes[node].checkpoint = true;
        }
        Ok(node)
    }

    fn grow_frontier(&mut self, session: SessionId, offset: usize) -> Result<NodeId> {
        let live = self.session(session)?;
        let mut cursor = live.frontier;
        let mut position = self.nodes[cursor].end();
        let Some(keys) = live.keys.get(position..offset) else {
            return Err(Error::CacheAheadOfKeys {
                rest_at: offset,
                keys: live.keys.len(),
            });
        };
        // Only the part past the frontier is copied; the prompt may be 100k keys long.
        let keys = keys.to_vec();
        let base = position;
        while position < offset {
            let remaining = &keys[position - base..];
            let Some(child) = self.child_starting_with(cursor, remaining[0]) else {
                let fresh = self.nodes.insert(Node {
                    keys: remaining.to_vec(),
                    start: position,
                    parent: Some(cursor),
                    children: Vec::new(),
                    last_used: self.clock,
                    checkpoint: false,
                    snapshots: self.config.layers.iter().map(|_| None).collect(),
                });
                self.nodes[cursor].children.push(fresh);
                return Ok(fresh);
            };
            let common = common_prefix(&self.nodes[child].keys, remaining);
            if common == self.nodes[child].keys.len() {
                cursor = child;
            } else {
                cursor = self.split(child, position + common)?;
            }
            position += common;
        }
        Ok(cursor)
    }

    /// Merges each non-checkpoint node on the path to `frontier` into its only child, from
    /// `frontier` up to the root, so one request's segments become one edge. Live sessions'
    /// restore nodes and frontiers are never merged away.
    pub(crate) fn compact_path(&mut self, frontier: NodeId) -> Result<usize> {
        let pinned = self.pinned();
        let mut merged = 0;
        let mut cursor = frontier;
        while let Some(parent) = self.nodes[cursor].parent {
            let upper = &self.nodes[parent];
            if parent != self.root
                && upper.children.len() == 1
                && !upper.checkpoint
                && !pinned.contains(&parent)
            {
                self.merge_into_child(parent)?;
                merged += 1;
            } else {
                cursor = parent;
            }
        }
        Ok(merged)
    }

    pub(crate) fn store(&mut self, snapshot: S) -> Stored<S> {
        let bytes = snapshot.bytes();
        self.bytes += bytes;
        Stored { snapshot, bytes }
    }

    fn replace_child(&mut self, parent: NodeId, old: NodeId, new: NodeId) {
        for child in &mut self.nodes[parent].children {
            if *child == old {
                *child = new;
            }
        }
    }
}
