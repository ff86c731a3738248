//! Read-only views of nodes, for statistics, debugging and tests.

use crate::key::Key;
use crate::node::NodeId;
use crate::session::SessionId;
use crate::snapshot::Snapshot;
use crate::trie::PrefixTrie;

/// One node as seen from outside.
#[derive(Debug)]
pub struct NodeView<'a, S> {
    /// The node's id (valid until the trie changes).
    pub id: NodeId,
    /// The parent, `None` for the root.
    pub parent: Option<NodeId>,
    /// How many children it has.
    pub children: usize,
    /// Offset of the first key of the edge.
    pub start: usize,
    /// The keys of the edge.
    pub keys: &'a [Key],
    /// One entry per layer.
    pub snapshots: Vec<Option<&'a S>>,
    /// Whether it is a scheduled restore point (resists compaction).
    pub checkpoint: bool,
    /// The live sessions whose path ends here.
    pub frontier_of: Vec<SessionId>,
    /// Whether eviction and compaction leave the node in place: it is some live session's
    /// restore node or frontier.
    pub pinned: bool,
}

impl<S> NodeView<'_, S> {
    /// Offset just past the edge.
    pub fn end(&self) -> usize {
        self.start + self.keys.len()
    }
}

impl<S: Snapshot> PrefixTrie<S> {
    /// Every node, the root included, in no particular order.
    pub fn nodes(&self) -> impl Iterator<Item = NodeView<'_, S>> {
        let pinned = self.pinned();
        self.nodes.iter().map(move |(id, node)| NodeView {
            id,
            parent: node.parent,
            children: node.children.len(),
            start: node.start,
            keys: &node.keys,
            snapshots: node
                .snapshots
                .iter()
                .map(|slot| slot.as_ref().map(|s| &s.snapshot))
                .collect(),
            checkpoint: node.checkpoint,
            frontier_of: self
                .sessions
                .iter()
                .filter(|(_, session)| session.frontier == id)
                .map(|(&session, _)| session)
                .collect(),
            pinned: pinned.contains(&id),
        })
    }

    /// The keys from the root to the end of `id`'s edge, or `None` for an unknown id.
    pub fn path_keys(&self, id: NodeId) -> Option<Vec<Key>> {
        self.nodes.get(id)?;
        let mut keys = Vec::new();
        for node in self.path_to(id) {
            keys.extend_from_slice(&self.nodes[node].keys);
        }
        Some(keys)
    }
}
