//! Attaching captured snapshots to a session's path, and closing a session.

use std::ops::Range;

use crate::error::{BoxError, Error, Result};
use crate::key::Key;
use crate::node::NodeId;
use crate::prompt::span_containing;
use crate::session::SessionId;
use crate::snapshot::{Coverage, LayerKind, Snapshot};
use crate::trie::PrefixTrie;

/// One layer's snapshot captured during prefill.
#[derive(Debug)]
pub struct Capture<S> {
    /// The cache slot it belongs to.
    pub layer: usize,
    /// The state; a range capture covers from the previous capture (or the restore point) to
    /// its offset.
    pub snapshot: S,
}

/// What happened to the captures handed to `attach` or `close`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttachReport {
    /// Snapshots (or clipped pieces of them) now stored on a node.
    pub stored: usize,
    /// Pieces dropped because their node already had that layer, or because they cover only
    /// part of an edge.
    pub kept_existing: usize,
    /// Captures past the keys recorded (or, at close, past where the caches rest).
    pub past_live: usize,
    /// Captures strictly inside a non-causal media item, which nobody may resume from.
    pub inside_media: usize,
}

/// What `close` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CloseReport {
    /// The captures handed to close.
    pub attach: AttachReport,
    /// Snapshots the page-out callback produced.
    pub paged_out: usize,
    /// Nodes merged away by compaction.
    pub merged: usize,
}

impl<S: Snapshot> PrefixTrie<S> {
    /// Stores a session's captured snapshots on its path, growing the path along its prompt's
    /// keys.
    ///
    /// Each capture is clipped to node edges: a range capture gives each edge it fully covers
    /// the piece for that edge, a point capture goes to the node ending at its offset. A node
    /// that already has a layer keeps it (another session may have stored it first). Fails when
    /// the session is not live, when a capture names a missing layer or has the wrong shape
    /// (nothing is stored then), or when a snapshot split fails; the session stays live.
    pub fn attach(
        &mut self,
        session: SessionId,
        captures: Vec<Capture<S>>,
    ) -> Result<AttachReport> {
        let limit = self.session(session)?.keys.len();
        self.attach_up_to(session, captures, limit)
    }

    /// Ends a live session.
    ///
    /// `keys` are all keys the request recorded (the prompt's, then the generated tokens');
    /// the session's caches rest at `rest_at`, which for a cancelled prefill is where it
    /// stopped. `captures` are the ones not yet attached. The trie records `keys[..rest_at]`
    /// on the session's path, attaches the captures, then asks `page_out` for every snapshot
    /// that path lacks: a point snapshot at `rest_at` for the last node, and range snapshots for
    /// any edge without one (any sub-range of `0..rest_at`, which a KV cache can hand out as a
    /// lazy view). At this moment the session's caches rest exactly at the end of what is
    /// recorded, so every layer can be captured. Finally the path's non-checkpoint segments are
    /// compacted (never merging away another live session's restore node or frontier) and its
    /// end is marked used.
    ///
    /// The session ends even when close fails; the trie stays consistent. Fails when the
    /// session is not live, when `keys` do not extend its prompt, when `rest_at` is past `keys`
    /// or before the restore point, when a capture or page-out is malformed, or when a snapshot
    /// operation fails.
    pub fn close<E, F>(
        &mut self,
        session: SessionId,
        keys: &[Key],
        rest_at: usize,
        captures: Vec<Capture<S>>,
        page_out: F,
    ) -> Result<CloseReport>
    where
        E: Into<BoxError>,
        F: FnMut(usize, Coverage) -> Result<S, E>,
    {
        let result = self.close_session(session, keys, rest_at, captures, page_out);
        self.sessions.remove(&session);
        result
    }

    fn close_session<E, F>(
        &mut self,
        session: SessionId,
        keys: &[Key],
        rest_at: usize,
        captures: Vec<Capture<S>>,
        mut page_out: F,
    ) -> Result<CloseReport>
    where
        E: Into<BoxError>,
        F: FnMut(usize, Coverage) -> Result<S, E>,
    {
        let live = self.session_mut(session)?;
        let shared = live.keys.len().min(keys.len());
        if let Some(offset) = (0..shared).find(|&i| live.keys[i] != keys[i]) {
            return Err(Error::KeysDiverged { offset });
        }
        if rest_at > keys.len() {
            return Err(Error::CacheAheadOfKeys {
                rest_at,
                keys: keys.len(),
            });
        }
        if rest_at < live.restore_at {
            return Err(Error::RestBeforeRestorePoint {
                rest_at,
                restore_at: live.restore_at,
            });
        }
        live.keys = keys.to_vec();
        let rest_inside_media = span_containing(&live.non_causal, rest_at).is_some();

        let mut report = CloseReport::default();
        let mut failure = None;
        match self.attach_up_to(session, captures, rest_at) {
            Ok(attached) => report.attach = attached,
            Err(error) => failure = Some(error),
        }
        // The caches may rest below captures attached earlier (a rollback); those stay stored,
        // but the session's path ends where its caches are.
        let frontier = self.session_boundary(session, rest_at)?;
        self.session_mut(session)?.frontier = frontier;
        if !rest_inside_media && failure.is_none() {
            match self.page_out_missing(frontier, &mut page_out) {
                Ok(count) => report.paged_out = count,
                Err(error) => failure = Some(error),
            }
        }
        // Ended before compacting, so its own restore node may merge into the recorded edge.
        self.sessions.remove(&session);
        report.merged = self.compact_path(frontier)?;
        self.clock += 1;
        self.nodes[frontier].last_used = self.clock;
        failure.map_or(Ok(report), Err)
    }

    fn page_out_missing<E, F>(&mut self, frontier: NodeId, page_out: &mut F) -> Result<usize>
    where
        E: Into<BoxError>,
        F: FnMut(usize, Coverage) -> Result<S, E>,
    {
        let path = self.path_to(frontier);
        let mut count = 0;
        for (layer, kind) in self.config.layers.clone().into_iter().enumerate() {
            let wanted: Vec<(NodeId, Coverage)> = match kind {
                LayerKind::Stateless => continue,
                LayerKind::Point if frontier == self.root => continue,
                LayerKind::Point => vec![(frontier, Coverage::Point(self.nodes[frontier].end()))],
                LayerKind::Range => path[1..]
                    .iter()
                    .map(|&id| {
                        (
                            id,
                            Coverage::Range(self.nodes[id].start..self.nodes[id].end()),
                        )
                    })
                    .collect(),
            };
            for (id, coverage) in wanted {
                if self.nodes[id].snapshots[layer].is_some() {
                    continue;
                }
                let snapshot =
                    page_out(layer, coverage.clone()).map_err(|error| Error::PageOut {
                        layer,
                        source: error.into(),
                    })?;
                let got = snapshot.coverage();
                if got != coverage {
                    return Err(Error::PageOutCoverage {
                        layer,
                        expected: coverage,
                        got,
                    });
                }
                let stored = self.store(snapshot);
                self.nodes[id].snapshots[layer] = Some(stored);
                count += 1;
            }
        }
        Ok(count)
    }

    fn attach_up_to(
        &mut self,
        session: SessionId,
        captures: Vec<Capture<S>>,
        limit: usize,
    ) -> Result<AttachReport> {
        for capture in &captures {
            self.check_capture(capture)?;
        }
        let mut captures = captures;
        captures.sort_by_key(|capture| capture.snapshot.coverage().end());
        let mut report = AttachReport::default();
        for capture in captures {
            let end = capture.snapshot.coverage().end();
            let inside_media = span_containing(&self.session(session)?.non_causal, end).is_some();
            if end > limit {
                report.past_live += 1;
            } else if inside_media {
                report.inside_media += 1;
            } else {
                let node = self.session_boundary(session, end)?;
                self.place(node, capture, &mut report)?;
            }
        }
        let frontier = self.session(session)?.frontier;
        self.compact_path(frontier)?;
        Ok(report)
    }

    fn check_capture(&self, capture: &Capture<S>) -> Result<()> {
        let layers = self.config.layers.len();
        let Some(&kind) = self.config.layers.get(capture.layer) else {
            return Err(Error::LayerOutOfRange {
                layer: capture.layer,
                layers,
            });
        };
        let coverage = capture.snapshot.coverage();
        if coverage.kind() != kind {
            return Err(Error::ShapeMismatch {
                layer: capture.layer,
                kind,
                coverage,
            });
        }
        match coverage {
            Coverage::Range(range) if range.start >= range.end => Err(Error::EmptyCoverage {
                layer: capture.layer,
                range,
            }),
            Coverage::Point(0) => Err(Error::EmptyCoverage {
                layer: capture.layer,
                range: Range { start: 0, end: 0 },
            }),
            _ => Ok(()),
        }
    }

    /// Stores `capture` on `node` (which ends at its offset) and, for a range capture, on the
    /// ancestors whose edges it covers whole.
    fn place(
        &mut self,
        node: NodeId,
        capture: Capture<S>,
        report: &mut AttachReport,
    ) -> Result<()> {
        let layer = capture.layer;
        let Coverage::Range(range) = capture.snapshot.coverage() else {
            if self.nodes[node].snapshots[layer].is_none() {
                let stored = self.store(capture.snapshot);
                self.nodes[node].snapshots[layer] = Some(stored);
                report.stored += 1;
            } else {
                report.kept_existing += 1;
            }
            return Ok(());
        };
        // The nodes whose edges lie inside the capture, deepest first.
        let mut covered = Vec::new();
        let mut cursor = Some(node);
        while let Some(id) = cursor.filter(|&id| id != self.root) {
            if self.nodes[id].start < range.start {
                break;
            }
            covered.push(id);
            cursor = self.nodes[id].parent;
        }
        let wanted = covered
            .iter()
            .filter(|&&id| self.nodes[id].snapshots[layer].is_none());
        if wanted.count() == 0 {
            report.kept_existing += 1;
            return Ok(());
        }
        let split_error = |error: S::Error| Error::Snapshot {
            op: "split",
            layer,
            source: Box::new(error),
        };
        let mut rest = capture.snapshot;
        // Drop any part before the first whole edge, then hand each edge its piece.
        if let Some(&first) = covered.last() {
            let first_start = self.nodes[first].start;
            if first_start > range.start {
                rest = rest.split(first_start).map_err(split_error)?.1;
                report.kept_existing += 1;
            }
        }
        for &id in covered.iter().rev() {
            let end = self.nodes[id].end();
            let piece = if end < range.end {
                let (piece, tail) = rest.split(end).map_err(split_error)?;
                rest = tail;
                piece
            } else {
                // The last edge ends at the capture's end: the rest is its piece.
                let piece = rest;
                return self.give(id, layer, piece, report);
            };
            self.give(id, layer, piece, report)?;
        }
        Ok(())
    }

    fn give(
        &mut self,
        id: NodeId,
        layer: usize,
        piece: S,
        report: &mut AttachReport,
    ) -> Result<()> {
        if self.nodes[id].snapshots[layer].is_none() {
            let stored = self.store(piece);
            self.nodes[id].snapshots[layer] = Some(stored);
            report.stored += 1;
        } else {
            report.kept_existing += 1;
        }
        Ok(())
    }
}
