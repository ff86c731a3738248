//! Which offsets a prefill should capture snapshots at.

use crate::prompt::{Prompt, span_containing};

/// The capture cadence `begin` schedules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulePolicy {
    /// Capture at every multiple of this many keys, so a cancelled long prefill loses at most
    /// this much on retry. Zero disables periodic captures.
    pub interval: usize,
    /// Capture this many keys before the prompt's end: the next turn usually re-renders the
    /// reply (thinking stripped), so the end of the prompt proper is where it diverges.
    pub before_end: usize,
}

impl Default for SchedulePolicy {
    fn default() -> Self {
        SchedulePolicy {
            interval: 8192,
            before_end: 4,
        }
    }
}

impl SchedulePolicy {
    /// Ascending, unique offsets in `(restore_at, keys]`: periodic points, the point before the
    /// end, the branch point (`matched`, when the request resumes before it) and the caller's
    /// turn starts. An offset inside a non-causal media item moves to the item's end.
    pub(crate) fn capture_offsets(
        &self,
        prompt: &Prompt,
        restore_at: usize,
        matched: usize,
        turn_starts: &[usize],
    ) -> Vec<usize> {
        let end = prompt.keys().len();
        let mut offsets = Vec::new();
        if let Some(periods_done) = restore_at.checked_div(self.interval) {
            let mut next = (periods_done + 1).saturating_mul(self.interval);
            while next <= end {
                offsets.push(next);
                next = next.saturating_add(self.interval);
            }
        }
        offsets.push(end.saturating_sub(self.before_end));
        if restore_at < matched {
            offsets.push(matched);
        }
        offsets.extend_from_slice(turn_starts);
        for offset in &mut offsets {
            if let Some(span) = span_containing(prompt.non_causal(), *offset) {
                *offset = span.end;
            }
        }
        offsets.retain(|&offset| restore_at < offset && offset <= end);
        offsets.sort_unstable();
        offsets.dedup();
        offsets
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Lookahead;
    use crate::prompt::MediaItem;

    fn prompt(len: u32, media: &[MediaItem]) -> Prompt {
        let tokens: Vec<u32> = (0..len).collect();
        Prompt::new(&tokens, media, Lookahead::None).unwrap()
    }

    #[test]
    fn periodic_end_branch_and_turns() {
        let policy = SchedulePolicy {
            interval: 8,
            before_end: 4,
        };
        let offsets = policy.capture_offsets(&prompt(30, &[]), 3, 12, &[20, 40, 2]);
        assert_eq!(offsets, [8, 12, 16, 20, 24, 26]);
    }

    #[test]
    fn nothing_at_or_before_the_restore_point() {
        let policy = SchedulePolicy {
            interval: 0,
            before_end: 4,
        };
        assert_eq!(
            policy.capture_offsets(&prompt(10, &[]), 6, 6, &[3]),
            Vec::<usize>::new()
        );
        assert_eq!(policy.capture_offsets(&prompt(10, &[]), 5, 5, &[]), [6]);
    }

    #[test]
    fn captures_inside_non_causal_media_move_to_its_end() {
        let image = MediaItem {
            tokens: 4..9,
            content_hash: 7,
            causal: false,
        };
        let policy = SchedulePolicy {
            interval: 5,
            before_end: 4,
        };
        let offsets = policy.capture_offsets(&prompt(12, &[image]), 0, 0, &[6]);
        assert_eq!(offsets, [9, 10]);
        let causal = MediaItem {
            tokens: 4..9,
            content_hash: 7,
            causal: true,
        };
        let offsets = policy.capture_offsets(&prompt(12, &[causal]), 0, 0, &[6]);
        assert_eq!(offsets, [5, 6, 8, 10]);
    }
}
