//! Scheduled captures: offsets registered before a forward, recorded as its write crosses them.
//!
//! Prefill registers the prefix cache's restore points and speculative verification registers
//! one offset per drafted token, then runs one forward; each cache records its state at every
//! offset the write reaches without the forward being cut into pieces (recurrent layers are
//! the exception, see `RecurrentCache::next_capture_within`).

use std::collections::VecDeque;

use crate::error::{Error, Result};

/// The offsets still to capture, and where the next range capture starts.
#[derive(Clone, Debug, Default)]
pub(crate) struct CaptureSchedule {
    pending: VecDeque<usize>,
    /// Start of the next range capture: the schedule's starting offset, then the last capture.
    base: usize,
}

impl CaptureSchedule {
    /// Replaces the schedule. `offsets` must be strictly ascending and above `offset`, and the
    /// captures of the previous schedule must have been taken (`taken_count` of them wait).
    pub fn set(&mut self, offsets: &[usize], offset: usize, waiting: usize) -> Result<()> {
        if waiting > 0 {
            return Err(Error::CapturesPending { count: waiting });
        }
        let ascending = offsets.windows(2).all(|w| w[0] < w[1]);
        if !ascending || offsets.first().is_some_and(|&first| first <= offset) {
            return Err(Error::BadSchedule {
                offsets: offsets.to_vec(),
                offset,
            });
        }
        self.pending = offsets.iter().copied().collect();
        self.base = offset;
        Ok(())
    }

    /// Drops every offset not reached yet (after a rewind or restore, or once captures are
    /// taken).
    pub fn clear(&mut self) {
        self.pending.clear();
    }

    /// Pops the offsets a write of `from..to` crosses (`from < c <= to`), each with the start of
    /// the range it closes.
    pub fn crossed(&mut self, from: usize, to: usize) -> Vec<(usize, usize)> {
        // Offsets at or below `from` cannot occur: writes only move forward from the schedule's
        // start, and rewinds clear it.
        let mut out = Vec::new();
        while let Some(&c) = self.pending.front() {
            if c <= from || c > to {
                break;
            }
            self.pending.pop_front();
            out.push((self.base, c));
            self.base = c;
        }
        out
    }

    /// The first pending offset strictly inside `start..start + len`.
    pub fn next_within(&self, start: usize, len: usize) -> Option<usize> {
        self.pending
            .iter()
            .copied()
            .find(|&c| c > start && c < start.saturating_add(len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crossing_pops_in_order_with_running_base() {
        let mut s = CaptureSchedule::default();
        s.set(&[3, 5, 9], 1, 0).unwrap();
        assert_eq!(s.crossed(1, 2), vec![]);
        assert_eq!(s.crossed(2, 5), vec![(1, 3), (3, 5)]);
        assert_eq!(s.next_within(5, 10), Some(9));
        assert_eq!(s.next_within(5, 4), None);
        assert_eq!(s.crossed(5, 9), vec![(5, 9)]);
    }

    #[test]
    fn bad_schedules_are_refused() {
        let mut s = CaptureSchedule::default();
        assert!(matches!(
            s.set(&[3, 3], 0, 0),
            Err(Error::BadSchedule { .. })
        ));
        assert!(matches!(
            s.set(&[2, 1], 0, 0),
            Err(Error::BadSchedule { .. })
        ));
        assert!(matches!(s.set(&[4], 4, 0), Err(Error::BadSchedule { .. })));
        assert!(matches!(
            s.set(&[5], 4, 2),
            Err(Error::CapturesPending { count: 2 })
        ));
    }
}
