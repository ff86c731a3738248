//! `KvCache`: the full-attention cache, a preallocated buffer written in place.

use std::ops::Range;
use std::sync::{Arc, MutexGuard, Weak};

use mlx::{Array, concatenate};

use crate::error::{CacheKind, Error, Result};
use crate::kv_snapshot::{KvSnapshot, KvStore, SharedStore, lock_store};
use crate::mask::{KeySpan, KvHistory, MaskApplier};
use crate::schedule::CaptureSchedule;
use crate::storage::{KvStorage, check_storage, stored_as};
use crate::tensor::{KvShape, TOKENS, dim, write_tokens};

/// The buffer grows in steps of this many tokens, so a decode step rarely reallocates.
pub const GROWTH_STEP: usize = 256;

/// Keys and values of every position so far, in a buffer `[batch, kv_heads, capacity, dim]`
/// grown in steps of [`GROWTH_STEP`] tokens and written with slice updates.
///
/// Snapshots are lazy ([`KvSnapshot`]); every write copies out the lazy snapshots it would
/// overwrite first. The cache can rewind to any offset not above its own.
pub struct KvCache {
    store: SharedStore,
    shape: Option<KvShape>,
    offset: usize,
    capacity: usize,
    schedule: CaptureSchedule,
    captured: Vec<(usize, KvSnapshot)>,
    storage: Option<KvStorage>,
}

impl Default for KvCache {
    fn default() -> Self {
        KvCache::new()
    }
}

impl std::fmt::Debug for KvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCache")
            .field("offset", &self.offset)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl KvCache {
    /// An empty cache; the buffer is allocated by the first update, in that update's shape.
    pub fn new() -> KvCache {
        KvCache {
            store: Arc::new(std::sync::Mutex::new(KvStore::default())),
            shape: None,
            offset: 0,
            capacity: 0,
            schedule: CaptureSchedule::default(),
            captured: Vec::new(),
            storage: None,
        }
    }

    /// Stores keys and values as `storage` says whatever dtype writes arrive in (a
    /// half-precision cache holds twice the context in the same memory and is read twice as
    /// fast; an 8-bit one, [`KvStorage::Q8`], 3.2 times an f32 one's). Only before the first
    /// write.
    pub fn set_storage(&mut self, storage: impl Into<KvStorage>) -> Result<()> {
        let storage = storage.into();
        check_storage(storage, self.shape.is_some(), "KV")?;
        self.storage = Some(storage);
        Ok(())
    }

    /// Tokens cached.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Token slots allocated.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Appends `keys` `[batch, kv_heads, new_tokens, key_dim]` and `values`
    /// `[.., value_dim]` (already rotary-embedded) and returns the history `0..offset`.
    /// Scheduled captures the write crosses are recorded.
    pub fn update(&mut self, keys: &Array, values: &Array) -> Result<KvHistory> {
        let (keys, values) = stored_as(self.storage, keys, values)?;
        let (shape, n) = KvShape::of(&keys, &values)?;
        self.write(self.offset, &keys, &values, shape, n)?;
        self.advance(n);
        self.history()
    }

    /// The history `0..offset` without writing (for a drafter that reads the target's cache).
    /// `None` while empty.
    pub fn view(&self) -> Result<Option<KvHistory>> {
        if self.offset == 0 {
            return Ok(None);
        }
        self.history().map(Some)
    }

    fn history(&self) -> Result<KvHistory> {
        let (keys, values) = lock_store(&self.store).read(0..self.offset)?;
        Ok(self.history_of(keys, values))
    }

    /// Writes `n` tokens at `at`, growing the buffer and copying out lazy snapshots first.
    fn write(
        &mut self,
        at: usize,
        keys: &Array,
        values: &Array,
        shape: KvShape,
        n: usize,
    ) -> Result<()> {
        let mut store = self.prepare_write(at, shape, n)?;
        // Take the buffers out before updating so the store holds no second reference and MLX
        // can write in place.
        let (Some(k), Some(v)) = (store.keys.take(), store.values.take()) else {
            return Err(Error::Config("KV buffer missing after allocation".into()));
        };
        let k = write_tokens(&k, keys, at);
        let v = write_tokens(&v, values, at);
        match (k, v) {
            (Ok(k), Ok(v)) => {
                store.keys = Some(k);
                store.values = Some(v);
                Ok(())
            }
            (Err(e), _) | (_, Err(e)) => {
                // The old buffers are gone with the failed update; the cache is empty now, and
                // lazy snapshots must not read whatever buffer comes next.
                store.lose_all(&e.to_string());
                drop(store);
                self.offset = 0;
                self.capacity = 0;
                Err(e)
            }
        }
    }

    /// Makes the buffer ready for `n` tokens at `at`: grown to fit, and the lazy snapshots
    /// over those slots copied out. The store stays locked for the caller's write.
    pub(crate) fn prepare_write(
        &mut self,
        at: usize,
        shape: KvShape,
        n: usize,
    ) -> Result<MutexGuard<'_, KvStore>> {
        match &self.shape {
            Some(stored) => stored.check_same(&shape, "keys and values")?,
            None => self.shape = Some(shape),
        }
        let end = at + n;
        dim(end, "cache offset")?;
        let mut store = lock_store(&self.store);
        if end > self.capacity {
            let capacity = end.div_ceil(GROWTH_STEP) * GROWTH_STEP;
            let (grown_k, grown_v) = shape.zeros(capacity - self.capacity)?;
            // The old buffer is kept whole, not just up to the offset: lazy snapshots may name
            // slots above the offset after a rewind.
            let (k, v) = match (store.keys.take(), store.values.take()) {
                (Some(k), Some(v)) => (
                    concatenate(&[k, grown_k], TOKENS)?,
                    concatenate(&[v, grown_v], TOKENS)?,
                ),
                _ => (grown_k, grown_v),
            };
            store.keys = Some(k);
            store.values = Some(v);
            self.capacity = capacity;
        }
        store.copy_out_overlapping(at..end)?;
        Ok(store)
    }

    /// Moves the offset past `n` tokens written at the offset, recording the scheduled
    /// captures the write crossed.
    pub(crate) fn advance(&mut self, n: usize) {
        let from = self.offset;
        self.offset = from + n;
        for (start, at) in self.schedule.crossed(from, self.offset) {
            let snapshot = KvStore::lazy(&self.store, start..at);
            self.captured.push((at, snapshot));
        }
    }

    /// The history after a write the caller made, from views of the buffers it wrote.
    pub(crate) fn history_of(&self, keys: Array, values: Array) -> KvHistory {
        let spans = [KeySpan {
            start: 0,
            len: self.offset,
        }];
        KvHistory {
            keys,
            values,
            mask: MaskApplier::new(self.offset, &spans, None),
        }
    }

    /// How keys and values are stored, if set.
    pub(crate) fn storage(&self) -> Option<KvStorage> {
        self.storage
    }

    /// The arrays holding the cache's state, for the engine to evaluate after a forward.
    pub fn state_arrays(&self) -> Vec<Array> {
        let store = lock_store(&self.store);
        store
            .keys
            .iter()
            .chain(store.values.iter())
            .cloned()
            .collect()
    }

    /// A lazy snapshot of `range` (within `0..offset`, non-empty).
    pub fn snapshot(&self, range: Range<usize>) -> Result<KvSnapshot> {
        if range.start >= range.end || range.end > self.offset {
            return Err(Error::RangeOutOfBounds {
                kind: CacheKind::Kv,
                range,
                offset: self.offset,
            });
        }
        Ok(KvStore::lazy(&self.store, range))
    }

    /// Moves the offset back to `to`; what lies above stays in the buffer for lazy snapshots.
    /// Pending scheduled captures are dropped.
    pub fn rewind(&mut self, to: usize) -> Result<()> {
        if to > self.offset {
            return Err(Error::CannotRewind {
                kind: CacheKind::Kv,
                from: self.offset,
                to,
                reason: ": that is ahead of the cache",
            });
        }
        self.offset = to;
        self.schedule.clear();
        Ok(())
    }

    /// Restores `snapshot` of `a..b`: positions `0..a` must already be right (the cache's
    /// offset is at least `a`), and the cache ends at `b`. The cache's own lazy snapshot is
    /// an offset move; anything else is written into the buffer. Pending scheduled captures are
    /// dropped.
    pub fn restore(&mut self, snapshot: &KvSnapshot) -> Result<()> {
        let range = snapshot.range();
        if range.start > self.offset {
            return Err(Error::CannotRestore {
                kind: CacheKind::Kv,
                coverage: format!("{range:?}"),
                offset: self.offset,
                reason: "it starts above the cache's offset, leaving a gap",
            });
        }
        self.schedule.clear();
        let own = snapshot
            .lazy_store()
            .is_some_and(|store| Weak::ptr_eq(&store, &Arc::downgrade(&self.store)));
        if own {
            // A lazy snapshot has never been overwritten, so its slots still hold its range.
            self.offset = range.end;
            return Ok(());
        }
        let (keys, values) = snapshot.arrays()?;
        let (keys, values) = stored_as(self.storage, &keys, &values)?;
        let (shape, n) = KvShape::of(&keys, &values)?;
        self.write(range.start, &keys, &values, shape, n)?;
        self.offset = range.end;
        Ok(())
    }

    /// Registers offsets to capture as later writes cross them: strictly ascending, above the
    /// current offset. Each capture covers from the previous one (or the current offset).
    /// Fails while captures of a previous schedule wait to be taken.
    pub fn schedule_captures(&mut self, offsets: &[usize]) -> Result<()> {
        self.schedule.set(offsets, self.offset, self.captured.len())
    }

    /// The captures recorded since the schedule was set, in offset order, each with its
    /// offset; offsets not reached are dropped.
    pub fn take_captures(&mut self) -> Vec<(usize, KvSnapshot)> {
        self.schedule.clear();
        std::mem::take(&mut self.captured)
    }
}

impl Drop for KvCache {
    fn drop(&mut self) {
        // Lazy snapshots outlive the cache as copies. A failure marks them lost (restoring one
        // then fails loudly) and cannot be reported from here.
        let _ = lock_store(&self.store).copy_out_overlapping(0..usize::MAX);
    }
}

#[cfg(test)]
mod tests {
    use mlx::Dtype;

    use super::*;

    fn ones(tokens: i32, dim: i32, dtype: Dtype) -> Array {
        Array::ones(&[1, 2, tokens, dim], dtype).unwrap()
    }

    #[test]
    fn bad_inputs_are_errors_naming_the_problem() {
        let mut cache = KvCache::new();
        let x = ones(3, 4, Dtype::F32);
        assert!(matches!(
            cache.update(&Array::ones(&[2, 3, 4], Dtype::F32).unwrap(), &x),
            Err(Error::Shape { what: "keys", .. })
        ));
        assert!(matches!(
            cache.update(&x, &ones(2, 4, Dtype::F32)),
            Err(Error::Shape { what: "values", .. })
        ));
        assert!(matches!(
            cache.update(&x, &ones(3, 4, Dtype::F16)),
            Err(Error::Dtype { .. })
        ));
        assert!(matches!(
            cache.update(&ones(0, 4, Dtype::F32), &ones(0, 4, Dtype::F32)),
            Err(Error::Shape { .. })
        ));
        cache.update(&x, &x).unwrap();
        assert!(matches!(
            cache.update(&ones(1, 8, Dtype::F32), &ones(1, 8, Dtype::F32)),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            cache.update(&ones(1, 4, Dtype::F16), &ones(1, 4, Dtype::F16)),
            Err(Error::Dtype { .. })
        ));
        assert!(matches!(
            cache.snapshot(1..4),
            Err(Error::RangeOutOfBounds { .. })
        ));
        assert!(matches!(
            cache.snapshot(2..2),
            Err(Error::RangeOutOfBounds { .. })
        ));
        assert!(matches!(cache.rewind(4), Err(Error::CannotRewind { .. })));
        assert!(matches!(
            cache.schedule_captures(&[3]),
            Err(Error::BadSchedule { .. })
        ));

        let a = cache.snapshot(0..1).unwrap();
        let c = cache.snapshot(2..3).unwrap();
        assert!(matches!(a.merge(c), Err(Error::NotAdjacent { .. })));
        let b = cache.snapshot(1..3).unwrap();
        assert!(matches!(b.split(1), Err(Error::SplitOutside { at: 1, .. })));

        let far = cache.snapshot(2..3).unwrap();
        cache.rewind(1).unwrap();
        assert!(matches!(
            cache.restore(&far),
            Err(Error::CannotRestore { .. })
        ));
    }

    #[test]
    fn snapshots_of_another_cache_are_written_in() {
        let mut source = KvCache::new();
        let x = Array::arange(0.0, 24.0, 1.0, Dtype::F32)
            .unwrap()
            .reshape(&[1, 2, 3, 4])
            .unwrap();
        source.update(&x, &x).unwrap();
        let snapshot = source.snapshot(0..3).unwrap();
        let mut target = KvCache::new();
        target.restore(&snapshot).unwrap();
        assert!(
            snapshot.is_lazy(),
            "reading a snapshot does not copy it out"
        );
        drop(source);
        assert!(
            !snapshot.is_lazy(),
            "a dropped cache copies its lazy snapshots out"
        );
        let view = target.view().unwrap().unwrap();
        assert_eq!(
            view.keys.to_vec::<f32>().unwrap(),
            x.to_vec::<f32>().unwrap()
        );
        assert_eq!(
            snapshot.arrays().unwrap().0.to_vec::<f32>().unwrap(),
            x.to_vec::<f32>().unwrap()
        );
    }
}
