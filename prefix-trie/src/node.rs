//! Trie nodes and the arena that owns them.

use std::ops::{Index, IndexMut};

use crate::key::Key;

/// Names a node for as long as it exists. Ids of removed nodes are reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(u32);

impl NodeId {
    /// The arena index, for dumps.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A snapshot the trie owns, with the byte count last read from it.
#[derive(Clone)]
pub(crate) struct Stored<S> {
    pub snapshot: S,
    pub bytes: usize,
}

/// One compressed edge and the per-layer snapshots taken at it.
#[derive(Clone)]
pub(crate) struct Node<S> {
    /// The keys of the edge from the parent's end to this node's end.
    pub keys: Vec<Key>,
    /// Offset of the first key of the edge.
    pub start: usize,
    pub parent: Option<NodeId>,
    pub children: Vec<NodeId>,
    /// Logical clock of the last request that ended its restore or its recording here.
    pub last_used: u64,
    /// Scheduled restore points resist compaction into the next node.
    pub checkpoint: bool,
    /// One slot per layer; a range snapshot covers exactly `start..end`, a point one `end`.
    pub snapshots: Vec<Option<Stored<S>>>,
}

impl<S> Node<S> {
    pub fn end(&self) -> usize {
        self.start + self.keys.len()
    }

    pub fn bytes(&self) -> usize {
        self.snapshots
            .iter()
            .flatten()
            .map(|stored| stored.bytes)
            .sum()
    }
}

/// Nodes by id, with a free list so ids stay small.
#[derive(Clone)]
pub(crate) struct Arena<S> {
    slots: Vec<Option<Node<S>>>,
    free: Vec<u32>,
    live: usize,
}

impl<S> Arena<S> {
    pub fn new() -> Self {
        Arena {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }

    pub fn insert(&mut self, node: Node<S>) -> NodeId {
        self.live += 1;
        if let Some(index) = self.free.pop() {
            self.slots[index as usize] = Some(node);
            NodeId(index)
        } else {
            let index = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
            self.slots.push(Some(node));
            NodeId(index)
        }
    }

    pub fn remove(&mut self, id: NodeId) -> Option<Node<S>> {
        let node = self.slots.get_mut(id.index())?.take()?;
        self.free.push(id.0);
        self.live -= 1;
        Some(node)
    }

    pub fn get(&self, id: NodeId) -> Option<&Node<S>> {
        self.slots.get(id.index())?.as_ref()
    }

    pub fn len(&self) -> usize {
        self.live
    }

    pub fn iter(&self) -> impl Iterator<Item = (NodeId, &Node<S>)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(index, slot)| Some((NodeId(index as u32), slot.as_ref()?)))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Node<S>> {
        self.slots.iter_mut().flatten()
    }
}

impl<S> Index<NodeId> for Arena<S> {
    type Output = Node<S>;

    /// Ids the trie hands around always name live nodes; a stale id is a bug in this crate.
    fn index(&self, id: NodeId) -> &Node<S> {
        match self.get(id) {
            Some(node) => node,
            None => panic!("prefix trie bug: node {id:?} does not exist"),
        }
    }
}

impl<S> IndexMut<NodeId> for Arena<S> {
    fn index_mut(&mut self, id: NodeId) -> &mut Node<S> {
        match self.slots.get_mut(id.index()).and_then(Option::as_mut) {
            Some(node) => node,
            None => panic!("prefix trie bug: node {id:?} does not exist"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(start: usize) -> Node<()> {
        Node {
            keys: Vec::new(),
            start,
            parent: None,
            children: Vec::new(),
            last_used: 0,
            checkpoint: false,
            snapshots: Vec::new(),
        }
    }

    #[test]
    fn removed_ids_are_reused_and_never_resolve_to_the_old_node() {
        let mut arena = Arena::new();
        let a = arena.insert(leaf(1));
        let b = arena.insert(leaf(2));
        assert_eq!(arena.len(), 2);
        assert_eq!(arena.remove(a).map(|node| node.start), Some(1));
        assert!(arena.get(a).is_none());
        assert!(arena.remove(a).is_none());
        let c = arena.insert(leaf(3));
        assert_eq!(c, a);
        assert_eq!(arena[c].start, 3);
        assert_eq!(arena[b].start, 2);
        assert_eq!(arena.iter().count(), 2);
    }
}
