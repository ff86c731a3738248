//! `LayerCache` and `LayerSnapshot`: the one contract the engine and the prefix trie hold
//! every layer slot to, over the three cache kinds.

use std::ops::Range;

use mlx::Array;
use prefix_trie::{Coverage, LayerKind};

use crate::error::{CacheKind, Error, Result};
use crate::kv::KvCache;
use crate::kv_snapshot::KvSnapshot;
use crate::mask::KvHistory;
use crate::recurrent::{RecurrentCache, RecurrentSnapshot};
use crate::rotating::{RotatingKvCache, RotatingSnapshot};
use crate::storage::KvStorage;

/// One layer slot's cache.
#[derive(Debug)]
pub enum LayerCache {
    /// Full attention.
    Kv(KvCache),
    /// Sliding-window attention.
    Rotating(RotatingKvCache),
    /// Linear attention / recurrent state.
    Recurrent(RecurrentCache),
}

/// One layer slot's snapshot: a range for full attention, a point for the other kinds.
#[derive(Debug)]
pub enum LayerSnapshot {
    /// Keys and values over a range of offsets.
    Kv(KvSnapshot),
    /// A whole window at one offset.
    Rotating(RotatingSnapshot),
    /// A whole recurrent state at one offset.
    Recurrent(RecurrentSnapshot),
}

impl LayerCache {
    /// Which kind this is.
    pub fn kind(&self) -> CacheKind {
        match self {
            LayerCache::Kv(_) => CacheKind::Kv,
            LayerCache::Rotating(_) => CacheKind::Rotating,
            LayerCache::Recurrent(_) => CacheKind::Recurrent,
        }
    }

    /// The shape of its snapshots, as the prefix trie sees it.
    pub fn layer_kind(&self) -> LayerKind {
        match self {
            LayerCache::Kv(_) => LayerKind::Range,
            LayerCache::Rotating(_) | LayerCache::Recurrent(_) => LayerKind::Point,
        }
    }

    /// Tokens cached.
    pub fn offset(&self) -> usize {
        match self {
            LayerCache::Kv(c) => c.offset(),
            LayerCache::Rotating(c) => c.offset(),
            LayerCache::Recurrent(c) => c.offset(),
        }
    }

    /// The arrays holding the state, for the engine to evaluate (or `async_eval`) after each
    /// forward so that lazy writes do not pile up.
    pub fn state_arrays(&self) -> Vec<Array> {
        match self {
            LayerCache::Kv(c) => c.state_arrays(),
            LayerCache::Rotating(c) => c.state_arrays(),
            LayerCache::Recurrent(c) => c.state_arrays(),
        }
    }

    /// Stores keys and values as `storage` says from now on (attention kinds; a recurrent state keeps
    /// its own precision). Only before the first write.
    pub fn set_kv_storage(&mut self, storage: impl Into<KvStorage>) -> Result<()> {
        let storage = storage.into();
        match self {
            LayerCache::Kv(c) => c.set_storage(storage),
            LayerCache::Rotating(c) => c.set_storage(storage),
            LayerCache::Recurrent(_) => Ok(()),
        }
    }

    /// Appends keys and values; for attention kinds only.
    pub fn update(&mut self, keys: &Array, values: &Array) -> Result<KvHistory> {
        match self {
            LayerCache::Kv(c) => c.update(keys, values),
            LayerCache::Rotating(c) => c.update(keys, values),
            LayerCache::Recurrent(_) => Err(Error::Unsupported {
                kind: CacheKind::Recurrent,
                operation: "key/value updates",
            }),
        }
    }

    /// The cached positions a query just after them attends to, without writing: for a
    /// drafter that attends over its target's cache (Gemma 4's assistant). A full cache shows
    /// every position; a sliding-window one the last `window` (see
    /// [`RotatingKvCache::view_last`]). Queried as the history of one query with a causal
    /// logical mask, the mask shows exactly those keys. `None` while empty; for attention kinds
    /// only.
    pub fn view(&self, window: usize) -> Result<Option<KvHistory>> {
        match self {
            LayerCache::Kv(c) => c.view(),
            LayerCache::Rotating(c) => c.view_last(window),
            LayerCache::Recurrent(_) => Err(Error::Unsupported {
                kind: CacheKind::Recurrent,
                operation: "key/value views",
            }),
        }
    }

    /// A snapshot: of `range` for a KV cache, of the whole state for the others (then
    /// `range.end` must be the current offset).
    pub fn snapshot(&self, range: Range<usize>) -> Result<LayerSnapshot> {
        Ok(match self {
            LayerCache::Kv(c) => LayerSnapshot::Kv(c.snapshot(range)?),
            LayerCache::Rotating(c) => LayerSnapshot::Rotating(c.snapshot(range)?),
            LayerCache::Recurrent(c) => LayerSnapshot::Recurrent(c.snapshot(range)?),
        })
    }

    /// A snapshot for the prefix trie's page-out of `coverage`.
    pub fn snapshot_coverage(&self, coverage: &Coverage) -> Result<LayerSnapshot> {
        match coverage {
            Coverage::Range(range) => self.snapshot(range.clone()),
            Coverage::Point(at) => self.snapshot(*at..*at),
        }
    }

    /// Restores a snapshot of the same kind (see each kind's `restore`).
    pub fn restore(&mut self, snapshot: &LayerSnapshot) -> Result<()> {
        match (self, snapshot) {
            (LayerCache::Kv(c), LayerSnapshot::Kv(s)) => c.restore(s),
            (LayerCache::Rotating(c), LayerSnapshot::Rotating(s)) => c.restore(s),
            (LayerCache::Recurrent(c), LayerSnapshot::Recurrent(s)) => c.restore(s),
            (cache, snapshot) => Err(Error::KindMismatch {
                expected: cache.kind(),
                found: snapshot.kind(),
            }),
        }
    }

    /// Rewinds to `to`, or fails where the kind cannot (see each kind's `rewind`).
    pub fn rewind(&mut self, to: usize) -> Result<()> {
        match self {
            LayerCache::Kv(c) => c.rewind(to),
            LayerCache::Rotating(c) => c.rewind(to),
            LayerCache::Recurrent(c) => c.rewind(to),
        }
    }

    /// Registers offsets to capture during the next writes.
    pub fn schedule_captures(&mut self, offsets: &[usize]) -> Result<()> {
        match self {
            LayerCache::Kv(c) => c.schedule_captures(offsets),
            LayerCache::Rotating(c) => c.schedule_captures(offsets),
            LayerCache::Recurrent(c) => c.schedule_captures(offsets),
        }
    }

    /// The captures recorded since the schedule was set, each with its offset.
    pub fn take_captures(&mut self) -> Vec<(usize, LayerSnapshot)> {
        match self {
            LayerCache::Kv(c) => wrap(c.take_captures(), LayerSnapshot::Kv),
            LayerCache::Rotating(c) => wrap(c.take_captures(), LayerSnapshot::Rotating),
            LayerCache::Recurrent(c) => wrap(c.take_captures(), LayerSnapshot::Recurrent),
        }
    }

    /// Where a recurrent layer must split a forward of `len` tokens from `start` (`None` for
    /// the attention kinds, which capture inside a write).
    pub fn next_capture_within(&self, start: usize, len: usize) -> Option<usize> {
        match self {
            LayerCache::Recurrent(c) => c.next_capture_within(start, len),
            LayerCache::Kv(_) | LayerCache::Rotating(_) => None,
        }
    }
}

fn wrap<S>(captures: Vec<(usize, S)>, f: fn(S) -> LayerSnapshot) -> Vec<(usize, LayerSnapshot)> {
    captures.into_iter().map(|(at, s)| (at, f(s))).collect()
}

impl LayerSnapshot {
    /// The kind of cache it came from.
    pub fn kind(&self) -> CacheKind {
        match self {
            LayerSnapshot::Kv(_) => CacheKind::Kv,
            LayerSnapshot::Rotating(_) => CacheKind::Rotating,
            LayerSnapshot::Recurrent(_) => CacheKind::Recurrent,
        }
    }

    /// What it covers.
    pub fn coverage(&self) -> Coverage {
        match self {
            LayerSnapshot::Kv(s) => Coverage::Range(s.range()),
            LayerSnapshot::Rotating(s) => Coverage::Point(s.offset()),
            LayerSnapshot::Recurrent(s) => Coverage::Point(s.offset()),
        }
    }

    /// Bytes it owns now (zero for a lazy KV view).
    pub fn bytes(&self) -> usize {
        match self {
            LayerSnapshot::Kv(s) => s.bytes(),
            LayerSnapshot::Rotating(s) => s.bytes(),
            LayerSnapshot::Recurrent(s) => s.bytes(),
        }
    }

    /// Merges with the snapshot right after it: KV ranges concatenate; for whole-state kinds
    /// the later state is the merged one.
    pub fn merge(self, later: LayerSnapshot) -> Result<LayerSnapshot> {
        match (self, later) {
            (LayerSnapshot::Kv(a), LayerSnapshot::Kv(b)) => Ok(LayerSnapshot::Kv(a.merge(b)?)),
            (a, b) if a.kind() == b.kind() => {
                let (from, to) = (a.coverage().end(), b.coverage().end());
                if to < from {
                    return Err(Error::NotAdjacent {
                        first: from..from,
                        second: to..to,
                    });
                }
                Ok(b)
            }
            (a, b) => Err(Error::KindMismatch {
                expected: a.kind(),
                found: b.kind(),
            }),
        }
    }

    /// Splits a KV range at `at`; whole-state kinds cannot be split.
    pub fn split(self, at: usize) -> Result<(LayerSnapshot, LayerSnapshot)> {
        match self {
            LayerSnapshot::Kv(s) => {
                let (a, b) = s.split(at)?;
                Ok((LayerSnapshot::Kv(a), LayerSnapshot::Kv(b)))
            }
            other => Err(Error::Unsupported {
                kind: other.kind(),
                operation: "splitting a whole-state snapshot",
            }),
        }
    }
}

impl prefix_trie::Snapshot for LayerSnapshot {
    type Error = Error;

    fn coverage(&self) -> Coverage {
        LayerSnapshot::coverage(self)
    }

    fn bytes(&self) -> usize {
        LayerSnapshot::bytes(self)
    }

    fn split(self, at: usize) -> Result<(Self, Self)> {
        LayerSnapshot::split(self, at)
    }

    fn merge(self, later: Self) -> Result<Self> {
        LayerSnapshot::merge(self, later)
    }
}

impl prefix_trie::Snapshot for KvSnapshot {
    type Error = Error;

    fn coverage(&self) -> Coverage {
        Coverage::Range(self.range())
    }

    fn bytes(&self) -> usize {
        KvSnapshot::bytes(self)
    }

    fn split(self, at: usize) -> Result<(Self, Self)> {
        KvSnapshot::split(self, at)
    }

    fn merge(self, later: Self) -> Result<Self> {
        KvSnapshot::merge(self, later)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine moves caches and the trie's snapshots onto the MLX worker thread.
    #[test]
    fn caches_and_snapshots_are_send() {
        fn send<T: Send>() {}
        send::<LayerCache>();
        send::<LayerSnapshot>();
    }
}
