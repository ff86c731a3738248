//! Longest match, the restore point, and the snapshots a session restores from.

use crate::error::{Error, Result};
use crate::key::Key;
use crate::node::NodeId;
use crate::prompt::{Prompt, span_containing};
use crate::session::SessionId;
use crate::snapshot::{LayerKind, Snapshot};
use crate::trie::PrefixTrie;

/// How much of a prompt the trie holds and where a request for it would resume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatchInfo {
    /// How many prompt keys the trie holds.
    pub matched: usize,
    /// The deepest offset every layer can restore to (see [`crate::Begin::restore_at`]).
    pub restore_at: usize,
}

/// How one layer's cache gets back to the restore point.
#[derive(Debug)]
pub enum LayerRestore<'a, S> {
    /// The layer keeps no state.
    Stateless,
    /// The restore point is offset zero: start from an empty cache.
    Empty,
    /// Load these range snapshots in order; together they cover `0..restore_at` exactly.
    Range(Vec<&'a S>),
    /// Load this whole state, taken at exactly `restore_at`.
    Point(&'a S),
}

/// A matched path: the nodes below the root the prompt walks into (the last one possibly only
/// partway), how many keys matched, and where the request can resume.
pub(crate) struct FoundPath {
    pub path: Vec<NodeId>,
    pub matched: usize,
    pub restore_at: usize,
}

impl<S: Snapshot> PrefixTrie<S> {
    /// Matches a prompt without changing anything.
    pub fn find(&self, prompt: &Prompt) -> Result<MatchInfo> {
        let found = self.find_path(prompt)?;
        Ok(MatchInfo {
            matched: found.matched,
            restore_at: found.restore_at,
        })
    }

    /// The snapshots that bring each layer of a fresh cache to the session's restore point.
    ///
    /// The engine calls it right after `begin`; it stays valid for the whole session, since
    /// nothing on the path to a live session's restore point is removed or loses a layer
    /// (other sessions' closes and evictions only concatenate range snapshots there). Fails
    /// when the session is not live, or with [`Error::RestoreUnavailable`] when a snapshot
    /// merge failed on that path since `begin`.
    pub fn restore_plan(&self, session: SessionId) -> Result<Vec<LayerRestore<'_, S>>> {
        let restore_node = self.session(session)?.restore_node;
        let path = self.path_to(restore_node);
        let below_root = &path[1..];
        let mut plan = Vec::with_capacity(self.config.layers.len());
        for (layer, kind) in self.config.layers.iter().enumerate() {
            let step = match kind {
                LayerKind::Stateless => LayerRestore::Stateless,
                _ if below_root.is_empty() => LayerRestore::Empty,
                LayerKind::Range => {
                    let mut segments = Vec::with_capacity(below_root.len());
                    for &id in below_root {
                        segments.push(self.snapshot_of(session, id, layer)?);
                    }
                    LayerRestore::Range(segments)
                }
                LayerKind::Point => {
                    LayerRestore::Point(self.snapshot_of(session, restore_node, layer)?)
                }
            };
            plan.push(step);
        }
        Ok(plan)
    }

    fn snapshot_of(&self, session: SessionId, id: NodeId, layer: usize) -> Result<&S> {
        match &self.nodes[id].snapshots[layer] {
            Some(stored) => Ok(&stored.snapshot),
            None => Err(Error::RestoreUnavailable {
                session,
                node: id.index(),
                layer,
            }),
        }
    }

    pub(crate) fn find_path(&self, prompt: &Prompt) -> Result<FoundPath> {
        if prompt.lookahead() != self.config.lookahead {
            return Err(Error::LookaheadMismatch {
                trie: self.config.lookahead.tokens(),
                prompt: prompt.lookahead().tokens(),
            });
        }
        let (path, matched) = self.walk(prompt.keys());
        let restore_at = self.restore_point(&path, matched, prompt);
        Ok(FoundPath {
            path,
            matched,
            restore_at,
        })
    }

    /// Follows `keys` from the root as far as stored edges agree with them.
    pub(crate) fn walk(&self, keys: &[Key]) -> (Vec<NodeId>, usize) {
        let mut path = Vec::new();
        let mut node = self.root;
        let mut offset = 0;
        while let Some(&next_key) = keys.get(offset) {
            let Some(child) = self.child_starting_with(node, next_key) else {
                break;
            };
            let edge = &self.nodes[child].keys;
            let common = common_prefix(edge, &keys[offset..]);
            path.push(child);
            offset += common;
            if common < edge.len() {
                break;
            }
            node = child;
        }
        (path, offset)
    }

    pub(crate) fn child_starting_with(&self, node: NodeId, key: Key) -> Option<NodeId> {
        let children = &self.nodes[node].children;
        children
            .iter()
            .copied()
            .find(|&child| self.nodes[child].keys.first() == Some(&key))
    }

    /// The deepest offset at most `matched` (and the prompt's resume limit) where every layer
    /// can restore and no non-causal item is cut.
    fn restore_point(&self, path: &[NodeId], matched: usize, prompt: &Prompt) -> usize {
        let mut at = matched.min(prompt.resume_limit());
        // Range layers restore anywhere inside the run of covered edges from the root.
        // Point layers restore only at the ends of nodes holding their state (or at zero).
        let mut point_ends: Vec<Vec<usize>> = Vec::new();
        for (layer, kind) in self.config.layers.iter().enumerate() {
            match kind {
                LayerKind::Stateless => {}
                LayerKind::Range => {
                    let covered = path
                        .iter()
                        .take_while(|&&id| self.nodes[id].snapshots[layer].is_some())
                        .last()
                        .map_or(0, |&id| self.nodes[id].end());
                    at = at.min(covered);
                }
                LayerKind::Point => {
                    let mut ends = vec![0];
                    ends.extend(
                        path.iter()
                            .filter(|&&id| self.nodes[id].snapshots[layer].is_some())
                            .map(|&id| self.nodes[id].end()),
                    );
                    point_ends.push(ends);
                }
            }
        }
        loop {
            let mut next = at;
            for ends in &point_ends {
                let deepest = ends.partition_point(|&end| end <= at);
                next = next.min(ends[deepest.saturating_sub(1)]);
            }
            if let Some(span) = span_containing(prompt.non_causal(), next) {
                next = span.start;
            }
            if next == at {
                return at;
            }
            at = next;
        }
    }
}

pub(crate) fn common_prefix(a: &[Key], b: &[Key]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
