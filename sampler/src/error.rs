//! The error type of every fallible sampler call.

use crate::SlotId;

/// What was wrong with a sampler call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The slot was never added, or was removed.
    #[error("slot {0} is not registered")]
    UnknownSlot(SlotId),
    /// `add` was called for a slot that is still registered.
    #[error("slot {0} is already registered")]
    SlotInUse(SlotId),
    /// One call named the same slot for two rows.
    #[error("slot {0} appears twice in one call")]
    DuplicateSlot(SlotId),
    /// A call named no slot.
    #[error("no slots given")]
    NoSlots,
    /// An option is outside its meaningful range.
    #[error("option {name} = {value}: {reason}")]
    InvalidOption {
        /// The option's name, as in the Ollama API.
        name: &'static str,
        /// The value given.
        value: String,
        /// What the value must be.
        reason: &'static str,
    },
    /// The logits are not `[rows, vocab]` for the rows of the call.
    #[error("logits have shape {shape:?}; expected [{rows}, vocab] with 0 < vocab < 2^31")]
    LogitsShape {
        /// The shape given.
        shape: Vec<i32>,
        /// The number of rows the call needs.
        rows: usize,
    },
    /// The logits are not floating point.
    #[error("logits have dtype {0:?}; expected a floating-point type")]
    LogitsDtype(mlx::Dtype),
    /// The number of token masks differs from the number of rows.
    #[error("{masks} token masks for {rows} rows")]
    MaskCount {
        /// Masks given.
        masks: usize,
        /// Rows in the call.
        rows: usize,
    },
    /// A token mask has fewer words than the vocabulary needs.
    #[error("row {row}: token mask has {words} words, a vocabulary of {vocab} needs {needed}")]
    MaskTooShort {
        /// The row whose mask is short.
        row: usize,
        /// Words given.
        words: usize,
        /// The vocabulary size.
        vocab: usize,
        /// Words needed.
        needed: usize,
    },
    /// A token mask allows no token of the vocabulary.
    #[error("row {row}: token mask allows no token")]
    MaskEmpty {
        /// The row whose mask is empty.
        row: usize,
    },
    /// A token id (in a prompt, a logit bias or a commit) is outside the vocabulary.
    #[error("token {token} is outside the vocabulary of {vocab}")]
    TokenOutOfVocab {
        /// The offending token id.
        token: u32,
        /// The vocabulary size of the logits.
        vocab: usize,
    },
    /// A token id does not fit the device's signed 32-bit history.
    #[error("token {0} is too large for a token id (at most 2^31 - 1)")]
    TokenTooLarge(u32),
    /// A slot's logits changed vocabulary size between calls.
    #[error("slot {slot} was sampled with a vocabulary of {expected}, now {found}")]
    VocabChanged {
        /// The slot.
        slot: SlotId,
        /// The vocabulary seen first.
        expected: usize,
        /// The vocabulary seen now.
        found: usize,
    },
    /// The draft chain is not a vector of token ids.
    #[error("draft chain has shape {shape:?} and dtype {dtype:?}; expected [n] or [1, n] integers")]
    ChainShape {
        /// The shape given.
        shape: Vec<i32>,
        /// The dtype given.
        dtype: mlx::Dtype,
    },
    /// `distribution` asked for more rows than the draft chain can align with.
    #[error("{rows} distribution rows for a draft chain of {drafts} tokens; at most drafts + 1")]
    TooManyRows {
        /// Rows asked for.
        rows: usize,
        /// Draft tokens given.
        drafts: usize,
    },
    /// MLX failed.
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
