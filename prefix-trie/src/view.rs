//! Read-only views of nodes, for statistics, debugging and tests.

use crate::key::Key;
use crate::node::NodeId;
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
    /// Whether the live path ends here.
    pub frontier: bool,
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
        self.nodes.iter().map(|(id, node)| NodeView {
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
            frontier: id == self.frontier,
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
