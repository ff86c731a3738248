//! A full consistency check of the trie, for tests and debugging.

use crate::error::{Error, Result};
use crate::snapshot::{Coverage, LayerKind, Snapshot};
use crate::trie::PrefixTrie;

impl<S: Snapshot> PrefixTrie<S> {
    /// Checks every structural rule: edges chain (a child starts where its parent ends), only
    /// the root has an empty edge, siblings differ in their first key, parent and child links
    /// agree, every stored snapshot covers exactly its node's edge (range) or end (point) with
    /// the shape its layer has, and the byte counter is the sum of the stored counts. For every
    /// live session: its restore node and frontier exist, the restore node ends at its restore
    /// point and lies on the path to the frontier, and that path's keys are a prefix of the
    /// session's keys. Costs a walk over every node and every live path.
    pub fn check_invariants(&self) -> Result<()> {
        let fail = |message: String| Err(Error::Invariant(message));
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
        for (session, live) in &self.sessions {
            let (Some(frontier), Some(restore)) = (
                self.nodes.get(live.frontier),
                self.nodes.get(live.restore_node),
            ) else {
                return fail(format!("session {session} names a missing node"));
            };
            if restore.end() != live.restore_at {
                return fail(format!(
                    "session {session} restores at {} but its restore node ends at {}",
                    live.restore_at,
                    restore.end()
                ));
            }
            if frontier.end() > live.keys.len() {
                return fail(format!(
                    "session {session} has {} keys but its path ends at {}",
                    live.keys.len(),
                    frontier.end()
                ));
            }
            let path = self.path_to(live.frontier);
            if !path.contains(&live.restore_node) {
                return fail(format!(
                    "session {session}'s restore node is not on its path"
                ));
            }
            for &id in &path {
                let node = &self.nodes[id];
                if node.keys[..] != live.keys[node.start..node.end()] {
                    return fail(format!(
                        "session {session}'s path node {} differs from its keys",
                        id.index()
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
