//! The crate's error type.

use std::ops::Range;

use crate::session::SessionId;
use crate::snapshot::{Coverage, LayerKind};

/// Boxed error from a snapshot operation or a page-out callback.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in this crate; each variant names the offending value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A token id collides with the media key space (bit 31) or a pair half.
    #[error(
        "token id {id} at position {position} is too large for a trie key (ids must be < 2^31)"
    )]
    TokenIdOutOfRange {
        /// Position of the token in the prompt.
        position: usize,
        /// The offending id.
        id: u32,
    },
    /// A media item is empty or reaches past the end of the prompt.
    #[error(
        "media item {item} covers tokens {range:?}, outside a prompt of {tokens} tokens or empty"
    )]
    MediaOutOfBounds {
        /// Index of the item in the order given.
        item: usize,
        /// The token positions it claimed.
        range: Range<usize>,
        /// Number of tokens in the prompt.
        tokens: usize,
    },
    /// Media items must be given in order and must not overlap.
    #[error("media item {item} at {range:?} overlaps or precedes the item before it")]
    MediaOverlap {
        /// Index of the item in the order given.
        item: usize,
        /// The token positions it claimed.
        range: Range<usize>,
    },
    /// A prompt's keys were built with a different look-ahead than the trie uses.
    #[error("prompt keys use look-ahead {prompt} but the trie uses {trie}")]
    LookaheadMismatch {
        /// The trie's look-ahead.
        trie: usize,
        /// The prompt's look-ahead.
        prompt: usize,
    },
    /// The configuration is unusable.
    #[error("invalid configuration: {0}")]
    InvalidConfig(&'static str),
    /// A capture or page-out names a layer the trie does not have.
    #[error("layer {layer} does not exist (the trie has {layers} layers)")]
    LayerOutOfRange {
        /// The layer named.
        layer: usize,
        /// Number of layers configured.
        layers: usize,
    },
    /// A snapshot's shape does not fit its layer (a point snapshot for a range layer, or any
    /// snapshot for a stateless layer).
    #[error("layer {layer} is {kind:?} but was given a snapshot with coverage {coverage:?}")]
    ShapeMismatch {
        /// The layer.
        layer: usize,
        /// What the layer is configured as.
        kind: LayerKind,
        /// What the snapshot says it covers.
        coverage: Coverage,
    },
    /// A range snapshot covers nothing or runs backwards.
    #[error("layer {layer} snapshot covers the empty or reversed range {range:?}")]
    EmptyCoverage {
        /// The layer.
        layer: usize,
        /// What the snapshot claimed.
        range: Range<usize>,
    },
    /// A page-out callback returned a snapshot covering something other than what was asked.
    #[error("page-out for layer {layer} asked for {expected:?} and got {got:?}")]
    PageOutCoverage {
        /// The layer.
        layer: usize,
        /// What the trie asked for.
        expected: Coverage,
        /// What came back.
        got: Coverage,
    },
    /// `attach`, `close`, `restore_plan` or `frontier_offset` named a session that is not live
    /// (never begun, or already closed or abandoned).
    #[error("session {0} is not live; it was never begun or has ended")]
    UnknownSession(SessionId),
    /// A snapshot the session's restore plan needs is gone (a snapshot merge failed since
    /// `begin`); the session should be abandoned.
    #[error("session {session} cannot restore: node {node} lacks layer {layer}")]
    RestoreUnavailable {
        /// The session.
        session: SessionId,
        /// Arena index of the node on its restore path.
        node: usize,
        /// The missing layer.
        layer: usize,
    },
    /// The keys given to `close` do not extend the keys the session began with.
    #[error("closing keys differ from the request's prompt keys at offset {offset}")]
    KeysDiverged {
        /// First offset where they differ.
        offset: usize,
    },
    /// The caches claim to rest past the keys recorded for them.
    #[error("caches rest at offset {rest_at} but only {keys} keys were recorded")]
    CacheAheadOfKeys {
        /// Where the caller says the caches rest.
        rest_at: usize,
        /// How many keys were recorded.
        keys: usize,
    },
    /// The session's caches rest before the point it restored to.
    #[error("caches rest at offset {rest_at}, before the restore point {restore_at}")]
    RestBeforeRestorePoint {
        /// Where the caller says the caches rest.
        rest_at: usize,
        /// Where the request resumed.
        restore_at: usize,
    },
    /// A snapshot's own merge or split failed; the snapshots it consumed are gone and the node
    /// no longer has that layer.
    #[error("snapshot {op} failed on layer {layer}")]
    Snapshot {
        /// `"merge"` or `"split"`.
        op: &'static str,
        /// The layer.
        layer: usize,
        /// The snapshot's error.
        #[source]
        source: BoxError,
    },
    /// The page-out callback failed for a layer.
    #[error("page-out failed on layer {layer}")]
    PageOut {
        /// The layer.
        layer: usize,
        /// The callback's error.
        #[source]
        source: BoxError,
    },
    /// `check_invariants` found a broken rule; this is a bug in this crate.
    #[error("trie invariant violated: {0}")]
    Invariant(String),
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
