//! Masks: the model's logical view, the cache's storage restrictions, and the composed mask
//! handed to `mlx::fast::scaled_dot_product_attention`.
//!
//! A cache knows which token position each key column holds and which of them its storage
//! lets a query see (a sliding window, a kept prefix); the model knows its own rule (causal,
//! or a local window). [`MaskApplier::attention_mask`] intersects both and picks MLX's
//! no-mask or causal fast path whenever the result is exactly that, building a boolean array
//! only otherwise.

use mlx::fast::AttentionMask;
use mlx::{Array, Dtype};

use crate::error::{Error, Result};
use crate::tensor::dim;

/// The model's own attention rule, in token positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogicalMask {
    /// A query at position `q` sees every key at `p <= q`.
    Causal,
    /// A query at `q` sees keys at `q - w < p <= q` (a local layer over a full cache).
    SlidingWindow(usize),
    /// A query at `q` sees keys at `p <= q` in its own chunk of `c` positions:
    /// `⌊p / c⌋ = ⌊q / c⌋` (Llama 4's chunked attention layers).
    Chunked(usize),
}

/// A composed mask that owns its array; [`AttentionMaskOwned::as_mask`] lends it to MLX.
#[derive(Clone, Debug)]
pub enum AttentionMaskOwned {
    /// Every query sees every key.
    None,
    /// MLX's causal mode: query `i` of `n` sees key columns `0..=S - n + i`.
    Causal,
    /// Boolean `[queries, keys]`, true where a query may attend.
    Array(Array),
}

impl AttentionMaskOwned {
    /// The mask in the form `scaled_dot_product_attention` takes.
    pub fn as_mask(&self) -> AttentionMask<'_> {
        match self {
            AttentionMaskOwned::None => AttentionMask::None,
            AttentionMaskOwned::Causal => AttentionMask::Causal,
            AttentionMaskOwned::Array(array) => AttentionMask::Array(array),
        }
    }
}

/// A run of key columns holding consecutive positions `start..start + len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeySpan {
    pub start: usize,
    pub len: usize,
}

/// What a cache's storage lets a query see, on top of causality.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StorageWindow {
    /// Keys at `p <= q - window` are invisible, except the kept prefix.
    pub window: usize,
    /// Positions `0..keep` stay visible whatever the window.
    pub keep: usize,
}

/// Merges a cache's storage restrictions into the model's logical mask.
///
/// It describes the key columns of the [`KvHistory`] it came with: which position each
/// column holds, and what the storage hides. Queries are the last `queries` positions before
/// the cache's offset, as in every forward that updated the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MaskApplier {
    offset: usize,
    spans: Vec<KeySpan>,
    storage: Option<StorageWindow>,
}

impl MaskApplier {
    /// The same columns under another storage rule.
    pub(crate) fn with_storage(mut self, storage: StorageWindow) -> Self {
        self.storage = Some(storage);
        self
    }

    pub(crate) fn new(offset: usize, spans: &[KeySpan], storage: Option<StorageWindow>) -> Self {
        let mut merged: Vec<KeySpan> = Vec::with_capacity(spans.len());
        for span in spans.iter().filter(|s| s.len > 0) {
            match merged.last_mut() {
                Some(last) if last.start + last.len == span.start => last.len += span.len,
                _ => merged.push(*span),
            }
        }
        MaskApplier {
            offset,
            spans: merged,
            storage,
        }
    }

    /// The number of key columns.
    pub fn key_len(&self) -> usize {
        self.spans.iter().map(|s| s.len).sum()
    }

    /// The token position each key column holds, in column order.
    pub fn key_positions(&self) -> Vec<usize> {
        self.spans
            .iter()
            .flat_map(|s| s.start..s.start + s.len)
            .collect()
    }

    /// The mask for `queries` query rows (the last `queries` positions before the cache's
    /// offset) under the model's `logical` rule. Fails when `queries` is zero or exceeds the
    /// tokens cached.
    pub fn attention_mask(
        &self,
        queries: usize,
        logical: LogicalMask,
    ) -> Result<AttentionMaskOwned> {
        if queries == 0 || queries > self.offset {
            return Err(Error::Config(format!(
                "{queries} query rows do not fit a cache at offset {}",
                self.offset
            )));
        }
        if let LogicalMask::SlidingWindow(0) | LogicalMask::Chunked(0) = logical {
            return Err(Error::Config(
                "a window or chunk of 0 tokens sees nothing".into(),
            ));
        }
        let q_lo = self.offset - queries;
        let q_hi = self.offset - 1;
        if self.all_visible(q_lo, q_hi, logical) {
            return Ok(AttentionMaskOwned::None);
        }
        if self.causal_exact(q_hi, logical) {
            return Ok(AttentionMaskOwned::Causal);
        }
        self.array_mask(q_lo, queries, logical)
            .map(AttentionMaskOwned::Array)
    }

    /// Whether the window rules let every query in `..=q_hi` see every position from `p` up to
    /// the query itself.
    fn windows_allow(&self, p: usize, q_hi: usize, logical: LogicalMask) -> bool {
        let storage_ok = match self.storage {
            None => true,
            Some(s) => p < s.keep || p.saturating_add(s.window) > q_hi,
        };
        let logical_ok = match logical {
            LogicalMask::Causal => true,
            LogicalMask::SlidingWindow(w) => p.saturating_add(w) > q_hi,
            // Visible to every query up to `q_hi` only inside the chunk holding `q_hi`.
            LogicalMask::Chunked(c) => p >= q_hi - q_hi % c,
        };
        storage_ok && logical_ok
    }

    fn all_visible(&self, q_lo: usize, q_hi: usize, logical: LogicalMask) -> bool {
        self.spans.iter().all(|span| {
            let last = span.start + span.len - 1;
            // The window rules are monotone in p, so the smallest position of the span decides;
            // for the storage rule, the smallest one outside the kept prefix.
            let first_windowed = match self.storage {
                Some(s) if span.start < s.keep => s.keep.min(last),
                _ => span.start,
            };
            last <= q_lo
                && self.windows_allow(span.start, q_hi, logical)
                && self.windows_allow(first_windowed, q_hi, logical)
        })
    }

    fn causal_exact(&self, q_hi: usize, logical: LogicalMask) -> bool {
        // MLX's causal mode aligns the queries to the end of the keys, so the columns must be one
        // run of consecutive positions ending at the last query.
        let [span] = self.spans.as_slice() else {
            return false;
        };
        if span.start + span.len - 1 != q_hi {
            return false;
        }
        let first_windowed = match self.storage {
            Some(s) if span.start < s.keep => s.keep.min(q_hi),
            _ => span.start,
        };
        self.windows_allow(span.start, q_hi, logical)
            && self.windows_allow(first_windowed, q_hi, logical)
    }

    fn array_mask(&self, q_lo: usize, queries: usize, logical: LogicalMask) -> Result<Array> {
        let positions = self
            .key_positions()
            .into_iter()
            .map(|p| dim(p, "key position"))
            .collect::<Result<Vec<i32>>>()?;
        let keys = dim(positions.len(), "key count")?;
        let kp = Array::from_slice(&positions, &[1, keys])?;
        let start = dim(q_lo, "query position")?;
        let stop = dim(q_lo + queries, "query position")?;
        let qp =
            Array::arange(f64::from(start), f64::from(stop), 1.0, Dtype::I32)?.reshape(&[-1, 1])?;
        let mut mask = kp.less_equal(&qp)?;
        // A window wider than the offset restricts nothing; clamp it so it fits an i32.
        let clamp = |w: usize| dim(w.min(self.offset + 1), "window");
        if let Some(s) = self.storage {
            let in_window = kp.add(clamp(s.window)?)?.greater(&qp)?;
            let kept = kp.less(dim(s.keep.min(self.offset), "kept prefix")?)?;
            mask = mask.logical_and(in_window.logical_or(kept)?)?;
        }
        if let LogicalMask::SlidingWindow(w) = logical {
            let in_window = kp.add(clamp(w)?)?.greater(&qp)?;
            mask = mask.logical_and(in_window)?;
        }
        if let LogicalMask::Chunked(c) = logical {
            let c = clamp(c)?;
            let chunk_start = |x: &Array| -> Result<Array> { Ok(x.subtract(&x.remainder(c)?)?) };
            let same_chunk = chunk_start(&kp)?.equal(&chunk_start(&qp)?)?;
            mask = mask.logical_and(same_chunk)?;
        }
        Ok(mask)
    }
}

/// What an attention layer reads after updating its cache: the visible keys and values
/// `[batch, kv_heads, keys, head_dim]` and how to mask them.
#[derive(Clone, Debug)]
pub struct KvHistory {
    /// Keys, one column per [`MaskApplier::key_positions`] entry, as the cache stores them:
    /// floats, or an 8-bit cache's byte rows ([`crate::KvStorage::Q8`]), which a kernel may
    /// read directly. [`KvHistory::floats`] gives floats either way.
    pub keys: Array,
    /// Values, in the same column order and form.
    pub values: Array,
    /// Turns the model's logical mask into the mask for these columns.
    pub mask: MaskApplier,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applier(
        offset: usize,
        spans: &[(usize, usize)],
        storage: Option<(usize, usize)>,
    ) -> MaskApplier {
        let spans: Vec<KeySpan> = spans
            .iter()
            .map(|&(start, len)| KeySpan { start, len })
            .collect();
        let storage = storage.map(|(window, keep)| StorageWindow { window, keep });
        MaskApplier::new(offset, &spans, storage)
    }

    /// Host-side truth: query `q` sees key `p`.
    fn visible(a: &MaskApplier, q: usize, p: usize, logical: LogicalMask) -> bool {
        let storage = a
            .storage
            .is_none_or(|s| p < s.keep || p.saturating_add(s.window) > q);
        let local = match logical {
            LogicalMask::Causal => true,
            LogicalMask::SlidingWindow(w) => p.saturating_add(w) > q,
            LogicalMask::Chunked(c) => p / c == q / c,
        };
        p <= q && storage && local
    }

    fn dense(a: &MaskApplier, queries: usize, logical: LogicalMask) -> Vec<bool> {
        let keys = a.key_positions();
        let mask = a.attention_mask(queries, logical).unwrap();
        let s = keys.len();
        match mask {
            AttentionMaskOwned::None => vec![true; queries * s],
            AttentionMaskOwned::Causal => (0..queries)
                .flat_map(|i| (0..s).map(move |j| j + queries <= s + i))
                .collect(),
            AttentionMaskOwned::Array(m) => m.to_bools().unwrap(),
        }
    }

    fn truth(a: &MaskApplier, queries: usize, logical: LogicalMask) -> Vec<bool> {
        let keys = a.key_positions();
        (a.offset - queries..a.offset)
            .flat_map(|q| keys.iter().map(move |&p| (q, p)))
            .map(|(q, p)| visible(a, q, p, logical))
            .collect()
    }

    #[test]
    fn full_cache_prefill_and_decode_take_fast_paths() {
        let a = applier(10, &[(0, 10)], None);
        assert!(matches!(
            a.attention_mask(10, LogicalMask::Causal).unwrap(),
            AttentionMaskOwned::Causal
        ));
        assert!(matches!(
            a.attention_mask(4, LogicalMask::Causal).unwrap(),
            AttentionMaskOwned::Causal
        ));
        assert!(matches!(
            a.attention_mask(1, LogicalMask::Causal).unwrap(),
            AttentionMaskOwned::None
        ));
        assert!(matches!(
            a.attention_mask(1, LogicalMask::SlidingWindow(4)).unwrap(),
            AttentionMaskOwned::Array(_)
        ));
        assert!(matches!(
            a.attention_mask(3, LogicalMask::SlidingWindow(10)).unwrap(),
            AttentionMaskOwned::Causal
        ));
    }

    #[test]
    fn every_mask_matches_the_host_rule() {
        let cases = [
            applier(10, &[(0, 10)], None),
            applier(12, &[(5, 7)], Some((4, 0))),
            applier(12, &[(0, 2), (7, 5)], Some((4, 2))),
            applier(9, &[(0, 2), (6, 3), (3, 3)], Some((6, 2))),
            applier(9, &[(6, 3), (2, 4)], Some((7, 0))),
        ];
        for a in &cases {
            for queries in 1..=a.offset.min(a.key_len()) {
                for logical in [
                    LogicalMask::Causal,
                    LogicalMask::SlidingWindow(3),
                    LogicalMask::SlidingWindow(50),
                    LogicalMask::Chunked(4),
                    LogicalMask::Chunked(5),
                    LogicalMask::Chunked(50),
                ] {
                    assert_eq!(
                        dense(a, queries, logical),
                        truth(a, queries, logical),
                        "{a:?} q={queries} {logical:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn bad_query_counts_are_errors() {
        let a = applier(3, &[(0, 3)], None);
        assert!(a.attention_mask(0, LogicalMask::Causal).is_err());
        assert!(a.attention_mask(4, LogicalMask::Causal).is_err());
        assert!(a.attention_mask(1, LogicalMask::SlidingWindow(0)).is_err());
        assert!(a.attention_mask(1, LogicalMask::Chunked(0)).is_err());
    }
}
