//! Errors of building and running models.

/// What went wrong while building or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An MLX call failed.
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
    /// The model's configuration is missing a field or holds an impossible value.
    #[error("model config: {0}")]
    Config(String),
    /// A tensor the architecture needs is absent or has the wrong shape.
    #[error("weights: {0}")]
    Weights(String),
    /// A cache refused an operation.
    #[error(transparent)]
    Cache(#[from] kvcache::Error),
    /// The checkpoint could not be read.
    #[error(transparent)]
    Checkpoint(#[from] quant::Error),
    /// No architecture is registered under this name.
    #[error("unsupported architecture `{0}`")]
    UnsupportedArchitecture(String),
    /// The input does not fit the model (empty batch, positions past the context, …).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The processes a model is split across cannot run it (one has left the group).
    #[error("{0}")]
    Group(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
