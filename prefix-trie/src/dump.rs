//! A text rendering of the trie for debugging and snapshot tests.

use std::fmt::Write;

use crate::key::Lookahead;
use crate::node::NodeId;
use crate::snapshot::{LayerKind, Snapshot};
use crate::trie::{PrefixTrie, Session};

/// Edges longer than this show their first and last few keys only.
const SHOWN_KEYS: usize = 8;

impl<S: Snapshot> PrefixTrie<S> {
    /// Renders the trie, one node per line, children indented under their parent in key order:
    ///
    /// ```text
    /// 3 nodes, 96 bytes, 2 live
    /// [0..0) root | restore s3
    ///   [0..12) keys 1 2 3 4 … 11 12 | layers RP | 96 B | used 2 | checkpoint | restore s2 | frontier s2 s3
    /// ```
    ///
    /// Layer letters: `R` range snapshot, `P` point snapshot, `.` missing, `-` stateless.
    /// `restore` lists the live sessions that restored at the node, `frontier` those whose
    /// path ends there.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} nodes, {} bytes, {} live",
            self.nodes.len(),
            self.bytes,
            self.sessions.len()
        );
        out.push_str("[0..0) root");
        self.dump_sessions(self.root, &mut out);
        out.push('\n');
        let mut stack: Vec<(NodeId, usize)> = self
            .sorted_children(self.root)
            .into_iter()
            .rev()
            .map(|id| (id, 1))
            .collect();
        while let Some((id, depth)) = stack.pop() {
            self.dump_node(id, depth, &mut out);
            stack.extend(
                self.sorted_children(id)
                    .into_iter()
                    .rev()
                    .map(|child| (child, depth + 1)),
            );
        }
        out
    }

    fn sorted_children(&self, id: NodeId) -> Vec<NodeId> {
        let mut children = self.nodes[id].children.clone();
        children.sort_by_key(|&child| self.nodes[child].keys.first().copied());
        children
    }

    fn dump_node(&self, id: NodeId, depth: usize, out: &mut String) {
        let node = &self.nodes[id];
        let paired = self.config.lookahead == Lookahead::NextToken;
        let _ = write!(
            out,
            "{:indent$}[{}..{}) keys",
            "",
            node.start,
            node.end(),
            indent = depth * 2
        );
        let len = node.keys.len();
        for (index, key) in node.keys.iter().enumerate() {
            if len > SHOWN_KEYS && index == SHOWN_KEYS / 2 {
                out.push_str(" …");
            }
            if len <= SHOWN_KEYS || index < SHOWN_KEYS / 2 || index >= len - SHOWN_KEYS / 2 {
                out.push(' ');
                let _ = key.write(paired, out);
            }
        }
        out.push_str(" | layers ");
        for (layer, kind) in self.config.layers.iter().enumerate() {
            out.push(match (kind, &node.snapshots[layer]) {
                (LayerKind::Stateless, _) => '-',
                (_, None) => '.',
                (LayerKind::Range, Some(_)) => 'R',
                (LayerKind::Point, Some(_)) => 'P',
            });
        }
        let _ = write!(out, " | {} B | used {}", node.bytes(), node.last_used);
        if node.checkpoint {
            out.push_str(" | checkpoint");
        }
        self.dump_sessions(id, out);
        out.push('\n');
    }

    fn dump_sessions(&self, id: NodeId, out: &mut String) {
        let restore: fn(&Session) -> NodeId = |s| s.restore_node;
        let frontier: fn(&Session) -> NodeId = |s| s.frontier;
        for (label, of) in [("restore", restore), ("frontier", frontier)] {
            let mut here = self
                .sessions
                .iter()
                .filter(|(_, session)| of(session) == id)
                .peekable();
            if here.peek().is_some() {
                let _ = write!(out, " | {label}");
                for (session, _) in here {
                    let _ = write!(out, " {session}");
                }
            }
        }
    }
}
