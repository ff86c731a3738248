//! The error type of every fallible MLX call.

/// What went wrong in an MLX call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// MLX raised an exception; the message is MLX's own.
    #[error("mlx: {0}")]
    Mlx(String),
    /// Host data does not fit the shape it was given.
    #[error("{len} elements do not fill shape {shape:?} ({expected} elements)")]
    ShapeMismatch {
        /// The shape asked for.
        shape: Vec<i32>,
        /// Elements the shape needs.
        expected: usize,
        /// Elements supplied.
        len: usize,
    },
    /// A typed read or constructor met an array of another dtype.
    #[error("expected dtype {expected:?}, found {found:?}")]
    DtypeMismatch {
        /// The dtype the caller's type requires.
        expected: crate::Dtype,
        /// The array's dtype.
        found: crate::Dtype,
    },
    /// A dimension or argument is outside what MLX can represent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl From<mlx_sys::Exception> for Error {
    fn from(e: mlx_sys::Exception) -> Self {
        Error::Mlx(e.what().to_string())
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
