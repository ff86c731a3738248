//! Repeat, presence and frequency penalties over each row's window of recent tokens.
//!
//! For every token `t` present `c > 0` times in the window: the repeat penalty divides a
//! positive logit and multiplies a negative one (llama.cpp's rule), then `presence` is
//! subtracted once and `frequency · c` on top. Tokens absent from the window are untouched.
//!
//! MLX has no scatter-add, so occurrence counts come from sorting the window: equal tokens
//! form runs, each run's length is its count, and every place of a run writes the same new
//! logit back (duplicate writes agree, so their order does not matter). Cost is
//! `O(W log W)` per row, independent of the vocabulary.

use mlx::{Array, Dtype};

use crate::Result;

/// The penalty strengths of one option set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Penalties {
    pub(crate) repeat: f32,
    pub(crate) presence: f32,
    pub(crate) frequency: f32,
}

impl Penalties {
    /// Applies the penalties to `logits` (`[B, V]` f32) for the windows (`[B, W]` i32, `-1` for
    /// empty places). Every id in the windows must be below `V`.
    pub(crate) fn apply(&self, logits: &Array, windows: &Array) -> Result<Array> {
        let w = windows.dim(1)?;
        let b = windows.dim(0)?;
        if w == 0 {
            return Ok(logits.clone());
        }
        let sorted = windows.sort(1)?;
        let valid = sorted.greater_equal(0)?;
        // A run starts where a token differs from the one before it.
        let before = mlx::concatenate(
            &[
                Array::full(&[b, 1], -2.0, Dtype::I32)?,
                sorted.slice_axis(1, 0, w - 1)?,
            ],
            1,
        )?;
        let starts = sorted.not_equal(&before)?;
        let run = starts.astype(Dtype::I32)?.cumsum(1, false, true)?; // 1-based run number
        // Table of run start places: run r starts at table[r]; table[last run + 1] = W. Places
        // that start no run write W into the spare slot W + 1.
        let place = Array::arange(0.0, f64::from(w), 1.0, Dtype::I32)?.reshape(&[1, w])?;
        let spare = Array::full(&[b, w], (w + 1) as f32, Dtype::I32)?;
        let table_index = starts.select(&run, &spare)?;
        let table_value = starts.select(&place.broadcast_to(&[b, w])?, w)?;
        let table = Array::full(&[b, w + 2], w as f32, Dtype::I32)?.put_along_axis(
            &table_index,
            &table_value,
            1,
        )?;
        let run_end = table.take_along_axis(&run.add(1)?, 1)?;
        let run_start = table.take_along_axis(&run, 1)?;
        let count = valid.select(&run_end.subtract(&run_start)?, 0)?;
        // Empty places must write somewhere: they borrow the last place (the largest token, or
        // an empty place mapped to token 0 with count 0 when the window is empty), and write
        // what it writes.
        let last_token = sorted.slice_axis(1, w - 1, w)?.maximum(0)?;
        let last_count = count.slice_axis(1, w - 1, w)?;
        let token = valid.select(&sorted, &last_token)?;
        let count = valid.select(&count, &last_count)?;

        let old = logits.take_along_axis(&token, 1)?;
        let present = count.greater(0)?;
        let mut new = old.clone();
        if self.repeat != 1.0 {
            let scaled = old
                .greater(0.0)?
                .select(&old.divide(self.repeat)?, &old.multiply(self.repeat)?)?;
            new = present.select(&scaled, &new)?;
        }
        if self.presence != 0.0 {
            new = new.subtract(&present.astype(Dtype::F32)?.multiply(self.presence)?)?;
        }
        if self.frequency != 0.0 {
            new = new.subtract(&count.astype(Dtype::F32)?.multiply(self.frequency)?)?;
        }
        Ok(logits.put_along_axis(&token, &new, 1)?)
    }
}
