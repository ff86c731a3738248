//! Why a request could not become a job, said by whose doing it was, not by HTTP status:
//! the request builder and everything under it (prompt rendering, media, options, output
//! constraints) fail with it, and each API chooses its status and shape at its edge.

/// Why a request could not be turned into a job or started.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The client sent something wrong: a malformed field, an option out of range, media
    /// that does not decode, an empty prompt.
    #[error("{0}")]
    Invalid(String),
    /// The request is well formed, but the model or its context cannot take it: a prompt
    /// longer than the context, images for a model without vision, insert without
    /// fill-in-the-middle tokens, structured output for a vocabulary that cannot follow it.
    #[error("{0}")]
    Refused(String),
    /// The model named is not stored (or its files cannot be served).
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// Too much of this work is already under way; the same request may succeed shortly.
    #[error("{0}")]
    Busy(String),
    /// Something failed inside the server that the client could not have avoided.
    #[error("{0}")]
    Internal(String),
}

impl RequestError {
    /// A [`RequestError::Invalid`].
    pub fn invalid(message: impl Into<String>) -> RequestError {
        RequestError::Invalid(message.into())
    }

    /// A [`RequestError::Refused`].
    pub fn refused(message: impl Into<String>) -> RequestError {
        RequestError::Refused(message.into())
    }

    /// A [`RequestError::Internal`].
    pub fn internal(message: impl Into<String>) -> RequestError {
        RequestError::Internal(message.into())
    }

    /// A blocking task that panicked: the panic's message, which may quote internals (a
    /// `Debug` dump, a source path), goes to the log, not to the client.
    pub fn task_failed(what: &str, e: &tokio::task::JoinError) -> RequestError {
        tracing::error!("{what}: {e}");
        RequestError::internal(format!("{what} failed unexpectedly"))
    }
}
