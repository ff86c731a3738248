//! The fixed-capacity ring of a slot's most recent tokens, kept on the device.
//!
//! Penalties do not care about order inside the window, so a ring whose shape never changes
//! (one slice update per appended token) replaces concatenate-and-trim, which would change the
//! graph's shapes and allocate every step. Empty places hold `-1`. Where the next token goes is
//! known on the host (it counts appends), so no append needs a host sync.

use mlx::{Array, Dtype, SliceSpec};

use crate::{Error, Result};

/// The last `capacity` tokens of one slot.
#[derive(Debug)]
pub(crate) struct Ring {
    /// `[capacity]` i32, `-1` where nothing was written yet; `None` when the capacity is 0.
    tokens: Option<Array>,
    capacity: usize,
    /// Tokens appended since the ring was made (the prompt included).
    written: u64,
}

impl Ring {
    /// A ring of `capacity` holding the last `capacity` tokens of `history`.
    pub(crate) fn new(capacity: usize, history: &[u32]) -> Result<Ring> {
        let tokens = if capacity == 0 {
            None
        } else {
            Some(Array::full(&[to_i32(capacity)?], -1.0, Dtype::I32)?)
        };
        let mut ring = Ring {
            tokens,
            capacity,
            written: 0,
        };
        ring.append_host(history)?;
        Ok(ring)
    }

    /// The device ring, `[capacity]` i32; `None` when the capacity is 0.
    pub(crate) fn tokens(&self) -> Option<&Array> {
        self.tokens.as_ref()
    }

    /// Where the next token goes.
    fn next_place(&self) -> usize {
        (self.written % self.capacity.max(1) as u64) as usize
    }

    /// Appends one token that lives on the device (`[1]`, any integer dtype): one slice update.
    pub(crate) fn append_device(&mut self, token: &Array) -> Result<()> {
        if let Some(tokens) = &self.tokens {
            let place = to_i32(self.next_place())?;
            let token = token.astype(Dtype::I32)?.reshape(&[1])?;
            self.tokens =
                Some(tokens.slice_update(&token, &SliceSpec::new(&[place], &[place + 1]))?);
        }
        self.written += 1;
        Ok(())
    }

    /// Appends host tokens: at most two slice updates (before and after the wrap), whatever
    /// their number.
    pub(crate) fn append_host(&mut self, history: &[u32]) -> Result<()> {
        for &token in history {
            if i32::try_from(token).is_err() {
                return Err(Error::TokenTooLarge(token));
            }
        }
        let Some(mut tokens) = self.tokens.take() else {
            self.written += history.len() as u64;
            return Ok(());
        };
        let kept = &history[history.len().saturating_sub(self.capacity)..];
        // Tokens older than the kept ones would be overwritten anyway.
        self.written += (history.len() - kept.len()) as u64;
        let mut rest = kept;
        while !rest.is_empty() {
            let place = self.next_place();
            let run = rest.len().min(self.capacity - place);
            let values: Vec<i32> = rest[..run].iter().map(|&t| t as i32).collect();
            let update = Array::from_slice(&values, &[to_i32(run)?])?;
            let spec = SliceSpec::new(&[to_i32(place)?], &[to_i32(place + run)?]);
            tokens = tokens.slice_update(&update, &spec)?;
            self.written += run as u64;
            rest = &rest[run..];
        }
        self.tokens = Some(tokens);
        Ok(())
    }

    /// The windows that `rows` verification rows see: row `i` as if the first
    /// `drafts - rows + 1 + i` tokens of the `drafts`-token `chain` (`[drafts]` i32) had been
    /// appended, so the rows align with the end of the chain. `[rows, capacity]` i32, or `None`
    /// when the capacity is 0.
    pub(crate) fn windows_with_chain(
        &self,
        chain: Option<&Array>,
        drafts: usize,
        rows: usize,
    ) -> Result<Option<Array>> {
        let Some(tokens) = &self.tokens else {
            return Ok(None);
        };
        let w = self.capacity;
        // Index into concat(ring, chain): ring places first, draft m at `w + m`. Computed on the
        // host, since where each draft lands depends only on host-known counts.
        let mut index = Vec::with_capacity(rows * w);
        for row in 0..rows {
            let appended = drafts + 1 + row - rows;
            let mut places: Vec<i32> = (0..to_i32(w)?).collect();
            for m in 0..appended {
                let place = ((self.written + m as u64) % w as u64) as usize;
                places[place] = to_i32(w + m)?;
            }
            index.extend(places);
        }
        let source = match chain {
            Some(chain) if drafts > 0 => mlx::concatenate(&[tokens.clone(), chain.clone()], 0)?,
            _ => tokens.clone(),
        };
        let index = Array::from_slice(&index, &[to_i32(rows)?, to_i32(w)?])?;
        Ok(Some(source.take(&index, 0)?))
    }

    /// The tokens in the ring, oldest first (reads the device).
    pub(crate) fn read(&self) -> Result<Vec<u32>> {
        let Some(tokens) = &self.tokens else {
            return Ok(Vec::new());
        };
        let values = tokens.to_vec::<i32>()?;
        let start = if self.written >= self.capacity as u64 {
            self.next_place()
        } else {
            0
        };
        Ok(values[start..]
            .iter()
            .chain(&values[..start])
            .filter(|&&t| t >= 0)
            .map(|&t| t as u32)
            .collect())
    }
}

/// A host count as an MLX dimension.
pub(crate) fn to_i32(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| {
        Error::Mlx(mlx::Error::InvalidArgument(format!(
            "{n} does not fit an MLX dimension"
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_last_tokens_across_wraps() {
        let mut ring = Ring::new(4, &[1, 2]).unwrap();
        assert_eq!(ring.read().unwrap(), vec![1, 2]);
        ring.append_host(&[3, 4, 5]).unwrap();
        assert_eq!(ring.read().unwrap(), vec![2, 3, 4, 5]);
        ring.append_device(&Array::from_slice(&[6u32], &[1]).unwrap())
            .unwrap();
        assert_eq!(ring.read().unwrap(), vec![3, 4, 5, 6]);
        ring.append_host(&[7, 8, 9, 10, 11, 12]).unwrap();
        assert_eq!(ring.read().unwrap(), vec![9, 10, 11, 12]);
        assert_eq!(ring.tokens().unwrap().shape(), vec![4]);
    }

    #[test]
    fn zero_capacity_holds_nothing() {
        let mut ring = Ring::new(0, &[1, 2, 3]).unwrap();
        ring.append_host(&[4]).unwrap();
        assert!(ring.tokens().is_none());
        assert_eq!(ring.read().unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn chain_windows_align_with_the_end_of_the_chain() {
        let ring = Ring::new(3, &[1, 2, 3, 4]).unwrap(); // holds 2 3 4, next place 1
        let chain = Array::from_slice(&[10i32, 11], &[2]).unwrap();
        let windows = ring
            .windows_with_chain(Some(&chain), 2, 3)
            .unwrap()
            .unwrap();
        let rows = windows.to_vec::<i32>().unwrap();
        let mut rows: Vec<Vec<i32>> = rows.chunks(3).map(|r| r.to_vec()).collect();
        for row in &mut rows {
            row.sort();
        }
        assert_eq!(rows, vec![vec![2, 3, 4], vec![3, 4, 10], vec![4, 10, 11]]);
        // One row sees the whole chain.
        let last = ring
            .windows_with_chain(Some(&chain), 2, 1)
            .unwrap()
            .unwrap();
        let mut last = last.to_vec::<i32>().unwrap();
        last.sort();
        assert_eq!(last, vec![4, 10, 11]);
    }

    #[test]
    fn huge_token_ids_are_errors() {
        assert!(matches!(
            Ring::new(2, &[u32::MAX]),
            Err(Error::TokenTooLarge(u32::MAX))
        ));
    }
}
