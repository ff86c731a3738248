//! The crate's error type: every way compiling or stepping a grammar can fail.

/// Errors of this crate. Messages name the offending input so that a server can hand them back
/// to the client verbatim.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The vocabulary cannot be turned into token bytes (unknown decoder, malformed entries).
    #[error("tokenizer vocabulary unusable for grammars: {0}")]
    Vocabulary(String),
    /// The tokenizer names no end-of-sequence token, so "the output is complete" cannot be
    /// expressed as a token.
    #[error("tokenizer has no end-of-sequence token; constrained output needs one")]
    NoEndOfSequence,
    /// A request asked for something this crate deliberately does not do.
    #[error("unsupported structured-output request: {0}")]
    Unsupported(String),
    /// A schema or grammar exceeds a size or nesting cap.
    #[error("{what} is too large: {actual} exceeds the limit of {limit}")]
    TooLarge {
        /// What was measured, such as "schema nesting depth".
        what: &'static str,
        /// The measured value.
        actual: usize,
        /// The cap.
        limit: usize,
    },
    /// The grammar compiler rejected the schema or grammar; carries its message.
    #[error("invalid {kind}: {message}")]
    Invalid {
        /// "JSON schema", "regular expression" or "Lark grammar".
        kind: &'static str,
        /// The compiler's explanation.
        message: String,
    },
    /// A token was not allowed in the current state, or stepping failed inside the matcher.
    #[error("grammar rejected token {token}: {message}")]
    TokenRejected {
        /// The rejected token id.
        token: u32,
        /// The matcher's explanation.
        message: String,
    },
    /// Rolling back more tokens than were consumed, or the matcher refused the rollback.
    #[error("cannot roll back {requested} tokens: {message}")]
    Rollback {
        /// How many tokens were asked for.
        requested: usize,
        /// Why it failed.
        message: String,
    },
    /// The matcher is in an error state (a previous step failed) or failed to compute a mask.
    #[error("grammar matcher failed: {0}")]
    Matcher(String),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
