//! `RotatingKvCache`: a sliding-window cache that keeps the last tokens of a window (plus an
//! optional prefix), in a ring of slots fixed by position.
//!
//! Position `p` lives in slot `p` while `p < keep`, else in slot `keep + (p - keep) % ring`,
//! where `ring = window + rewind_slack`. After `offset` tokens the cache holds positions
//! `0..min(keep, offset)` and the last `ring` positions above the prefix, so its contents are a
//! function of the logical history alone. A single-token update writes one slot and hands
//! attention the whole ring in slot order: every column is visible (with no slack), so no mask
//! is needed. A longer update (a prefill chunk, a speculative round) gathers the held
//! positions in order, appends the new tokens, and masks by position; captures inside it are cut
//! from that same gathered history.
//!
//! A rewind of at most `rewind_slack` tokens after the ring has wrapped leaves the oldest slots
//! holding the rejected positions' data: the cache then holds fewer than `ring` valid positions
//! (`valid_from` onwards, never fewer than the window), and its snapshots and contents are that
//! valid suffix. New writes push the stale slots out again.

use mlx::{Array, concatenate};

use crate::error::{CacheKind, Error, Result};
use crate::mask::{KeySpan, KvHistory, MaskApplier, StorageWindow};
use crate::schedule::CaptureSchedule;
use crate::storage::{KvStorage, check_storage, stored_as};
use crate::tensor::{KvShape, TOKENS, dim, gather, write_tokens};

/// The shape of a sliding window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RotatingConfig {
    /// A query at `q` sees keys at `q - window < p <= q` (at least 1).
    pub window: usize,
    /// Positions `0..keep` are kept and stay visible to every query (attention sinks).
    pub keep: usize,
    /// Extra positions held beyond the window so that a rewind of up to this many tokens (a
    /// rejected speculative draft) needs no snapshot. Costs that many slots and, when nonzero,
    /// an array mask on decode steps once the window is full.
    pub rewind_slack: usize,
}

impl RotatingConfig {
    fn ring(&self) -> usize {
        self.window + self.rewind_slack
    }

    fn capacity(&self) -> usize {
        self.keep + self.ring()
    }

    /// The positions held after `offset` tokens: the kept prefix and the ring's run.
    fn held(&self, offset: usize) -> [std::ops::Range<usize>; 2] {
        let prefix = 0..self.keep.min(offset);
        let ring_start = self
            .keep
            .max(offset.saturating_sub(self.ring()))
            .min(offset);
        [prefix, ring_start..offset]
    }

    fn slot(&self, position: usize) -> usize {
        if position < self.keep {
            position
        } else {
            self.keep + (position - self.keep) % self.ring()
        }
    }
}

/// The whole state of a [`RotatingKvCache`] at one offset: the held positions in order.
#[derive(Clone, Debug)]
pub struct RotatingSnapshot {
    offset: usize,
    config: RotatingConfig,
    arrays: Option<(Array, Array)>,
}

impl RotatingSnapshot {
    /// The offset the cache rests at after restoring this snapshot.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Bytes of its keys and values (buffers of their own).
    pub fn bytes(&self) -> usize {
        self.arrays
            .as_ref()
            .map_or(0, |(k, v)| k.nbytes() + v.nbytes())
    }

    /// Keys and values of the held positions, prefix first, `None` at offset zero.
    pub fn arrays(&self) -> Option<&(Array, Array)> {
        self.arrays.as_ref()
    }
}

/// A sliding-window KV cache; see the module documentation.
#[derive(Debug)]
pub struct RotatingKvCache {
    config: RotatingConfig,
    shape: Option<KvShape>,
    buffers: Option<(Array, Array)>,
    offset: usize,
    /// The first ring position whose slot still holds it: above `offset - ring` only after a
    /// rewind overwrote older slots with positions that were then taken back.
    valid_from: usize,
    schedule: CaptureSchedule,
    captured: Vec<(usize, RotatingSnapshot)>,
    storage: Option<KvStorage>,
}

impl RotatingKvCache {
    /// An empty cache. Fails on a window of zero tokens.
    pub fn new(config: RotatingConfig) -> Result<RotatingKvCache> {
        if config.window == 0 {
            return Err(Error::Config("a sliding window of 0 tokens".into()));
        }
        let capacity = config
            .keep
            .checked_add(config.window)
            .and_then(|c| c.checked_add(config.rewind_slack))
            .unwrap_or(usize::MAX);
        dim(capacity, "rotating cache capacity")?;
        Ok(RotatingKvCache {
            config,
            shape: None,
            buffers: None,
            offset: 0,
            valid_from: 0,
            schedule: CaptureSchedule::default(),
            captured: Vec::new(),
            storage: None,
        })
    }

    /// The window configuration.
    pub fn config(&self) -> RotatingConfig {
        self.config
    }

    /// Tokens seen.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The arrays holding the cache's state, for the engine to evaluate after a forward (a
    /// prefill's history is a gathered copy, so evaluating attention does not write the ring).
    pub fn state_arrays(&self) -> Vec<Array> {
        self.buffers
            .iter()
            .flat_map(|(k, v)| [k.clone(), v.clone()])
            .collect()
    }

    /// The positions whose keys and values the cache holds at `offset` (the current one, or
    /// a capture inside a write): the kept prefix and the valid part of the ring's run.
    fn held(&self, offset: usize) -> [std::ops::Range<usize>; 2] {
        let [prefix, ring] = self.config.held(offset);
        [
            prefix,
            ring.start.max(self.valid_from).min(offset)..ring.end,
        ]
    }

    fn check_shape(&mut self, shape: KvShape) -> Result<()> {
        match &self.shape {
            Some(stored) => stored.check_same(&shape, "keys and values"),
            None => {
                self.buffers = Some(shape.zeros(self.config.capacity())?);
                self.shape = Some(shape);
                Ok(())
            }
        }
    }

    /// Stores keys and values as `storage` says (see [`crate::KvCache::set_storage`]). Only before
    /// the first write.
    pub fn set_storage(&mut self, storage: impl Into<KvStorage>) -> Result<()> {
        let storage = storage.into();
        check_storage(storage, self.shape.is_some(), "rotating")?;
        self.storage = Some(storage);
        Ok(())
    }

    /// Appends `[batch, kv_heads, new_tokens, dim]` keys and values and returns what the new
    /// queries may attend to, with a mask applier that enforces the window.
    pub fn update(&mut self, keys: &Array, values: &Array) -> Result<KvHistory> {
        let (keys, values) = stored_as(self.storage, keys, values)?;
        let (keys, values) = (&keys, &values);
        let (shape, n) = KvShape::of(keys, values)?;
        self.check_shape(shape)?;
        let from = self.offset;
        dim(from + n, "cache offset")?;
        let crossed = self.schedule.crossed(from, from + n);
        if n == 1 {
            self.write_run(from, keys, values)?;
            self.offset = from + 1;
            for (_, at) in crossed {
                let snapshot = self.snapshot_now()?;
                self.captured.push((at, snapshot));
            }
            return self.decode_history();
        }
        // Held positions in order, then the new tokens: every position any new query may see,
        // and every position a capture inside this write holds.
        let [prefix, ring] = self.held(from);
        let (old_k, old_v) = self.gather_held(&[prefix.clone(), ring.clone()])?;
        let full_ranges = [prefix.clone(), ring.clone(), from..from + n];
        let (full_k, full_v) = match (old_k, old_v) {
            (Some(k), Some(v)) => (
                concatenate(&[k, keys.clone()], TOKENS)?,
                concatenate(&[v, values.clone()], TOKENS)?,
            ),
            _ => (keys.clone(), values.clone()),
        };
        for (_, at) in crossed {
            let held = self.held(at);
            let columns = columns_of(&full_ranges, &held);
            let arrays = (
                gather(&full_k, TOKENS, &columns)?,
                gather(&full_v, TOKENS, &columns)?,
            );
            self.captured.push((
                at,
                RotatingSnapshot {
                    offset: at,
                    config: self.config,
                    arrays: Some(arrays),
                },
            ));
        }
        self.write_run(from, keys, values)?;
        self.offset = from + n;
        let storage = Some(self.storage_window());
        let first_visible = (from + 1).saturating_sub(self.config.window);
        if self.config.keep == 0 && first_visible > ring.start {
            // Drop the held columns no new query can see, so the causal fast path applies.
            let skip = dim(first_visible - ring.start, "history column")?;
            let total = full_k.dim(TOKENS)?;
            let spans = [KeySpan {
                start: first_visible,
                len: from + n - first_visible,
            }];
            return Ok(KvHistory {
                keys: full_k.slice_axis(TOKENS, skip, total)?,
                values: full_v.slice_axis(TOKENS, skip, total)?,
                mask: MaskApplier::new(self.offset, &spans, storage),
            });
        }
        let spans: Vec<KeySpan> = full_ranges
            .iter()
            .map(|r| KeySpan {
                start: r.start,
                len: r.len(),
            })
            .collect();
        Ok(KvHistory {
            keys: full_k,
            values: full_v,
            mask: MaskApplier::new(self.offset, &spans, storage),
        })
    }

    fn storage_window(&self) -> StorageWindow {
        StorageWindow {
            window: self.config.window,
            keep: self.config.keep,
        }
    }

    /// The last `n` cached positions (and the kept prefix) as keys a query after them may
    /// attend to, without writing: for a drafter that reads its target's cache (Gemma 4's
    /// assistant reads one position more than the window). Queried as the history of one
    /// query with a causal logical mask, the mask shows exactly those keys. `n` may exceed the
    /// window by what the ring still validly holds (its rewind slack, less what rewinds
    /// overwrote); a position it no longer holds is an error naming it. `None` while empty.
    pub fn view_last(&self, n: usize) -> Result<Option<KvHistory>> {
        if self.offset == 0 {
            return Ok(None);
        }
        let first = self.offset.saturating_sub(n);
        let [_, ring] = self.held(self.offset);
        if first >= self.config.keep && first < ring.start {
            return Err(Error::Config(format!(
                "a sliding-window cache at {} holds positions from {} on; a view of the last \
                 {n} needs {first}",
                self.offset, ring.start
            )));
        }
        let mut history = self.decode_history()?;
        history.mask = history.mask.with_storage(StorageWindow {
            window: n,
            keep: self.config.keep,
        });
        Ok(Some(history))
    }

    /// The history after a one-token write: the used slots in slot order.
    fn decode_history(&self) -> Result<KvHistory> {
        let Some((keys, values)) = &self.buffers else {
            return Err(Error::Config(
                "rotating buffer missing after a write".into(),
            ));
        };
        let used = dim(self.used_slots(), "history length")?;
        Ok(self.history_of(
            keys.slice_axis(TOKENS, 0, used)?,
            values.slice_axis(TOKENS, 0, used)?,
        ))
    }

    /// Slots holding a position after a one-token write, from slot 0 on.
    fn used_slots(&self) -> usize {
        self.offset.min(self.config.capacity())
    }

    /// The history after a one-token write from views of the buffer's used slots.
    fn history_of(&self, keys: Array, values: Array) -> KvHistory {
        let offset = self.offset;
        let keep = self.config.keep;
        let ring = self.config.ring();
        let spans = if offset <= self.config.capacity() {
            // Not wrapped yet: slot `p` holds position `p`.
            vec![KeySpan {
                start: 0,
                len: offset,
            }]
        } else {
            let last = offset - 1;
            let j = (last - keep) % ring;
            vec![
                KeySpan {
                    start: 0,
                    len: keep,
                },
                KeySpan {
                    start: last - j,
                    len: j + 1,
                },
                KeySpan {
                    start: offset - ring,
                    len: ring - 1 - j,
                },
            ]
        };
        KvHistory {
            keys,
            values,
            mask: MaskApplier::new(offset, &spans, Some(self.storage_window())),
        }
    }

    /// Readies a one-token write whose keys and values have `shape` (in the stored form) and
    /// takes the buffers out for the caller to write: `(slot, used slots after the write,
    /// keys, values)`. The caller hands them back with [`RotatingKvCache::finish_decode_write`]
    /// or, unwritten, [`RotatingKvCache::put_buffers`].
    pub(crate) fn take_for_decode_write(
        &mut self,
        shape: KvShape,
    ) -> Result<(usize, usize, Array, Array)> {
        self.check_shape(shape)?;
        let from = self.offset;
        dim(from + 1, "cache offset")?;
        let (k, v) = self
            .buffers
            .take()
            .ok_or_else(|| Error::Config("rotating buffer missing".into()))?;
        let used = (from + 1).min(self.config.capacity());
        Ok((self.config.slot(from), used, k, v))
    }

    /// Hands back buffers [`RotatingKvCache::take_for_decode_write`] took, unwritten.
    pub(crate) fn put_buffers(&mut self, keys: Array, values: Array) {
        self.buffers = Some((keys, values));
    }

    /// Takes back the buffers after the caller wrote the token, with views of their used
    /// slots, and moves past it as `update` does: the captures it crossed, then the history.
    pub(crate) fn finish_decode_write(
        &mut self,
        (keys, values): (Array, Array),
        (key_history, value_history): (Array, Array),
    ) -> Result<KvHistory> {
        self.buffers = Some((keys, values));
        let from = self.offset;
        let crossed = self.schedule.crossed(from, from + 1);
        self.offset = from + 1;
        for (_, at) in crossed {
            let snapshot = self.snapshot_now()?;
            self.captured.push((at, snapshot));
        }
        Ok(self.history_of(key_history, value_history))
    }

    /// How keys and values are stored, if set.
    pub(crate) fn storage(&self) -> Option<KvStorage> {
        self.storage
    }

    /// The keys and values of `ranges` of held positions, in order, in fresh buffers.
    fn gather_held(
        &self,
        ranges: &[std::ops::Range<usize>],
    ) -> Result<(Option<Array>, Option<Array>)> {
        let slots = ranges
            .iter()
            .flat_map(|r| r.clone())
            .map(|p| dim(self.config.slot(p), "slot"))
            .collect::<Result<Vec<i32>>>()?;
        match (&self.buffers, slots.is_empty()) {
            (Some((k, v)), false) => Ok((
                Some(gather(k, TOKENS, &slots)?),
                Some(gather(v, TOKENS, &slots)?),
            )),
            _ => Ok((None, None)),
        }
    }

    /// Writes positions `first..first + len` from `keys`/`values` (`len` tokens) into their
    /// slots: the part below `keep` into the prefix, the last `ring` others into the ring.
    fn write_run(&mut self, first: usize, keys: &Array, values: &Array) -> Result<()> {
        let len = usize::try_from(keys.dim(TOKENS)?).unwrap_or(0);
        let end = first + len;
        let keep = self.config.keep;
        let ring = self.config.ring();
        let capacity = self.config.capacity();
        let mut pieces = Vec::new();
        if first < keep {
            pieces.push((first, first..end.min(keep)));
        }
        let ring_first = first.max(keep).max(end.saturating_sub(ring));
        let mut p = ring_first;
        while p < end {
            let slot = self.config.slot(p);
            let run = (capacity - slot).min(end - p);
            pieces.push((slot, p..p + run));
            p += run;
        }
        let Some((mut k, mut v)) = self.buffers.take() else {
            return Err(Error::Config("rotating buffer missing".into()));
        };
        for (slot, positions) in pieces {
            let (a, b) = (
                dim(positions.start - first, "column")?,
                dim(positions.end - first, "column")?,
            );
            let result = keys
                .slice_axis(TOKENS, a, b)
                .and_then(|part_k| Ok((part_k, values.slice_axis(TOKENS, a, b)?)))
                .map_err(Error::from)
                .and_then(|(part_k, part_v)| {
                    Ok((
                        write_tokens(&k, &part_k, slot)?,
                        write_tokens(&v, &part_v, slot)?,
                    ))
                });
            match result {
                Ok((nk, nv)) => {
                    k = nk;
                    v = nv;
                }
                Err(e) => {
                    self.buffers = Some((k, v));
                    return Err(e);
                }
            }
        }
        self.buffers = Some((k, v));
        Ok(())
    }

    fn snapshot_now(&self) -> Result<RotatingSnapshot> {
        let held = self.held(self.offset);
        let (k, v) = self.gather_held(&held)?;
        Ok(RotatingSnapshot {
            offset: self.offset,
            config: self.config,
            arrays: k.zip(v),
        })
    }

    /// The whole state at the current offset, a copy. `range.end` must be the offset (its
    /// start is ignored: the state is the window, whatever range a caller reasons about).
    pub fn snapshot(&self, range: std::ops::Range<usize>) -> Result<RotatingSnapshot> {
        if range.end != self.offset {
            return Err(Error::RangeOutOfBounds {
                kind: CacheKind::Rotating,
                range,
                offset: self.offset,
            });
        }
        self.snapshot_now()
    }

    /// The held positions' keys and values in position order (prefix first), `None` while
    /// empty: the logical contents, for comparisons.
    pub fn contents(&self) -> Result<Option<(Array, Array)>> {
        let held = self.held(self.offset);
        let (k, v) = self.gather_held(&held)?;
        Ok(k.zip(v))
    }

    /// Rewinds to `to` when the window the state at `to` needs is still held: always while
    /// nothing has left the ring, else by at most `rewind_slack` tokens (less after earlier
    /// rewinds whose stale slots have not been written over yet). The slots of positions the
    /// rewind takes back stay stale until written again (see the module documentation).
    pub fn rewind(&mut self, to: usize) -> Result<()> {
        // Positions the tokens above `to` overwrote: every one below `offset - ring`. Those
        // from `to` on are written again before anything reads them.
        let valid_from = self
            .valid_from
            .max(self.offset.saturating_sub(self.config.ring()))
            .min(to);
        let needed = to.saturating_sub(self.config.window).max(self.config.keep);
        if to > self.offset {
            return Err(Error::CannotRewind {
                kind: CacheKind::Rotating,
                from: self.offset,
                to,
                reason: ": that is ahead of the cache",
            });
        }
        if to > self.config.keep && valid_from > needed {
            return Err(Error::CannotRewind {
                kind: CacheKind::Rotating,
                from: self.offset,
                to,
                reason: ": positions it needs have left the window; restore a snapshot",
            });
        }
        self.offset = to;
        self.valid_from = valid_from;
        self.schedule.clear();
        Ok(())
    }

    /// Restores a whole-window snapshot taken from a cache of the same configuration.
    pub fn restore(&mut self, snapshot: &RotatingSnapshot) -> Result<()> {
        if snapshot.config != self.config {
            return Err(Error::CannotRestore {
                kind: CacheKind::Rotating,
                coverage: format!("offset {}", snapshot.offset),
                offset: self.offset,
                reason: "it was taken from a cache with another window",
            });
        }
        self.schedule.clear();
        let Some((keys, values)) = &snapshot.arrays else {
            self.offset = 0;
            self.valid_from = 0;
            return Ok(());
        };
        let (keys, values) = stored_as(self.storage, keys, values)?;
        let (keys, values) = (&keys, &values);
        let (shape, _) = KvShape::of(keys, values)?;
        self.check_shape(shape)?;
        // The snapshot holds its prefix and the valid end of its ring.
        let [prefix, _] = self.config.held(snapshot.offset);
        let split = dim(prefix.len(), "column")?;
        let total = keys.dim(TOKENS)?;
        let ring_len = usize::try_from(total - split).unwrap_or(0);
        let ring = snapshot.offset.saturating_sub(ring_len).max(prefix.end)..snapshot.offset;
        if !prefix.is_empty() {
            self.write_run(
                0,
                &keys.slice_axis(TOKENS, 0, split)?,
                &values.slice_axis(TOKENS, 0, split)?,
            )?;
        }
        if !ring.is_empty() {
            self.write_run(
                ring.start,
                &keys.slice_axis(TOKENS, split, total)?,
                &values.slice_axis(TOKENS, split, total)?,
            )?;
        }
        self.offset = snapshot.offset;
        self.valid_from = ring.start;
        Ok(())
    }

    /// See [`crate::KvCache::schedule_captures`]; each capture is a whole-window copy.
    pub fn schedule_captures(&mut self, offsets: &[usize]) -> Result<()> {
        self.schedule.set(offsets, self.offset, self.captured.len())
    }

    /// The captures recorded since the schedule was set, in order; unreached offsets are
    /// dropped.
    pub fn take_captures(&mut self) -> Vec<(usize, RotatingSnapshot)> {
        self.schedule.clear();
        std::mem::take(&mut self.captured)
    }
}

/// The columns of a concatenation of `layout` position ranges that hold `wanted`.
fn columns_of(layout: &[std::ops::Range<usize>], wanted: &[std::ops::Range<usize>]) -> Vec<i32> {
    let mut columns = Vec::new();
    for range in wanted {
        for p in range.clone() {
            let mut base = 0usize;
            for part in layout {
                if part.contains(&p) {
                    columns.push((base + p - part.start) as i32);
                    break;
                }
                base += part.len();
            }
        }
    }
    columns
}

#[cfg(test)]
mod tests {
    use mlx::Dtype;

    use super::*;

    #[test]
    fn bad_configurations_and_snapshots_are_errors() {
        let zero = RotatingConfig {
            window: 0,
            keep: 0,
            rewind_slack: 0,
        };
        assert!(matches!(RotatingKvCache::new(zero), Err(Error::Config(_))));
        let huge = RotatingConfig {
            window: usize::MAX / 2,
            keep: 0,
            rewind_slack: 0,
        };
        assert!(matches!(
            RotatingKvCache::new(huge),
            Err(Error::TooLarge { .. })
        ));

        let config = RotatingConfig {
            window: 2,
            keep: 0,
            rewind_slack: 0,
        };
        let mut cache = RotatingKvCache::new(config).unwrap();
        let x = Array::ones(&[1, 1, 5, 2], Dtype::F32).unwrap();
        cache.update(&x, &x).unwrap();
        assert!(matches!(
            cache.snapshot(0..4),
            Err(Error::RangeOutOfBounds { .. })
        ));
        assert!(matches!(cache.rewind(3), Err(Error::CannotRewind { .. })));
        let other = RotatingKvCache::new(RotatingConfig {
            window: 3,
            ..config
        })
        .unwrap();
        let foreign = other.snapshot(0..0).unwrap();
        assert!(matches!(
            cache.restore(&foreign),
            Err(Error::CannotRestore { .. })
        ));
    }
}
