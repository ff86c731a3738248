//! Lazy KV snapshots and the shared buffer they index into.
//!
//! A [`KvSnapshot`] of `start..end` starts as a view: it names a range of the live buffer of
//! the [`crate::KvCache`] that made it and owns nothing. The buffer lives in a [`KvStore`] the
//! cache shares (weakly) with its lazy snapshots; every write the cache makes first copies out
//! each still-lazy snapshot whose range it overlaps, wherever that snapshot lies in the buffer.
//! So a snapshot in its lazy state has never been overwritten, and restoring one into its own
//! cache is an offset move. (Upstream checked only the first write after a rewind, against that
//! write's range, and a lazy snapshot further ahead was overwritten and later restored wrong.)
//!
//! Lock order: store, then snapshot. A snapshot never holds its own lock while taking the
//! store's.

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use mlx::Array;

use crate::error::{Error, Result};
use crate::tensor::{TOKENS, dim, owned_range};

/// The KV buffers `[batch, heads, capacity, dim]` of one cache and the lazy snapshots into them.
#[derive(Default)]
pub(crate) struct KvStore {
    pub keys: Option<Array>,
    pub values: Option<Array>,
    lazies: Vec<Weak<Mutex<SnapshotInner>>>,
}

pub(crate) type SharedStore = Arc<Mutex<KvStore>>;

/// Locks ignoring poison: every critical section leaves the state consistent before any call
/// that could panic.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poison| poison.into_inner())
}

pub(crate) fn lock_store(store: &SharedStore) -> MutexGuard<'_, KvStore> {
    lock(store)
}

enum State {
    /// A view of `range` in the store's buffer, never overwritten while in this state.
    Lazy(Weak<Mutex<KvStore>>),
    /// A copy of the range, in buffers of its own.
    Owned { keys: Array, values: Array },
    /// The cache went away and copying out failed.
    Lost(String),
}

struct SnapshotInner {
    range: Range<usize>,
    state: State,
}

impl KvStore {
    /// Registers a lazy snapshot of `range` (already written) in `store`.
    pub fn lazy(store: &SharedStore, range: Range<usize>) -> KvSnapshot {
        let inner = Arc::new(Mutex::new(SnapshotInner {
            range,
            state: State::Lazy(Arc::downgrade(store)),
        }));
        lock(store).lazies.push(Arc::downgrade(&inner));
        KvSnapshot { inner }
    }

    /// Copies out every still-lazy snapshot overlapping `write`, before the write happens.
    pub fn copy_out_overlapping(&mut self, write: Range<usize>) -> Result<()> {
        let mut copied = Vec::new();
        let mut failure = None;
        let mut keep = Vec::with_capacity(self.lazies.len());
        for weak in std::mem::take(&mut self.lazies) {
            let Some(inner) = weak.upgrade() else {
                continue;
            };
            let mut guard = lock(&inner);
            if !matches!(guard.state, State::Lazy(_)) {
                continue;
            }
            let range = guard.range.clone();
            if range.start >= write.end || write.start >= range.end {
                drop(guard);
                keep.push(weak);
                continue;
            }
            match self.read(range.clone()).and_then(|(k, v)| {
                Ok((
                    owned_range(&k, TOKENS, 0, range.len())?,
                    owned_range(&v, TOKENS, 0, range.len())?,
                ))
            }) {
                Ok((keys, values)) => {
                    copied.push(keys.clone());
                    copied.push(values.clone());
                    guard.state = State::Owned { keys, values };
                }
                Err(e) => {
                    guard.state = State::Lost(e.to_string());
                    failure.get_or_insert(e);
                }
            }
        }
        self.lazies = keep;
        // Evaluate now, while the store still holds the old buffer: the copies then own their
        // data and the write that follows may update the buffer in place.
        if !copied.is_empty() {
            mlx::eval(&copied)?;
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Marks every lazy snapshot lost: the buffer they name is gone.
    pub fn lose_all(&mut self, reason: &str) {
        for weak in std::mem::take(&mut self.lazies) {
            if let Some(inner) = weak.upgrade() {
                let mut guard = lock(&inner);
                if matches!(guard.state, State::Lazy(_)) {
                    guard.state = State::Lost(reason.to_string());
                }
            }
        }
    }

    /// Views of `range` of the buffers.
    pub fn read(&self, range: Range<usize>) -> Result<(Array, Array)> {
        let (Some(keys), Some(values)) = (&self.keys, &self.values) else {
            return Err(Error::SnapshotLost {
                range,
                reason: "the cache holds no buffer".into(),
            });
        };
        let start = dim(range.start, "snapshot start")?;
        let end = dim(range.end, "snapshot end")?;
        Ok((
            keys.slice_axis(TOKENS, start, end)?,
            values.slice_axis(TOKENS, start, end)?,
        ))
    }
}

/// A snapshot of a [`crate::KvCache`] over a range of offsets: lazy until a write would
/// clobber it, then a copy of exactly that range.
pub struct KvSnapshot {
    inner: Arc<Mutex<SnapshotInner>>,
}

impl std::fmt::Debug for KvSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = lock(&self.inner);
        let state = match &inner.state {
            State::Lazy(_) => "lazy",
            State::Owned { .. } => "owned",
            State::Lost(_) => "lost",
        };
        write!(f, "KvSnapshot({:?}, {state})", inner.range)
    }
}

impl KvSnapshot {
    pub(crate) fn owned(range: Range<usize>, keys: Array, values: Array) -> KvSnapshot {
        KvSnapshot {
            inner: Arc::new(Mutex::new(SnapshotInner {
                range,
                state: State::Owned { keys, values },
            })),
        }
    }

    /// The offsets covered.
    pub fn range(&self) -> Range<usize> {
        lock(&self.inner).range.clone()
    }

    /// Whether the snapshot still only names a range of its cache's live buffer.
    pub fn is_lazy(&self) -> bool {
        matches!(lock(&self.inner).state, State::Lazy(_))
    }

    /// Bytes the snapshot owns: zero while lazy, its keys and values once copied out.
    pub fn bytes(&self) -> usize {
        match &lock(&self.inner).state {
            State::Owned { keys, values } => keys.nbytes() + values.nbytes(),
            State::Lazy(_) | State::Lost(_) => 0,
        }
    }

    /// The store this snapshot is a lazy view into, if it is one.
    pub(crate) fn lazy_store(&self) -> Option<Weak<Mutex<KvStore>>> {
        match &lock(&self.inner).state {
            State::Lazy(store) => Some(store.clone()),
            _ => None,
        }
    }

    /// Keys and values `[batch, heads, len, dim]`. For a lazy snapshot these are views of the
    /// cache's live buffer: holding them keeps MLX from updating that buffer in place, so
    /// drop them before the cache's next write.
    pub fn arrays(&self) -> Result<(Array, Array)> {
        let (range, store) = {
            let inner = lock(&self.inner);
            match &inner.state {
                State::Owned { keys, values } => return Ok((keys.clone(), values.clone())),
                State::Lost(reason) => {
                    return Err(Error::SnapshotLost {
                        range: inner.range.clone(),
                        reason: reason.clone(),
                    });
                }
                State::Lazy(store) => (inner.range.clone(), store.clone()),
            }
        };
        let Some(store) = store.upgrade() else {
            return Err(Error::SnapshotLost {
                range,
                reason: "its cache was dropped".into(),
            });
        };
        let store = lock(&store);
        // Re-read under the store lock: a write may have copied this snapshot out meanwhile.
        let inner = lock(&self.inner);
        match &inner.state {
            State::Owned { keys, values } => Ok((keys.clone(), values.clone())),
            State::Lazy(_) => store.read(inner.range.clone()),
            State::Lost(reason) => Err(Error::SnapshotLost {
                range: inner.range.clone(),
                reason: reason.clone(),
            }),
        }
    }

    /// Copies the snapshot out of its cache now, so that it owns its data.
    pub fn materialize(&self) -> Result<()> {
        let (range, store) = {
            let inner = lock(&self.inner);
            match &inner.state {
                State::Lazy(store) => (inner.range.clone(), store.clone()),
                _ => return Ok(()),
            }
        };
        match store.upgrade() {
            Some(store) => lock(&store).copy_out_overlapping(range),
            None => {
                lock(&self.inner).state = State::Lost("its cache was dropped".into());
                Err(Error::SnapshotLost {
                    range,
                    reason: "its cache was dropped".into(),
                })
            }
        }
    }

    /// Merges this snapshot of `a..b` with `later` of `b..c` into `a..c`. Two lazy views of
    /// the same cache merge by arithmetic; otherwise both are copied out and concatenated.
    pub fn merge(self, later: KvSnapshot) -> Result<KvSnapshot> {
        let first = self.range();
        let second = later.range();
        if first.end != second.start {
            return Err(Error::NotAdjacent { first, second });
        }
        if let (Some(a), Some(b)) = (self.lazy_store(), later.lazy_store())
            && Weak::ptr_eq(&a, &b)
            && let Some(store) = a.upgrade()
        {
            let _store = lock(&store);
            let (mut x, y) = (lock(&self.inner), lock(&later.inner));
            if matches!((&x.state, &y.state), (State::Lazy(_), State::Lazy(_))) {
                x.range = first.start..second.end;
                drop((x, y));
                return Ok(self);
            }
        }
        self.materialize()?;
        later.materialize()?;
        let (k1, v1) = self.arrays()?;
        let (k2, v2) = later.arrays()?;
        let keys = mlx::concatenate(&[k1, k2], TOKENS)?;
        let values = mlx::concatenate(&[v1, v2], TOKENS)?;
        // Evaluate so the two halves are freed now rather than whenever the merge is first read.
        mlx::eval([&keys, &values])?;
        Ok(KvSnapshot::owned(first.start..second.end, keys, values))
    }

    /// Splits this snapshot of `a..c` at `a < at < c` into `a..at` and `at..c`. A lazy view
    /// splits into two lazy views; an owned copy into two owned copies of their own size.
    pub fn split(self, at: usize) -> Result<(KvSnapshot, KvSnapshot)> {
        let range = self.range();
        if at <= range.start || at >= range.end {
            return Err(Error::SplitOutside { range, at });
        }
        if let Some(store) = self.lazy_store().and_then(|s| s.upgrade()) {
            let guard = lock(&store);
            let mut inner = lock(&self.inner);
            if matches!(inner.state, State::Lazy(_)) {
                inner.range = range.start..at;
                drop(inner);
                drop(guard);
                let tail = KvStore::lazy(&store, at..range.end);
                return Ok((self, tail));
            }
        }
        self.materialize()?;
        let (keys, values) = self.arrays()?;
        let head_len = at - range.start;
        let head_k = owned_range(&keys, TOKENS, 0, head_len)?;
        let head_v = owned_range(&values, TOKENS, 0, head_len)?;
        let tail_k = owned_range(&keys, TOKENS, head_len, range.len())?;
        let tail_v = owned_range(&values, TOKENS, head_len, range.len())?;
        mlx::eval([&head_k, &head_v, &tail_k, &tail_v])?;
        Ok((
            KvSnapshot::owned(range.start..at, head_k, head_v),
            KvSnapshot::owned(at..range.end, tail_k, tail_v),
        ))
    }
}
