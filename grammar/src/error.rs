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
    /// The schema or grammar admits no complete output: every way through it leads back into
    /// itself (`{"$ref": "#"}`, definitions naming each other, an object requiring a
    /// property of its own type) or nowhere at all.
    #[error("{kind} admits no complete output: {reason}")]
    Unsatisfiable {
        /// "JSON schema", "regular expression", "Lark grammar" or "tool-call schema".
        kind: &'static str,
        /// Where and why, such as "`#/$defs/a` can only hold a value that contains itself".
        reason: String,
    },
    /// Compiling took longer than [`crate::Limits::max_compile_time`]; the compile was left
    /// to finish on its own thread.
    #[error(
        "the schema or grammar took longer than {} s to compile; simplify it",
        limit.as_secs_f64()
    )]
    CompileTimeout {
        /// The deadline that passed.
        limit: std::time::Duration,
    },
    /// Too many compiles that overran their deadline are still running; new ones wait until
    /// they finish.
    #[error(
        "the grammar compiler is busy finishing {overdue} compiles that ran past their time \
         limit; try again shortly"
    )]
    Busy {
        /// How many overdue compiles are running.
        overdue: usize,
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

/// The most of a compiler message a client is shown: with the error's own words around it,
/// an HTTP error stays under 500 characters.
const MAX_MESSAGE_CHARS: usize = 300;

/// The part of an llguidance message meant for people: its first paragraph, without the
/// parser-state dump or the `<non-verbose/>` marker it appends, shortened to
/// [`MAX_MESSAGE_CHARS`] (its messages quote pieces of the schema, which can be large).
pub(crate) fn compiler_message(raw: &str) -> String {
    let end = ["\n<state>", "\n<non-verbose/>", "<non-verbose/>"]
        .iter()
        .filter_map(|marker| raw.find(marker))
        .min()
        .unwrap_or(raw.len());
    let text = raw[..end].trim();
    match text.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiler_messages_lose_the_state_dump_and_stay_short() {
        let verbose =
            "NoExtensionBias\n<state>\nTokens: ⟦⟧\nParser: {}\n</state><grammar>\n\n</grammar>";
        assert_eq!(compiler_message(verbose), "NoExtensionBias");
        assert_eq!(
            compiler_message("lexer too complex\n<non-verbose/>"),
            "lexer too complex"
        );
        assert_eq!(compiler_message("  plain  "), "plain");
        let long = "é".repeat(MAX_MESSAGE_CHARS + 5);
        let short = compiler_message(&long);
        assert_eq!(short.chars().count(), MAX_MESSAGE_CHARS + 1);
        assert!(short.ends_with('…'));
    }
}
