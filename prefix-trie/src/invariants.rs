//! A full consistency check of the trie, for tests and debugging.

use crate::error::{Error, Result};
use crate::snapshot::{Coverage, LayerKind, Snapshot};
use crate::trie::PrefixTrie;

impl<S: Snapshot> PrefixTrie<S> {
    /// Checks every structural rule: edges chain (a child starts where its parent ends), only
    /// the root has an empty edge, siblings differ in their first key, parent and child links
    /// agree, every stored snapshot covers exactly its node's edge (range) or end (point) with
    /// the shape its layer has, the byte counter is the sum of the stored counts, and the
    /// frontier exists. Costs a walk over every node.
    pub fn check_invariants(&self) -> Result<()> {
        let fail = |message: String| Err(Error::Invariant(message));
        if self.nodes.get(self.frontier).is_none() {
            return fail("the frontier does not exist".into());
        }
        let mut bytes = 0;
        for (id, node) in self.nodes.iter() {
            let name = id.index();
            bytes += node.bytes();
            match node.parent {
                None if id != self.root => return fail(format!("node {name} has no parent")),
                None => {}
                Some(parent) => {
                    let Some(parent_node) = self.nodes.get(parent) else {
                        return fail(format!("node {name} has a missing parent"));
                    };
                    if !parent_node.children.contains(&id) {
                        return fail(format!("node {name} is not among its parent's children"));
                    }
                    if parent_node.end() != node.start {
                        return fail(format!(
                            "node {name} starts at {} but its parent ends at {}",
                            node.start,
                            parent_node.end()
                        ));
                    }
                    if node.keys.is_empty() {
                        return fail(format!("node {name} has an empty edge"));
                    }
                }
            }
            let mut first_keys = Vec::new();
            for &child in &node.children {
                match self.nodes.get(child) {
                    Some(child_node) if child_node.parent == Some(id) => {
                        first_keys.push(child_node.keys.first().copied());
                    }
                    _ => return fail(format!("node {name} lists a child that is not its own")),
                }
            }
            first_keys.sort_unstable();
            if first_keys.windows(2).any(|pair| pair[0] == pair[1]) {
                return fail(format!("children of node {name} share a first key"));
            }
            if node.snapshots.len() != self.config.layers.len() {
                return fail(format!("node {name} has the wrong number of layer slots"));
            }
            for (layer, (kind, stored)) in
                self.config.layers.iter().zip(&node.snapshots).enumerate()
            {
                let Some(stored) = stored else { continue };
                let expected = match kind {
                    LayerKind::Stateless => {
                        return fail(format!("node {name} stores stateless layer {layer}"));
                    }
                    LayerKind::Range => Coverage::Range(node.start..node.end()),
                    LayerKind::Point => Coverage::Point(node.end()),
                };
                let got = stored.snapshot.coverage();
                if got != expected {
                    return fail(format!(
                        "node {name} layer {layer} covers {got:?}, its edge is {expected:?}"
                    ));
                }
            }
        }
        if bytes != self.bytes {
            return fail(format!(
                "byte counter says {} but nodes hold {bytes}",
                self.bytes
            ));
        }
        Ok(())
    }
}
