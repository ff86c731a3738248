//! The crate's error type.

use std::ops::Range;

/// Which kind of cache an error concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CacheKind {
    /// Full-attention KV cache.
    Kv,
    /// Sliding-window KV cache.
    Rotating,
    /// Convolution tail and recurrent state.
    Recurrent,
}

impl std::fmt::Display for CacheKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CacheKind::Kv => "KV cache",
            CacheKind::Rotating => "rotating KV cache",
            CacheKind::Recurrent => "recurrent cache",
        })
    }
}

/// Everything that can go wrong in this crate; each variant names the offending value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// MLX raised an error.
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
    /// An input array has the wrong number of dimensions or a shape that does not fit.
    #[error("{what}: expected shape {expected}, got {found:?}")]
    Shape {
        /// Which input.
        what: &'static str,
        /// The shape required, in words.
        expected: String,
        /// The shape given.
        found: Vec<i32>,
    },
    /// An input array has a dtype other than the one the cache holds.
    #[error("{what}: expected dtype {expected:?}, got {found:?}")]
    Dtype {
        /// Which input.
        what: &'static str,
        /// The dtype required.
        expected: mlx::Dtype,
        /// The dtype given.
        found: mlx::Dtype,
    },
    /// A range or offset lies outside what the cache holds.
    #[error("{kind}: range {range:?} is outside the cached offsets 0..{offset}")]
    RangeOutOfBounds {
        /// The cache kind.
        kind: CacheKind,
        /// The range asked for.
        range: Range<usize>,
        /// The cache's offset.
        offset: usize,
    },
    /// The cache kind cannot rewind to this offset (its state there is gone).
    #[error("{kind}: cannot rewind from offset {from} to {to}{reason}")]
    CannotRewind {
        /// The cache kind.
        kind: CacheKind,
        /// The current offset.
        from: usize,
        /// The offset asked for.
        to: usize,
        /// Why, starting with a separator.
        reason: &'static str,
    },
    /// A snapshot cannot be restored into this cache at its current offset.
    #[error("{kind}: cannot restore a snapshot of {coverage} at offset {offset}: {reason}")]
    CannotRestore {
        /// The cache kind.
        kind: CacheKind,
        /// What the snapshot covers, in words.
        coverage: String,
        /// The cache's offset.
        offset: usize,
        /// Why not.
        reason: &'static str,
    },
    /// A snapshot of one kind was given to an operation of another kind.
    #[error("expected a snapshot of a {expected}, got one of a {found}")]
    KindMismatch {
        /// The kind required.
        expected: CacheKind,
        /// The kind given.
        found: CacheKind,
    },
    /// Two snapshots to merge are not adjacent.
    #[error("cannot merge snapshots of {first:?} and {second:?}: they are not adjacent")]
    NotAdjacent {
        /// The earlier snapshot's range.
        first: Range<usize>,
        /// The later snapshot's range.
        second: Range<usize>,
    },
    /// A split offset is not strictly inside the snapshot's range.
    #[error("cannot split a snapshot of {range:?} at {at}: the offset must lie strictly inside")]
    SplitOutside {
        /// The snapshot's range.
        range: Range<usize>,
        /// The offset asked for.
        at: usize,
    },
    /// A lazy snapshot whose cache went away without it being copied out.
    #[error("the snapshot of {range:?} lost its data: {reason}")]
    SnapshotLost {
        /// The snapshot's range.
        range: Range<usize>,
        /// What happened.
        reason: String,
    },
    /// Scheduled capture offsets must be ascending, unique and beyond the current offset.
    #[error("capture offsets {offsets:?} must be ascending, unique and above offset {offset}")]
    BadSchedule {
        /// The offsets given.
        offsets: Vec<usize>,
        /// The cache's offset.
        offset: usize,
    },
    /// A new schedule was given while captures of the previous one were not taken yet.
    #[error("{count} captures of the previous schedule were not taken yet")]
    CapturesPending {
        /// How many captures are waiting.
        count: usize,
    },
    /// A recurrent forward stepped over a scheduled capture offset instead of stopping at it.
    #[error(
        "advancing the recurrent cache from {from} by {by} skips the capture scheduled at {at}; \
         split the forward there (see `next_capture_within`)"
    )]
    CaptureSkipped {
        /// The offset before advancing.
        from: usize,
        /// Tokens advanced.
        by: usize,
        /// The capture offset stepped over.
        at: usize,
    },
    /// The operation does not exist for this cache kind.
    #[error("{kind} does not support {operation}")]
    Unsupported {
        /// The cache kind.
        kind: CacheKind,
        /// The operation.
        operation: &'static str,
    },
    /// A size or offset too large for MLX's 32-bit shapes.
    #[error("{what} {value} does not fit MLX's 32-bit dimensions")]
    TooLarge {
        /// Which value.
        what: &'static str,
        /// The value.
        value: usize,
    },
    /// A constructor argument that makes no sense (a window of zero tokens, say).
    #[error("invalid cache configuration: {0}")]
    Config(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
