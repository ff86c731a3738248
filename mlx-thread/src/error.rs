//! The crate's error type.

use crate::PanicReport;

/// Why a job submitted to a [`Worker`](crate::Worker) did not produce its value, or why a worker
/// could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The closure panicked on the worker thread. The report carries the original panic's
    /// message, source location and backtrace; the worker itself keeps serving later jobs.
    #[error("{0}")]
    Panicked(Box<PanicReport>),

    /// The worker has shut down (or was shutting down when the job arrived), so the job never
    /// ran.
    #[error("the MLX worker has shut down; the job did not run")]
    ShutDown,

    /// The thread name handed to [`WorkerBuilder::name`](crate::WorkerBuilder::name) contains a
    /// NUL byte, which operating systems cannot store.
    #[error("worker thread name {name:?} contains a NUL byte")]
    InvalidName {
        /// The rejected name.
        name: String,
    },

    /// The operating system refused to create the worker thread (for example because the
    /// requested stack size is more than it can reserve).
    #[error("cannot spawn the MLX worker thread {name:?} with a {stack_size}-byte stack: {source}")]
    Spawn {
        /// The thread name that was requested.
        name: String,
        /// The stack size that was requested, in bytes.
        stack_size: usize,
        /// The operating system's refusal.
        #[source]
        source: std::io::Error,
    },

    /// The worker thread died outside any job, so it could not be joined cleanly. Jobs are
    /// isolated by `catch_unwind`, so this means a panic escaped the worker's own bookkeeping
    /// (for example a panicking `Drop` of a job's discarded result).
    #[error("the MLX worker thread terminated abnormally: {message}")]
    ThreadDied {
        /// The panic message the thread ended with, if it was a string.
        message: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
