//! `RecurrentCache`: the state of a linear-attention layer (a gated delta net, Mamba-style
//! convolutions): the convolution's input tail and a float32 recurrent state.
//!
//! The state after a forward exists only at its end: the scan kernel hands back the final state,
//! not the ones inside. So a scheduled capture inside a forward needs the model to run that
//! forward in pieces split at the capture offsets, for recurrent layers only:
//!
//! ```text
//! let mut start = cache.offset();
//! let end = start + tokens;
//! while start < end {
//!     let stop = cache.next_capture_within(start, end - start).unwrap_or(end);
//!     // run conv + scan over tokens start..stop from cache.conv_state() / recurrent_state(),
//!     cache.set_conv_state(&tail)?;          // copied to its own buffer here
//!     cache.set_recurrent_state(&state)?;
//!     cache.advance(stop - start)?;          // records the capture when `stop` is scheduled
//!     start = stop;
//! }
//! ```
//!
//! Advancing over a scheduled offset without stopping there is an error rather than a capture
//! of the wrong state. Boundary states are compacted when set (a conv tail cut from a
//! forward-sized buffer would otherwise pin that buffer inside every snapshot that keeps it),
//! so a snapshot owns exactly its bytes. Restores work only at offsets where a snapshot was
//! taken; rewinding works only to the current offset.

use mlx::{Array, Dtype};

use crate::error::{CacheKind, Error, Result};
use crate::schedule::CaptureSchedule;
use crate::tensor::{compact, dim};

/// The shapes of a recurrent layer's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecurrentConfig {
    /// Inputs the convolution keeps: kernel size − 1.
    pub conv_tail: usize,
    /// Channels of the convolution's input.
    pub conv_dim: usize,
    /// Value heads of the recurrent state.
    pub heads: usize,
    /// Value dimension per head.
    pub value_dim: usize,
    /// Key dimension per head.
    pub key_dim: usize,
}

/// The whole state of a [`RecurrentCache`] at one offset.
#[derive(Clone, Debug)]
pub struct RecurrentSnapshot {
    offset: usize,
    config: RecurrentConfig,
    conv: Option<Array>,
    state: Option<Array>,
}

impl RecurrentSnapshot {
    /// The offset the cache rests at after restoring this snapshot.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Bytes of the conv tail and recurrent state it references.
    pub fn bytes(&self) -> usize {
        self.conv.as_ref().map_or(0, Array::nbytes) + self.state.as_ref().map_or(0, Array::nbytes)
    }

    /// The conv tail `[batch, conv_tail, conv_dim]`, `None` if never set (zeros).
    pub fn conv_state(&self) -> Option<&Array> {
        self.conv.as_ref()
    }

    /// The recurrent state `[batch, heads, value_dim, key_dim]` (f32), `None` if never set.
    pub fn recurrent_state(&self) -> Option<&Array> {
        self.state.as_ref()
    }
}

/// Convolution tail and recurrent state of one layer; see the module documentation.
#[derive(Debug)]
pub struct RecurrentCache {
    config: RecurrentConfig,
    conv: Option<Array>,
    state: Option<Array>,
    offset: usize,
    schedule: CaptureSchedule,
    captured: Vec<(usize, RecurrentSnapshot)>,
}

impl RecurrentCache {
    /// An empty cache (zero state at offset 0).
    pub fn new(config: RecurrentConfig) -> Result<RecurrentCache> {
        for (value, what) in [
            (config.conv_tail, "conv tail"),
            (config.conv_dim, "conv dim"),
            (config.heads, "heads"),
            (config.value_dim, "value dim"),
            (config.key_dim, "key dim"),
        ] {
            dim(value, what)?;
        }
        Ok(RecurrentCache {
            config,
            conv: None,
            state: None,
            offset: 0,
            schedule: CaptureSchedule::default(),
            captured: Vec::new(),
        })
    }

    /// The state shapes.
    pub fn config(&self) -> RecurrentConfig {
        self.config
    }

    /// Tokens the state has absorbed.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The arrays holding the cache's state, for the engine to evaluate after a forward.
    pub fn state_arrays(&self) -> Vec<Array> {
        self.conv.iter().chain(self.state.iter()).cloned().collect()
    }

    /// The conv tail, `None` before the first [`RecurrentCache::set_conv_state`].
    pub fn conv_state(&self) -> Option<&Array> {
        self.conv.as_ref()
    }

    /// The recurrent state, `None` before the first [`RecurrentCache::set_recurrent_state`].
    pub fn recurrent_state(&self) -> Option<&Array> {
        self.state.as_ref()
    }

    /// The conv tail, or zeros of `batch` rows and `dtype` when none is set.
    pub fn conv_state_or_zeros(&self, batch: usize, dtype: Dtype) -> Result<Array> {
        match &self.conv {
            Some(conv) => Ok(conv.clone()),
            None => Ok(Array::zeros(
                &[
                    dim(batch, "batch")?,
                    dim(self.config.conv_tail, "conv tail")?,
                    dim(self.config.conv_dim, "conv dim")?,
                ],
                dtype,
            )?),
        }
    }

    /// The recurrent state, or f32 zeros of `batch` rows when none is set.
    pub fn recurrent_state_or_zeros(&self, batch: usize) -> Result<Array> {
        match &self.state {
            Some(state) => Ok(state.clone()),
            None => Ok(Array::zeros(
                &self.state_shape(dim(batch, "batch")?)?,
                Dtype::F32,
            )?),
        }
    }

    fn state_shape(&self, batch: i32) -> Result<Vec<i32>> {
        Ok(vec![
            batch,
            dim(self.config.heads, "heads")?,
            dim(self.config.value_dim, "value dim")?,
            dim(self.config.key_dim, "key dim")?,
        ])
    }

    fn batch(&self) -> Option<i32> {
        self.conv
            .as_ref()
            .or(self.state.as_ref())
            .and_then(|a| a.shape().first().copied())
    }

    /// Sets the conv tail `[batch, conv_tail, conv_dim]`, copied into a buffer of its own. The
    /// batch and dtype may not change mid-sequence.
    pub fn set_conv_state(&mut self, conv: &Array) -> Result<()> {
        let shape = conv.shape();
        let batch = self
            .batch()
            .unwrap_or_else(|| shape.first().copied().unwrap_or(0));
        let expected = [
            batch,
            dim(self.config.conv_tail, "conv tail")?,
            dim(self.config.conv_dim, "conv dim")?,
        ];
        if shape != expected {
            return Err(Error::Shape {
                what: "conv state",
                expected: format!("{expected:?}"),
                found: shape,
            });
        }
        if let Some(old) = &self.conv
            && old.dtype() != conv.dtype()
        {
            return Err(Error::Dtype {
                what: "conv state",
                expected: old.dtype(),
                found: conv.dtype(),
            });
        }
        self.conv = Some(compact(conv)?);
        Ok(())
    }

    /// Sets the recurrent state `[batch, heads, value_dim, key_dim]`, which must be f32 (low
    /// precision state drifts over long sequences). Pass a kernel's output as it is; a state cut
    /// out of a larger buffer (one of several per-token states) should go through
    /// [`crate::compact`] first.
    pub fn set_recurrent_state(&mut self, state: &Array) -> Result<()> {
        let shape = state.shape();
        let batch = self
            .batch()
            .unwrap_or_else(|| shape.first().copied().unwrap_or(0));
        let expected = self.state_shape(batch)?;
        if shape != expected {
            return Err(Error::Shape {
                what: "recurrent state",
                expected: format!("{expected:?}"),
                found: shape,
            });
        }
        if state.dtype() != Dtype::F32 {
            return Err(Error::Dtype {
                what: "recurrent state",
                expected: Dtype::F32,
                found: state.dtype(),
            });
        }
        self.state = Some(state.clone());
        Ok(())
    }

    /// The first scheduled capture strictly inside `start..start + len`: where the model must
    /// split a forward of `len` tokens from `start`.
    pub fn next_capture_within(&self, start: usize, len: usize) -> Option<usize> {
        self.schedule.next_within(start, len)
    }

    /// Records that the states set describe `n` more tokens. Fails, changing nothing, when a
    /// scheduled capture lies strictly inside the step; captures at its end are recorded.
    pub fn advance(&mut self, n: usize) -> Result<()> {
        if let Some(at) = self.schedule.next_within(self.offset, n) {
            return Err(Error::CaptureSkipped {
                from: self.offset,
                by: n,
                at,
            });
        }
        let from = self.offset;
        let to = from.checked_add(n).ok_or(Error::TooLarge {
            what: "offset",
            value: n,
        })?;
        self.offset = to;
        for (_, at) in self.schedule.crossed(from, to) {
            let snapshot = self.snapshot_now();
            self.captured.push((at, snapshot));
        }
        Ok(())
    }

    fn snapshot_now(&self) -> RecurrentSnapshot {
        RecurrentSnapshot {
            offset: self.offset,
            config: self.config,
            conv: self.conv.clone(),
            state: self.state.clone(),
        }
    }

    /// The state at the current offset. `range.end` must be the offset.
    pub fn snapshot(&self, range: std::ops::Range<usize>) -> Result<RecurrentSnapshot> {
        if range.end != self.offset {
            return Err(Error::RangeOutOfBounds {
                kind: CacheKind::Recurrent,
                range,
                offset: self.offset,
            });
        }
        Ok(self.snapshot_now())
    }

    /// Restores a snapshot of a cache with the same configuration.
    pub fn restore(&mut self, snapshot: &RecurrentSnapshot) -> Result<()> {
        if snapshot.config != self.config {
            return Err(Error::CannotRestore {
                kind: CacheKind::Recurrent,
                coverage: format!("offset {}", snapshot.offset),
                offset: self.offset,
                reason: "it was taken from a cache with other state shapes",
            });
        }
        self.schedule.clear();
        self.conv = snapshot.conv.clone();
        self.state = snapshot.state.clone();
        self.offset = snapshot.offset;
        Ok(())
    }

    /// Succeeds only for the current offset: earlier states are gone unless captured.
    pub fn rewind(&mut self, to: usize) -> Result<()> {
        if to != self.offset {
            return Err(Error::CannotRewind {
                kind: CacheKind::Recurrent,
                from: self.offset,
                to,
                reason: ": a recurrent state only restores from a snapshot",
            });
        }
        self.schedule.clear();
        Ok(())
    }

    /// See [`crate::KvCache::schedule_captures`]; the model must split its forward at them.
    pub fn schedule_captures(&mut self, offsets: &[usize]) -> Result<()> {
        self.schedule.set(offsets, self.offset, self.captured.len())
    }

    /// The captures recorded since the schedule was set, in order; unreached offsets are
    /// dropped.
    pub fn take_captures(&mut self) -> Vec<(usize, RecurrentSnapshot)> {
        self.schedule.clear();
        std::mem::take(&mut self.captured)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: RecurrentConfig = RecurrentConfig {
        conv_tail: 3,
        conv_dim: 4,
        heads: 2,
        value_dim: 2,
        key_dim: 2,
    };

    #[test]
    fn bad_states_are_errors() {
        let mut cache = RecurrentCache::new(CONFIG).unwrap();
        let state = Array::zeros(&[1, 2, 2, 2], Dtype::F32).unwrap();
        assert!(matches!(
            cache.set_recurrent_state(&state.astype(Dtype::Bf16).unwrap()),
            Err(Error::Dtype {
                what: "recurrent state",
                ..
            })
        ));
        assert!(matches!(
            cache.set_recurrent_state(&Array::zeros(&[1, 2, 2, 3], Dtype::F32).unwrap()),
            Err(Error::Shape { .. })
        ));
        cache.set_recurrent_state(&state).unwrap();
        // The batch is fixed by the first state.
        assert!(matches!(
            cache.set_conv_state(&Array::zeros(&[2, 3, 4], Dtype::F32).unwrap()),
            Err(Error::Shape { .. })
        ));
        cache
            .set_conv_state(&Array::zeros(&[1, 3, 4], Dtype::F32).unwrap())
            .unwrap();
        assert!(matches!(
            cache.set_conv_state(&Array::zeros(&[1, 3, 4], Dtype::F16).unwrap()),
            Err(Error::Dtype { .. })
        ));
        assert!(matches!(cache.rewind(0), Ok(())));
        cache.advance(2).unwrap();
        assert!(matches!(cache.rewind(1), Err(Error::CannotRewind { .. })));
        assert!(matches!(
            cache.snapshot(0..1),
            Err(Error::RangeOutOfBounds { .. })
        ));
    }
}
