//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong between text and token ids.
///
/// Variants carry the offending value so a caller can report it without context of its own.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading a file failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file being read.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// A GGUF file could not be read, or is malformed, truncated or lies about its sizes; the
    /// `gguf` crate's error names the file or the byte.
    #[error(transparent)]
    Gguf(#[from] gguf::Error),
    /// A GGUF metadata key the vocabulary needs is missing.
    #[error("GGUF metadata lacks required key `{0}`")]
    MissingKey(String),
    /// A GGUF metadata key has a value of the wrong type or shape.
    #[error("GGUF metadata key `{key}` is invalid: {reason}")]
    BadKey {
        /// The key.
        key: String,
        /// What was wrong with its value.
        reason: String,
    },
    /// The GGUF vocabulary kind (`tokenizer.ggml.model`) is not one we can build.
    #[error("unsupported GGUF tokenizer model `{0}` (supported: gpt2, llama, gemma4)")]
    UnsupportedModel(String),
    /// A JSON file (tokenizer config, generation config) is malformed.
    #[error("invalid JSON in {what}: {reason}")]
    Json {
        /// Which file or field.
        what: String,
        /// The parser's complaint.
        reason: String,
    },
    /// The HF `tokenizers` library rejected something.
    #[error("tokenizers: {0}")]
    Tokenizers(String),
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size}")]
    UnknownTokenId {
        /// The id.
        id: u32,
        /// How many ids the vocabulary has.
        vocab_size: usize,
    },
    /// A chat template failed to compile.
    #[error("chat template does not compile: {0}")]
    TemplateSyntax(String),
    /// A chat template failed while rendering (including its own `raise_exception`).
    #[error("chat template failed to render: {0}")]
    TemplateRender(String),
    /// No chat template shipped and no family fallback fits.
    #[error("no chat template available and none known for this vocabulary")]
    NoChatTemplate,
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn tokenizers(err: impl std::fmt::Display) -> Self {
        Error::Tokenizers(err.to_string())
    }

    pub(crate) fn bad_key(key: &str, reason: impl Into<String>) -> Self {
        Error::BadKey {
            key: key.to_string(),
            reason: reason.into(),
        }
    }
}
