//! The `PrefixTrie` itself: configuration, the live request, `begin` and `abandon`.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::key::{Key, Lookahead};
use crate::node::{Arena, Node, NodeId};
use crate::prompt::Prompt;
use crate::schedule::SchedulePolicy;
use crate::snapshot::{LayerKind, Snapshot};

/// How a trie is shaped: one entry per cache slot of the model, plus keying and scheduling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The kind of each cache slot, in the order snapshots are indexed.
    pub layers: Vec<LayerKind>,
    /// Whether keys pair each position with the next (a drafter with its own KV cache).
    pub lookahead: Lookahead,
    /// Which offsets `begin` asks the engine to capture.
    pub schedule: SchedulePolicy,
}

/// What `begin` decided for a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Begin {
    /// How many prompt keys the trie holds.
    pub matched: usize,
    /// The offset the caches restore to: the deepest one every layer can restore to, not
    /// inside a non-causal media item, and leaving at least one token to evaluate.
    pub restore_at: usize,
    /// Up to where the caches left live by the previous request already hold this prompt's
    /// state, so range layers may rewind instead of paging in that part.
    pub live_common: usize,
    /// Offsets worth capturing during prefill, ascending, all past `restore_at`.
    pub capture_at: Vec<usize>,
}

/// The request between `begin` and `close`.
#[derive(Clone)]
pub(crate) struct Live {
    /// The keys the request records: the prompt's, extended by `close`.
    pub keys: Vec<Key>,
    pub non_causal: Vec<Range<usize>>,
    pub restore_at: usize,
    /// Scheduled offsets; nodes ending at one become checkpoints.
    pub checkpoints: Vec<usize>,
}

/// A compressed trie of cached model states, keyed by prompt keys, generic over snapshots.
///
/// Exactly one path is live: the one ending at the frontier, where the engine's caches rest.
/// Cloning (when snapshots clone) forks the whole cache, e.g. to try a policy on a copy.
#[derive(Clone)]
pub struct PrefixTrie<S> {
    pub(crate) config: Config,
    pub(crate) nodes: Arena<S>,
    pub(crate) root: NodeId,
    pub(crate) frontier: NodeId,
    pub(crate) live: Option<Live>,
    /// Sum of the stored snapshots' last-read byte counts.
    pub(crate) bytes: usize,
    /// Logical clock for least-recently-used ordering; advances once per request.
    pub(crate) clock: u64,
}

impl<S: Snapshot> PrefixTrie<S> {
    /// An empty trie. Fails on a configuration with no layers.
    pub fn new(config: Config) -> Result<Self> {
        if config.layers.is_empty() {
            return Err(Error::InvalidConfig("a model has at least one cache slot"));
        }
        let mut nodes = Arena::new();
        let root = nodes.insert(Node {
            keys: Vec::new(),
            start: 0,
            parent: None,
            children: Vec::new(),
            last_used: 0,
            checkpoint: false,
            snapshots: config.layers.iter().map(|_| None).collect(),
        });
        Ok(PrefixTrie {
            config,
            nodes,
            root,
            frontier: root,
            live: None,
            bytes: 0,
            clock: 0,
        })
    }

    /// The configuration the trie was built with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Bytes held by stored snapshots, as last read (see [`PrefixTrie::resync_bytes`]).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of nodes, the root included.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The offset where the live path ends (the engine's caches rest there).
    pub fn frontier_offset(&self) -> usize {
        self.nodes[self.frontier].end()
    }

    /// Whether a request is between `begin` and `close`.
    pub fn is_live(&self) -> bool {
        self.live.is_some()
    }

    /// Re-reads every snapshot's byte count; lazy snapshots grow when they are copied out.
    pub fn resync_bytes(&mut self) -> usize {
        let mut total = 0;
        for node in self.nodes.iter_mut() {
            for stored in node.snapshots.iter_mut().flatten() {
                stored.bytes = stored.snapshot.bytes();
                total += stored.bytes;
            }
        }
        self.bytes = total;
        total
    }

    /// Starts a request: matches the prompt, makes the restore point a node boundary (splitting
    /// an edge when the request resumes inside it), moves the live path there and schedules
    /// captures. `turn_starts` are offsets worth keeping as restore points, such as where the
    /// last user message begins.
    ///
    /// Fails when a request is already live, when the prompt was keyed with another look-ahead,
    /// or when splitting a snapshot fails (the trie stays consistent; no request starts).
    pub fn begin(&mut self, prompt: &Prompt, turn_starts: &[usize]) -> Result<Begin> {
        if self.live.is_some() {
            return Err(Error::SessionActive);
        }
        let found = self.find_path(prompt)?;
        let live_common = self
            .common_with_live(&found.path, found.matched)
            .min(found.restore_at);
        let restore_node = self.boundary_on_path(&found.path, found.restore_at)?;
        self.frontier = restore_node;
        self.clock += 1;
        self.nodes[restore_node].last_used = self.clock;
        let capture_at = self.config.schedule.capture_offsets(
            prompt,
            found.restore_at,
            found.matched,
            turn_starts,
        );
        self.live = Some(Live {
            keys: prompt.keys().to_vec(),
            non_causal: prompt.non_causal().to_vec(),
            restore_at: found.restore_at,
            checkpoints: capture_at.clone(),
        });
        Ok(Begin {
            matched: found.matched,
            restore_at: found.restore_at,
            live_common,
            capture_at,
        })
    }

    /// Ends the live request without recording anything more (the caches are in an unknown
    /// state). The live path stays where the request restored to.
    pub fn abandon(&mut self) {
        self.live = None;
    }

    /// How far the path just matched agrees with the path the caches were left on.
    fn common_with_live(&self, path: &[NodeId], matched: usize) -> usize {
        let live_path = self.path_to(self.frontier);
        let mut common = 0;
        for (new, old) in path.iter().zip(live_path.iter().skip(1)) {
            if new != old {
                break;
            }
            common = self.nodes[*new].end();
        }
        common.min(matched).min(self.frontier_offset())
    }

    /// The nodes from the root (included) down to `id`.
    pub(crate) fn path_to(&self, id: NodeId) -> Vec<NodeId> {
        let mut path = vec![id];
        let mut cursor = id;
        while let Some(parent) = self.nodes[cursor].parent {
            path.push(parent);
            cursor = parent;
        }
        path.reverse();
        path
    }
}
