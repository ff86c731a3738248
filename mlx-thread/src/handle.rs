//! Submitting jobs: the cloneable [`WorkerHandle`] and the job wrapper that runs on the thread.

use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::{Arc, PoisonError, RwLock};
use std::thread::{self, ThreadId};

use crate::completion::{self, Completion};
use crate::panic_capture;
use crate::{Error, PanicReport, Result};

/// A type-erased job: runs the user's closure and delivers its outcome to its [`Completion`].
pub(crate) type Job = Box<dyn FnOnce() + Send + 'static>;

/// A cheap, cloneable way to submit work to a [`Worker`](crate::Worker) from anywhere: many
/// threads or async tasks can each hold one.
///
/// A handle does not keep the worker alive: once the `Worker` is shut down or dropped, every
/// submission through a handle fails with [`Error::ShutDown`] at once instead of waiting.
#[derive(Clone)]
pub struct WorkerHandle {
    shared: Arc<Shared>,
}

/// State common to the `Worker` and all of its handles.
pub(crate) struct Shared {
    /// `None` once shutdown began. Submitters take the read lock, so they do not serialize one
    /// another; shutdown takes the write lock, so a job is either queued before the channel
    /// closes (and will run) or refused (and its submitter told so), never lost in between.
    jobs: RwLock<Option<mpsc::Sender<Job>>>,
    thread: ThreadId,
    name: String,
}

impl WorkerHandle {
    pub(crate) fn new(jobs: mpsc::Sender<Job>, thread: ThreadId, name: String) -> Self {
        Self {
            shared: Arc::new(Shared {
                jobs: RwLock::new(Some(jobs)),
                thread,
                name,
            }),
        }
    }

    /// Queues `job` and returns a future of its outcome, without waiting for it.
    ///
    /// Jobs run one at a time, in the order they were queued. The future resolves to the
    /// closure's value, [`Error::Panicked`] if the closure panicked, or [`Error::ShutDown`] if the
    /// worker had already shut down. Dropping the future before the job starts cancels the job.
    ///
    /// Unlike [`run`](Self::run), this always queues, even on the worker thread itself: awaiting
    /// the result there (or calling [`Completion::wait`]) would deadlock, but queueing follow-up
    /// work from a running job is fine.
    pub fn submit<F, T>(&self, job: F) -> Completion<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let (sender, completion) = completion::channel();
        let job: Job = Box::new(move || {
            if sender.is_cancelled() {
                return;
            }
            sender.send(run_caught(job));
        });
        let jobs = self
            .shared
            .jobs
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        match jobs.as_ref() {
            // If the thread is gone the job comes back inside the error and is dropped, and
            // dropping its sender resolves the completion with `ShutDown`.
            Some(queue) => {
                let _ = queue.send(job);
                completion
            }
            None => Completion::failed(Error::ShutDown),
        }
    }

    /// Runs `job` on the worker thread and blocks until it returns, handing back its value or
    /// its panic as [`Error::Panicked`], or [`Error::ShutDown`] if the worker is gone.
    ///
    /// Called on the worker thread itself (from inside another job), the closure runs inline
    /// right away: it is already on the right thread, and queueing it behind the running job
    /// would wait forever.
    pub fn try_run<F, T>(&self, job: F) -> Result<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        if self.is_worker_thread() {
            return run_caught(job);
        }
        self.submit(job).wait()
    }

    /// Runs `job` on the worker thread, blocks until it returns, and hands back its value.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] if the worker has shut down; the job did not run.
    ///
    /// # Panics
    ///
    /// If `job` panics, this re-raises the panic in the calling thread with
    /// [`std::panic::resume_unwind`]. The payload is a `String` that starts with
    /// `worker closure panicked at FILE:LINE:COLUMN: MESSAGE` — the place inside the closure
    /// where the panic happened — followed by the worker's backtrace when one was captured. The
    /// worker thread's own panic line is printed to stderr by the panic hook as usual; the
    /// re-raise prints nothing more. On the worker thread itself the closure runs inline and its
    /// panic simply propagates.
    pub fn run<F, T>(&self, job: F) -> Result<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        if self.is_worker_thread() {
            return Ok(job());
        }
        match self.submit(job).wait() {
            Err(Error::Panicked(report)) => reraise(&report),
            outcome => outcome,
        }
    }

    /// True when called on this worker's thread, i.e. from inside one of its jobs. MLX code can
    /// `debug_assert!` this before touching thread-bound state.
    pub fn is_worker_thread(&self) -> bool {
        thread::current().id() == self.shared.thread
    }

    /// The worker thread's name.
    pub fn thread_name(&self) -> &str {
        &self.shared.name
    }

    /// Refuses all further submissions. Jobs already queued still run; the worker thread exits
    /// once they are done.
    pub(crate) fn close(&self) {
        let mut jobs = self
            .shared
            .jobs
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        *jobs = None;
    }
}

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHandle")
            .field("thread", &self.shared.name)
            .finish_non_exhaustive()
    }
}

/// Runs `job` here and now, turning a panic into [`Error::Panicked`] with its original location.
fn run_caught<F, T>(job: F) -> Result<T>
where
    F: FnOnce() -> T,
{
    panic_capture::clear();
    // `AssertUnwindSafe`: after a panic the closure and everything it captured are dropped or
    // discarded; the caller only ever sees the report. This is the same bargain
    // `std::thread::spawn` makes, which does not require `UnwindSafe` either.
    panic::catch_unwind(AssertUnwindSafe(job))
        .map_err(|payload| Error::Panicked(Box::new(panic_capture::take_report(&*payload))))
}

/// Continues a worker panic in the calling thread, keeping its origin in the payload text.
pub(crate) fn reraise(report: &PanicReport) -> ! {
    // `resume_unwind` rather than `panic!`: it skips the panic hook, so stderr does not gain a
    // second "panicked at" line naming this re-raise site instead of the real origin.
    panic::resume_unwind(Box::new(format!("{report:#}")))
}
