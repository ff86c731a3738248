//! Where a compile runs: a thread of its own, with a large stack and a deadline.
//!
//! llguidance bounds its own work with fuel and size limits, but not by time, and a compile
//! cannot be interrupted. So the caller waits at most the deadline; a compile that overruns
//! it is left to finish on its thread (its fuel still bounds it) and the caller gets an error
//! at once. Overdue compiles are counted: while [`MAX_OVERDUE_COMPILES`] of them still run,
//! new compiles are refused as busy, so a client sending slow schemas over and over cannot
//! pile up threads that take every core.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{RecvTimeoutError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{Error, Result};

/// The stack a compile runs on. llguidance's schema compiler recurses through nesting and
/// `$ref` chains; the caps in [`crate::Limits`] keep that shallow, and this keeps a schema
/// within them from overflowing whatever small stack the caller's thread has (an overflow
/// aborts the whole process). Only the pages a compile touches are ever committed.
const COMPILE_STACK_BYTES: usize = 256 << 20;

/// Compiles past their deadline that may still be running before new ones are refused.
const MAX_OVERDUE_COMPILES: usize = 2;

/// Compiles past their deadline that are still running, process-wide.
static OVERDUE: AtomicUsize = AtomicUsize::new(0);

/// Where one compile stands, shared by its thread and the caller waiting for it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Progress {
    Running,
    /// The caller stopped waiting; the thread owes [`OVERDUE`] a decrement.
    Abandoned,
    Finished,
}

/// Runs `compile` on a thread of its own with [`COMPILE_STACK_BYTES`] of stack, waiting for
/// it at most `deadline`.
pub(crate) fn run_with_deadline<T: Send + 'static>(
    deadline: Duration,
    compile: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let overdue = OVERDUE.load(Ordering::Relaxed);
    if overdue >= MAX_OVERDUE_COMPILES {
        return Err(Error::Busy { overdue });
    }
    let progress = Arc::new(Mutex::new(Progress::Running));
    let (send, receive) = sync_channel(1);
    let on_thread = Arc::clone(&progress);
    std::thread::Builder::new()
        .name("grammar-compile".into())
        .stack_size(COMPILE_STACK_BYTES)
        .spawn(move || {
            // A panic drops `send` unsent, which the caller sees as a disconnect.
            let result = compile();
            let _ = send.send(result);
            let mut progress = lock(&on_thread);
            if *progress == Progress::Abandoned {
                OVERDUE.fetch_sub(1, Ordering::Relaxed);
            }
            *progress = Progress::Finished;
        })
        .map_err(|e| Error::Matcher(format!("cannot start the compile thread: {e}")))?;
    let outcome = receive.recv_timeout(deadline);
    match outcome {
        Ok(result) => result,
        Err(RecvTimeoutError::Disconnected) => Err(panicked()),
        Err(RecvTimeoutError::Timeout) => {
            let mut progress = lock(&progress);
            if *progress == Progress::Finished {
                // It finished between the timeout and the lock: its result is waiting.
                return receive.try_recv().unwrap_or_else(|_| Err(panicked()));
            }
            *progress = Progress::Abandoned;
            OVERDUE.fetch_add(1, Ordering::Relaxed);
            Err(Error::CompileTimeout { limit: deadline })
        }
    }
}

fn panicked() -> Error {
    Error::Matcher("the grammar compiler failed unexpectedly".to_string())
}

/// The state is a plain enum, valid whatever a panicking holder was doing.
fn lock(progress: &Mutex<Progress>) -> std::sync::MutexGuard<'_, Progress> {
    progress
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn results_panics_and_overruns_each_come_back_as_such() {
        assert_eq!(
            run_with_deadline(Duration::from_secs(60), || Ok(7)).ok(),
            Some(7)
        );
        let failed = run_with_deadline(Duration::from_secs(60), || -> Result<()> {
            panic!("inside the compiler")
        });
        assert!(matches!(failed, Err(Error::Matcher(_))));

        // Compiles that overrun are answered at once, counted while they run on, and block
        // new compiles only while too many of them are still running.
        let mut releases = Vec::new();
        for _ in 0..MAX_OVERDUE_COMPILES {
            let (release, wait) = channel::<()>();
            releases.push(release);
            let overrun = run_with_deadline(Duration::from_millis(1), move || {
                let _ = wait.recv();
                Ok(())
            });
            assert!(matches!(overrun, Err(Error::CompileTimeout { .. })));
        }
        assert!(matches!(
            run_with_deadline(Duration::from_secs(60), || Ok(())),
            Err(Error::Busy { .. })
        ));
        drop(releases);
        // The released threads finish on their own time; wait (boundedly) for the count.
        for _ in 0..6000 {
            if OVERDUE.load(Ordering::Relaxed) < MAX_OVERDUE_COMPILES {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            run_with_deadline(Duration::from_secs(60), || Ok(1)).ok(),
            Some(1)
        );
    }
}
