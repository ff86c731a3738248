//! The [`Worker`]: spawning the thread, its job loop, and shutting it down.

use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};

use crate::completion::Completion;
use crate::handle::{Job, WorkerHandle};
use crate::panic_capture::{self, BacktraceMode};
use crate::{Error, Result};

/// The thread name a worker gets unless [`WorkerBuilder::name`] says otherwise.
pub const DEFAULT_THREAD_NAME: &str = "mlx-worker";

/// The stack a worker thread gets unless [`WorkerBuilder::stack_size`] says otherwise: 64 MiB.
///
/// Building an MLX graph and evaluating it recurses through the graph's depth, and a large model
/// (many layers, long unrolled decode steps, compiled functions) makes deep graphs; the 2 MiB
/// default of spawned Rust threads is not enough for that. The memory is reserved address space,
/// committed only as it is touched.
pub const DEFAULT_STACK_SIZE: usize = 64 * 1024 * 1024;

/// One OS thread that runs submitted closures one at a time, in submission order.
///
/// See the [crate documentation](crate) for why all MLX work goes through one of these.
///
/// Dropping the worker (or calling [`shutdown`](Self::shutdown)) stops new submissions, lets the
/// jobs already queued finish, and joins the thread.
pub struct Worker {
    handle: WorkerHandle,
    thread: Option<JoinHandle<()>>,
}

/// Configures and spawns a [`Worker`].
#[derive(Debug, Clone)]
pub struct WorkerBuilder {
    name: String,
    stack_size: usize,
    backtraces: BacktraceMode,
}

impl Default for WorkerBuilder {
    fn default() -> Self {
        Self {
            name: DEFAULT_THREAD_NAME.to_owned(),
            stack_size: DEFAULT_STACK_SIZE,
            backtraces: BacktraceMode::FromEnvironment,
        }
    }
}

impl WorkerBuilder {
    /// A builder with the defaults: [`DEFAULT_THREAD_NAME`], [`DEFAULT_STACK_SIZE`], backtraces
    /// as the environment asks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Names the thread (shown in panic messages, debuggers and profilers). It must not contain
    /// a NUL byte; [`spawn`](Self::spawn) rejects such a name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the thread's stack size in bytes. The OS may round it up to its minimum or page
    /// size; a size it cannot reserve makes [`spawn`](Self::spawn) fail.
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = bytes;
        self
    }

    /// When `true`, a panicking job always gets a captured backtrace in its [`PanicReport`]
    /// (`Backtrace::force_capture`). When `false` (the default) the backtrace is captured only
    /// if `RUST_BACKTRACE` or `RUST_LIB_BACKTRACE` ask for it (`Backtrace::capture`).
    ///
    /// [`PanicReport`]: crate::PanicReport
    pub fn force_backtraces(mut self, always: bool) -> Self {
        self.backtraces = if always {
            BacktraceMode::Always
        } else {
            BacktraceMode::FromEnvironment
        };
        self
    }

    /// Spawns the worker thread.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] if the name contains a NUL byte; [`Error::Spawn`] if the OS
    /// refuses to create the thread.
    pub fn spawn(self) -> Result<Worker> {
        if self.name.contains('\0') {
            return Err(Error::InvalidName { name: self.name });
        }
        let (jobs, queue) = mpsc::channel();
        let backtraces = self.backtraces;
        let thread = thread::Builder::new()
            .name(self.name.clone())
            .stack_size(self.stack_size)
            .spawn(move || serve(queue, backtraces))
            .map_err(|source| Error::Spawn {
                name: self.name.clone(),
                stack_size: self.stack_size,
                source,
            })?;
        let handle = WorkerHandle::new(jobs, thread.thread().id(), self.name);
        Ok(Worker {
            handle,
            thread: Some(thread),
        })
    }
}

/// The worker thread's whole life: run jobs until the queue is closed and drained.
fn serve(queue: mpsc::Receiver<Job>, backtraces: BacktraceMode) {
    panic_capture::enter_worker_thread(backtraces);
    for job in queue {
        // Each job already catches its closure's panic; this outer guard catches what could
        // still escape around it (a panicking `Drop` of a result nobody waits for), so one bad
        // job can never take the thread, and every job queued behind it, down.
        let _ = panic::catch_unwind(AssertUnwindSafe(job));
    }
}

impl Worker {
    /// Spawns a worker with the defaults of [`WorkerBuilder::new`].
    ///
    /// # Errors
    ///
    /// [`Error::Spawn`] if the OS refuses to create the thread.
    pub fn spawn() -> Result<Self> {
        WorkerBuilder::new().spawn()
    }

    /// A builder for a worker with a custom name, stack size or backtrace policy.
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder::new()
    }

    /// A cloneable handle for submitting work from other threads and tasks.
    pub fn handle(&self) -> WorkerHandle {
        self.handle.clone()
    }

    /// Runs `job` on the worker thread, blocks until it returns, and hands back its value.
    ///
    /// On the worker thread itself (from inside another job) the closure runs inline.
    ///
    /// # Panics
    ///
    /// Re-raises a panic of `job` in the calling thread, with the panic's original location in
    /// the payload; see [`WorkerHandle::run`].
    pub fn run<F, T>(&self, job: F) -> T
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        match self.handle.run(job) {
            Ok(value) => value,
            // The `Worker` holds the queue open while it is borrowed, and the thread never exits
            // while the queue is open, so the only other outcome cannot happen; if it ever does,
            // say so rather than invent a value.
            Err(error) => panic!("MLX worker lost a job while its Worker was alive: {error}"),
        }
    }

    /// Like [`run`](Self::run), but a panic of `job` comes back as [`Error::Panicked`] instead
    /// of being re-raised.
    ///
    /// # Errors
    ///
    /// [`Error::Panicked`] with the panic's message, original location and backtrace.
    pub fn try_run<F, T>(&self, job: F) -> Result<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.handle.try_run(job)
    }

    /// Queues `job` and returns a future of its outcome; see [`WorkerHandle::submit`].
    pub fn submit<F, T>(&self, job: F) -> Completion<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.handle.submit(job)
    }

    /// True when called on this worker's thread.
    pub fn is_worker_thread(&self) -> bool {
        self.handle.is_worker_thread()
    }

    /// Stops accepting jobs, waits for the queued ones to finish, and joins the thread.
    ///
    /// Called from inside one of its own jobs, it closes the queue but cannot join the thread it
    /// runs on: the thread then exits on its own once the current and queued jobs are done.
    ///
    /// # Errors
    ///
    /// [`Error::ThreadDied`] if the thread ended with a panic outside any job.
    pub fn shutdown(mut self) -> Result<()> {
        self.close_and_join()
    }

    fn close_and_join(&mut self) -> Result<()> {
        self.handle.close();
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        if self.handle.is_worker_thread() {
            // Joining ourselves would deadlock; the closed queue ends the thread instead.
            return Ok(());
        }
        thread.join().map_err(|payload| Error::ThreadDied {
            message: panic_capture::payload_message(&*payload),
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Drop cannot report; `shutdown` is the way to observe a thread that died abnormally.
        let _ = self.close_and_join();
    }
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("thread", &self.handle.thread_name())
            .field("running", &self.thread.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_with_nul_is_an_error_not_a_panic() {
        let error = Worker::builder().name("mlx\0worker").spawn().unwrap_err();
        assert!(matches!(error, Error::InvalidName { ref name } if name == "mlx\0worker"));
    }

    #[test]
    fn an_absurd_stack_size_is_an_error_not_a_panic() {
        let error = Worker::builder()
            .stack_size(usize::MAX / 2)
            .spawn()
            .unwrap_err();
        assert!(
            matches!(error, Error::Spawn { stack_size, .. } if stack_size == usize::MAX / 2),
            "{error}"
        );
    }

    #[test]
    fn the_thread_carries_the_configured_name() {
        let worker = Worker::builder().name("mlx-test-name").spawn().unwrap();
        let name = worker.run(|| thread::current().name().map(str::to_owned));
        assert_eq!(name.as_deref(), Some("mlx-test-name"));
        assert_eq!(worker.handle().thread_name(), "mlx-test-name");
    }
}
