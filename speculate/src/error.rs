//! The error type of every fallible call in this crate.

use std::fmt;
use std::path::PathBuf;

/// Which probability row an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Row {
    /// Row `i` of the target distributions handed to [`verify`](crate::verify).
    Target(usize),
    /// Row `i` of a [`DraftProbs::Dense`](crate::DraftProbs::Dense) draft.
    Draft(usize),
}

impl fmt::Display for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Row::Target(i) => write!(f, "target row {i}"),
            Row::Draft(i) => write!(f, "draft row {i}"),
        }
    }
}

/// What was wrong with a call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Verification needs one target row per draft token plus one for the token after them.
    #[error("{rows} target rows for {drafts} draft tokens; expected drafts + 1")]
    RowCount {
        /// Target rows given.
        rows: usize,
        /// Draft tokens given.
        drafts: usize,
    },
    /// A dense draft needs one probability row per token.
    #[error("{rows} draft probability rows for {drafts} draft tokens; expected one per token")]
    DraftRowCount {
        /// Draft rows given.
        rows: usize,
        /// Draft tokens given.
        drafts: usize,
    },
    /// Greedy verification needs one target argmax per draft token plus one.
    #[error("{argmax} target argmax tokens for {drafts} draft tokens; expected drafts + 1")]
    ArgmaxCount {
        /// Argmax tokens given.
        argmax: usize,
        /// Draft tokens given.
        drafts: usize,
    },
    /// The first target row has no entries.
    #[error("target row 0 is empty: a distribution needs a vocabulary")]
    EmptyVocabulary,
    /// A row's width differs from the first target row's.
    #[error("{row} has {width} entries; target row 0 has {vocab}")]
    RowWidth {
        /// The row.
        row: Row,
        /// Its width.
        width: usize,
        /// The vocabulary size (target row 0's width).
        vocab: usize,
    },
    /// A draft token is outside the vocabulary of the rows.
    #[error("draft token {position} is {token}, outside the vocabulary of {vocab}")]
    TokenOutOfVocab {
        /// Its position in the draft (0-based).
        position: usize,
        /// The token id.
        token: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// A probability is NaN, infinite or negative.
    #[error("{row}[{index}] = {value}; probabilities must be finite and non-negative")]
    InvalidProbability {
        /// The row.
        row: Row,
        /// The token whose probability it is.
        index: usize,
        /// The value found.
        value: f32,
    },
    /// A row sums to zero: nothing can be drawn from it.
    #[error("{row} has no probability mass")]
    ZeroMass {
        /// The row.
        row: Row,
    },
    /// A dense draft gives its own token probability zero, so it cannot have been drawn from
    /// that row; accepting it would break the losslessness argument.
    #[error(
        "draft token {position} ({token}) has probability 0 in the draft row it was drawn from"
    )]
    ImpossibleDraft {
        /// Its position in the draft (0-based).
        position: usize,
        /// The token id.
        token: u32,
    },
    /// After a rejection neither the residual nor the target without the rejected token has
    /// any mass left: the target row put all its mass on the token it just rejected, which
    /// only rounding can produce.
    #[error("target row {row}: no probability mass left after rejecting draft token {token}")]
    NoResidual {
        /// The target row of the rejection.
        row: usize,
        /// The rejected token.
        token: u32,
    },
    /// A configuration value is outside its meaningful range.
    #[error("{field} = {value}: {reason}")]
    InvalidConfig {
        /// The field's name.
        field: &'static str,
        /// The value given.
        value: usize,
        /// What the value must be.
        reason: &'static str,
    },
    /// Saved depth-controller state or a decision log is not valid JSON of the right shape.
    #[error("malformed depth controller JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Saved depth-controller state parses but is inconsistent (wrong lengths, NaN means, an
    /// unknown version).
    #[error("invalid depth controller state: {0}")]
    InvalidState(String),
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
