//! The `Snapshot` trait: what the trie needs to know about a cached layer state.
//!
//! Layers come in two shapes. A full-attention KV snapshot is *range-shaped*: it holds the
//! entries for positions `[start, end)`, can be split at any offset inside and merged with the
//! snapshot of the range right after it, and a cache can restore to any offset a chain of
//! them covers from zero. Sliding-window and recurrent snapshots are *point-shaped*: they are
//! the whole state after `end` positions and restore only to exactly that offset. The trie
//! never splits or merges point snapshots itself: a split gives the point to the tail and a
//! merge keeps the later one.

use std::ops::Range;

/// What a layer's cache is, which decides the shape of its snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// No state (e.g. a layer sharing another layer's KV); never has snapshots.
    Stateless,
    /// Range-shaped snapshots (full-attention KV).
    Range,
    /// Point-shaped snapshots (sliding-window or recurrent state).
    Point,
}

/// What a snapshot covers, in cache offsets (= key offsets in the trie).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Coverage {
    /// The entries for positions `[start, end)`.
    Range(Range<usize>),
    /// The whole state after this many positions.
    Point(usize),
}

impl Coverage {
    /// The offset a cache rests at right after restoring this snapshot.
    pub fn end(&self) -> usize {
        match self {
            Coverage::Range(range) => range.end,
            Coverage::Point(at) => *at,
        }
    }

    /// The layer kind whose snapshots have this shape.
    pub fn kind(&self) -> LayerKind {
        match self {
            Coverage::Range(_) => LayerKind::Range,
            Coverage::Point(_) => LayerKind::Point,
        }
    }
}

/// One layer's cached state, owned by the trie once attached.
///
/// The trie calls [`Snapshot::split`] and [`Snapshot::merge`] only on range-shaped snapshots.
/// Both consume their inputs; when they fail, those inputs are lost and the trie drops that
/// layer from the node concerned (a node may always lack a layer), then reports the error.
pub trait Snapshot: Sized {
    /// Why a split or merge failed (e.g. the tensor library ran out of memory).
    type Error: std::error::Error + Send + Sync + 'static;

    /// What this snapshot covers.
    fn coverage(&self) -> Coverage;

    /// Bytes this snapshot holds now. May grow later (a lazy view that gets copied out);
    /// [`crate::PrefixTrie::resync_bytes`] re-reads it.
    fn bytes(&self) -> usize;

    /// Splits a range snapshot `[start, end)` at `start < at < end` into `[start, at)` and
    /// `[at, end)`.
    fn split(self, at: usize) -> Result<(Self, Self), Self::Error>;

    /// Merges this range snapshot `[a, b)` with `later`, which covers `[b, c)`, into `[a, c)`.
    fn merge(self, later: Self) -> Result<Self, Self::Error>;

    /// Whether a cache can restore to exactly `offset` from this snapshot (plus, for a range
    /// snapshot, the snapshots covering everything before it).
    fn restores_to(&self, offset: usize) -> bool {
        match self.coverage() {
            Coverage::Range(range) => range.start < offset && offset <= range.end,
            Coverage::Point(at) => at == offset,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Shape(Coverage);

    impl Snapshot for Shape {
        type Error = std::convert::Infallible;
        fn coverage(&self) -> Coverage {
            self.0.clone()
        }
        fn bytes(&self) -> usize {
            0
        }
        fn split(self, _at: usize) -> Result<(Self, Self), Self::Error> {
            Ok((Shape(self.0.clone()), self))
        }
        fn merge(self, _later: Self) -> Result<Self, Self::Error> {
            Ok(self)
        }
    }

    #[test]
    fn range_snapshots_restore_anywhere_inside_and_points_only_at_their_offset() {
        let range = Shape(Coverage::Range(4..9));
        assert!(!range.restores_to(4));
        assert!(range.restores_to(5) && range.restores_to(9));
        assert!(!range.restores_to(10));
        let point = Shape(Coverage::Point(9));
        assert!(point.restores_to(9));
        assert!(!point.restores_to(8) && !point.restores_to(10));
        assert_eq!((range.0.end(), range.0.kind()), (9, LayerKind::Range));
        assert_eq!((point.0.end(), point.0.kind()), (9, LayerKind::Point));
    }
}
