//! The `PrefixTrie` itself: configuration, live sessions, `begin` and `abandon`.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;

use crate::error::{Error, Result};
use crate::key::{Key, Lookahead};
use crate::node::{Arena, Node, NodeId};
use crate::prompt::Prompt;
use crate::schedule::SchedulePolicy;
use crate::session::SessionId;
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
    /// The session to name in `restore_plan`, `attach`, `close` and `abandon`.
    pub session: SessionId,
    /// How many prompt keys the trie holds.
    pub matched: usize,
    /// The offset the caches restore to: the deepest one every layer can restore to, not
    /// inside a non-causal media item, and leaving at least one token to evaluate.
    pub restore_at: usize,
    /// Offsets worth capturing during prefill, ascending, all past `restore_at`.
    pub capture_at: Vec<usize>,
}

/// A request between `begin` and `close`.
#[derive(Clone)]
pub(crate) struct Session {
    /// The keys the request records: the prompt's, extended by `close`.
    pub keys: Vec<Key>,
    pub non_causal: Vec<Range<usize>>,
    pub restore_at: usize,
    /// Scheduled offsets; nodes ending at one become checkpoints.
    pub checkpoints: Vec<usize>,
    /// The node ending at `restore_at`; `restore_plan` reads the path to it.
    pub restore_node: NodeId,
    /// Where the session's path currently ends: its attached captures reach here.
    pub frontier: NodeId,
}

/// A compressed trie of cached model states, keyed by prompt keys, generic over snapshots.
///
/// Any number of sessions may be live at once. Each has its own path from the root to its
/// frontier; paths share the nodes of their common prefix. Cloning (when snapshots clone) forks
/// the whole cache, live sessions included, e.g. to try a policy on a copy.
#[derive(Clone)]
pub struct PrefixTrie<S> {
    pub(crate) config: Config,
    pub(crate) nodes: Arena<S>,
    pub(crate) root: NodeId,
    /// Live sessions by id; ordered so dumps are stable.
    pub(crate) sessions: BTreeMap<SessionId, Session>,
    pub(crate) next_session: u64,
    /// Sum of the stored snapshots' last-read byte counts.
    pub(crate) bytes: usize,
    /// Logical clock for least-recently-used ordering; advances at every begin and close.
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
            sessions: BTreeMap::new(),
            next_session: 0,
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

    /// Number of sessions between `begin` and `close` or `abandon`.
    pub fn live_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// The offset where a live session's path ends: how far its attached captures reach.
    ///
    /// Fails when the session is not live.
    pub fn frontier_offset(&self, session: SessionId) -> Result<usize> {
        Ok(self.nodes[self.session(session)?.frontier].end())
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

    /// Starts a session: matches the prompt, makes the restore point a node boundary
    /// (splitting an edge when the request resumes inside it), starts the session's path there
    /// and schedules captures. `turn_starts` are offsets worth keeping as restore points, such
    /// as where the last user message begins. Other live sessions are unaffected.
    ///
    /// Fails when the prompt was keyed with another look-ahead, or when splitting a snapshot
    /// fails (the trie stays consistent; no session starts).
    pub fn begin(&mut self, prompt: &Prompt, turn_starts: &[usize]) -> Result<Begin> {
        let found = self.find_path(prompt)?;
        let restore_node = self.boundary_on_path(&found.path, found.restore_at)?;
        self.clock += 1;
        self.nodes[restore_node].last_used = self.clock;
        // Point-shaped layers (recurrent, sliding window) restore only where a snapshot was
        // taken, so an exact retry of this prompt would resume `before_end` keys early; one
        // more capture just before its last key lets it evaluate that key alone. Range-shaped
        // layers restore at any offset inside a snapshot and need no such point.
        let mut worth_keeping = turn_starts.to_vec();
        if self.config.layers.contains(&LayerKind::Point) {
            worth_keeping.push(prompt.keys().len().saturating_sub(1));
        }
        let capture_at = self.config.schedule.capture_offsets(
            prompt,
            found.restore_at,
            found.matched,
            &worth_keeping,
        );
        let session = SessionId(self.next_session);
        self.next_session += 1;
        self.sessions.insert(
            session,
            Session {
                keys: prompt.keys().to_vec(),
                non_causal: prompt.non_causal().to_vec(),
                restore_at: found.restore_at,
                checkpoints: capture_at.clone(),
                restore_node,
                frontier: restore_node,
            },
        );
        Ok(Begin {
            session,
            matched: found.matched,
            restore_at: found.restore_at,
            capture_at,
        })
    }

    /// Ends a session without recording anything more (its caches are in an unknown state).
    /// What it attached stays stored. An unknown or ended session is ignored.
    pub fn abandon(&mut self, session: SessionId) {
        self.sessions.remove(&session);
    }

    pub(crate) fn session(&self, session: SessionId) -> Result<&Session> {
        self.sessions
            .get(&session)
            .ok_or(Error::UnknownSession(session))
    }

    pub(crate) fn session_mut(&mut self, session: SessionId) -> Result<&mut Session> {
        self.sessions
            .get_mut(&session)
            .ok_or(Error::UnknownSession(session))
    }

    /// Nodes that must keep their id and place: every live session's restore node and
    /// frontier. Eviction and compaction never merge or remove them.
    pub(crate) fn pinned(&self) -> HashSet<NodeId> {
        self.sessions
            .values()
            .flat_map(|session| [session.restore_node, session.frontier])
            .collect()
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
