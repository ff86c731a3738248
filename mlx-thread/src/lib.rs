//! The one OS thread that owns all MLX work.
//!
//! # Why one thread
//!
//! MLX keeps execution state per OS thread. The default stream and default device are
//! thread-local; a stream's command encoders and caches belong to the thread that created them,
//! and arrays built on one thread's stream must be evaluated, in order, on that same stream.
//! MLX's lazy graph is also not safe to build from several threads at once. An async server,
//! though, moves tasks between runtime threads freely, so calling MLX straight from request
//! handlers would split one model's state across threads and race graph construction.
//!
//! So every piece of MLX work in the runner — initialisation, model loading, prefill, decode,
//! memory statistics, cleanup — is a closure sent to one [`Worker`]. The worker owns a single
//! named OS thread for its whole life and runs closures one at a time, in submission order.
//! Everything else (HTTP parsing, templating, tokenizing, detokenizing) stays off it, so CPU
//! work overlaps GPU work. This crate has no MLX dependency itself: it is only the thread.
//!
//! # Overview
//!
//! - [`Worker`] spawns and owns the thread. [`Worker::run`] blocks for a closure's value;
//!   [`Worker::submit`] returns a [`Completion`], a future that any executor (or
//!   [`Completion::wait`]) can resolve. Dropping or [`shutting down`](Worker::shutdown) the
//!   worker lets queued jobs finish and joins the thread.
//! - [`WorkerHandle`] is the cloneable, `Send + Sync` submission side for many threads or tasks;
//!   after shutdown its submissions fail with [`Error::ShutDown`] instead of hanging.
//! - A panic inside a closure does not kill the worker. [`Worker::try_run`] returns it as
//!   [`Error::Panicked`] with a [`PanicReport`]; [`Worker::run`] re-raises it in the caller. Both
//!   name the place *inside the closure* where it panicked, not the re-raise site, because a
//!   panic hook records the location and backtrace on the worker thread as it happens.
//!   A program with its own panic hook should set it before spawning the first worker: the
//!   worker's recording hook wraps whichever hook is current then, while a hook set later
//!   replaces it, and reports fall back to the payload's message without location or backtrace.
//! - [`WorkerBuilder`] sets the thread name (default [`DEFAULT_THREAD_NAME`]), stack size
//!   (default [`DEFAULT_STACK_SIZE`], 64 MiB, as MLX graphs recurse deeply) and backtrace policy.
//!
//! # Example
//!
//! ```
//! use mlx_thread::{Error, Worker};
//!
//! let worker = Worker::spawn()?;
//! assert_eq!(worker.run(|| 6 * 7), 42);
//!
//! // The same thread serves every job.
//! let first = worker.run(|| std::thread::current().id());
//! let handle = worker.handle();
//! let second = std::thread::spawn(move || handle.run(|| std::thread::current().id()))
//!     .join()
//!     .unwrap()?;
//! assert_eq!(first, second);
//!
//! // A panic comes back with the location where it happened.
//! let Err(Error::Panicked(report)) = worker.try_run(|| -> u32 { panic!("bad shape") }) else {
//!     unreachable!("the closure panics");
//! };
//! assert_eq!(report.message(), "bad shape");
//! assert!(report.location().is_some());
//!
//! // Async callers await a `Completion` on any executor.
//! let sum = worker.submit(|| (1..=10).sum::<u32>());
//! assert_eq!(sum.wait()?, 55);
//!
//! worker.shutdown()?;
//! # Ok::<(), mlx_thread::Error>(())
//! ```
//!
//! # Modules
//!
//! - `worker`: [`Worker`] and [`WorkerBuilder`]: spawning the thread, its job loop, shutdown.
//! - `handle`: [`WorkerHandle`]: submitting jobs, running them under `catch_unwind`.
//! - `completion`: [`Completion`], the runtime-independent one-shot future of a job's outcome.
//! - `panic_capture`: the process-wide panic hook that records a worker panic's origin.
//! - `panic_report`: [`PanicReport`] and [`PanicLocation`], what a caller learns of a panic.
//! - `error`: [`Error`] and [`Result`].

#![deny(missing_docs)]

mod completion;
mod error;
mod handle;
mod panic_capture;
mod panic_report;
mod worker;

pub use completion::Completion;
pub use error::{Error, Result};
pub use handle::WorkerHandle;
pub use panic_report::{PanicLocation, PanicReport};
pub use worker::{DEFAULT_STACK_SIZE, DEFAULT_THREAD_NAME, Worker, WorkerBuilder};
