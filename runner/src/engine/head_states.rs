//! The target's final states a drafter head has not read yet.
//!
//! A multi-token-prediction head (`mtp`) drafts from the target's final state at each position
//! (`nn::Forward::conditioning`), paired with the token after it. Every forward over a
//! sequence that speculates with one (its prompt's chunks, plain decode steps, the positions a
//! round accepted) leaves those rows here, and the head reads them at its next round. Nothing
//! is kept for any other sequence.

use mlx::Array;

/// A sequence's target states at consecutive positions, not yet read by its head.
#[derive(Default)]
pub struct HeadStates {
    /// The position of the first row held.
    from: usize,
    /// The position after the last row held (or read): where the next rows continue.
    next: Option<usize>,
    /// `[1, r, hidden]` pieces, in position order.
    pieces: Vec<Array>,
}

impl HeadStates {
    /// Keeps `rows` (`[1, r, hidden]`), the states at positions `position..position + r`.
    /// Rows that do not continue what was held (the caches restarted there: a prefix restored
    /// from the trie, a round rolled back) start over from `position`.
    pub fn push(&mut self, position: usize, rows: Array) -> mlx::Result<()> {
        let count = usize::try_from(rows.dim(1)?).unwrap_or(0);
        if self.next != Some(position) {
            self.pieces.clear();
            self.from = position;
        }
        self.pieces.push(rows);
        self.next = Some(position + count);
        Ok(())
    }

    /// The rows held, as the position of the first and `[1, rows, hidden]`; `None` when there
    /// are none. What comes next continues after them.
    pub fn take(&mut self) -> mlx::Result<Option<(usize, Array)>> {
        if self.pieces.is_empty() {
            return Ok(None);
        }
        let rows = mlx::concatenate(&std::mem::take(&mut self.pieces), 1)?;
        let from = self.from;
        self.from = self.next.unwrap_or(from);
        Ok(Some((from, rows)))
    }

    /// Forgets everything: the next rows start afresh.
    pub fn clear(&mut self) {
        self.pieces.clear();
        self.next = None;
    }
}
