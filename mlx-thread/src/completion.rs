//! The one-shot channel that carries a job's outcome back to whoever submitted it.
//!
//! Hand-written rather than borrowed from an async runtime so that [`Completion`] can be awaited
//! on any executor (tokio, a hand-rolled `block_on`, none at all via [`Completion::wait`]) and so
//! that this floor-0 crate pulls in no runtime. It is a `Mutex` around the outcome and the
//! waiting task's `Waker`; one value crosses it per job, so contention is irrelevant.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

use crate::{Error, Result};

/// A job's eventual outcome: a future that resolves once the worker has run the job.
///
/// Resolves to the closure's value, [`Error::Panicked`] if it panicked, or [`Error::ShutDown`]
/// if the worker shut down before the job was accepted. It needs no particular async runtime,
/// and [`wait`](Self::wait) blocks the current thread for it instead.
///
/// Dropping a `Completion` before the worker starts the job cancels the job: it is skipped when
/// its turn comes, so a request whose client went away costs no GPU time. Once started, a job
/// always runs to the end and its value is dropped on the worker thread.
#[must_use = "dropping a Completion before its job starts cancels the job"]
pub struct Completion<T> {
    shared: Arc<Shared<T>>,
}

/// The worker's end: delivers the outcome, or, if dropped undelivered, tells the waiter the job
/// will never run.
pub(crate) struct Sender<T> {
    shared: Arc<Shared<T>>,
}

struct Shared<T> {
    state: Mutex<State<T>>,
}

struct State<T> {
    outcome: Option<Result<T>>,
    /// The sender delivered or was dropped: no outcome will arrive after `outcome` is taken.
    sender_done: bool,
    /// The outcome was handed to the waiter already.
    delivered: bool,
    receiver_dropped: bool,
    waker: Option<Waker>,
}

/// A connected sender/completion pair.
pub(crate) fn channel<T>() -> (Sender<T>, Completion<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            outcome: None,
            sender_done: false,
            delivered: false,
            receiver_dropped: false,
            waker: None,
        }),
    });
    (
        Sender {
            shared: Arc::clone(&shared),
        },
        Completion { shared },
    )
}

impl<T> Shared<T> {
    /// No user code ever runs under this lock, so poisoning cannot leave the state half-written;
    /// recovering the guard is always sound.
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> Sender<T> {
    /// True once the `Completion` has been dropped: nobody will ever read the outcome.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.shared.lock().receiver_dropped
    }

    /// Delivers the outcome and wakes the waiter. If the waiter is gone, the outcome is returned
    /// to the caller so it is dropped outside the lock.
    pub(crate) fn send(self, outcome: Result<T>) {
        let waker = {
            let mut state = self.shared.lock();
            state.sender_done = true;
            if state.receiver_dropped {
                None
            } else {
                state.outcome = Some(outcome);
                state.waker.take()
            }
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        // `self` drops here; `Drop` sees `sender_done` and does nothing more.
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut state = self.shared.lock();
            if state.sender_done {
                return;
            }
            state.sender_done = true;
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Completion<T> {
    /// A completion that has already failed with `error`.
    pub(crate) fn failed(error: Error) -> Self {
        let (sender, completion) = channel();
        sender.send(Err(error));
        completion
    }

    /// Blocks the calling thread until the job's outcome is known.
    ///
    /// Do not call this on the worker thread for a job queued on that same worker: the job
    /// cannot start until the current one returns, so it would wait forever.
    pub fn wait(mut self) -> Result<T> {
        let waker = Waker::from(Arc::new(Unparker(thread::current())));
        let mut context = Context::from_waker(&waker);
        loop {
            match Pin::new(&mut self).poll(&mut context) {
                Poll::Ready(outcome) => return outcome,
                // `park` may return spuriously; polling again is harmless.
                Poll::Pending => thread::park(),
            }
        }
    }
}

impl<T> Future for Completion<T> {
    type Output = Result<T>;

    /// # Panics
    ///
    /// If polled again after it returned `Ready` (the `Future` contract leaves that to the
    /// implementation; this one says so loudly rather than invent a second outcome).
    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.shared.lock();
        if let Some(outcome) = state.outcome.take() {
            state.delivered = true;
            return Poll::Ready(outcome);
        }
        assert!(!state.delivered, "Completion polled after it resolved");
        if state.sender_done {
            // The job was dropped without running: the worker went away with it queued.
            state.delivered = true;
            return Poll::Ready(Err(Error::ShutDown));
        }
        match &mut state.waker {
            Some(waker) if waker.will_wake(context.waker()) => {}
            slot => *slot = Some(context.waker().clone()),
        }
        Poll::Pending
    }
}

impl<T> Drop for Completion<T> {
    fn drop(&mut self) {
        // Take the outcome out so a large value is dropped after the lock is released.
        let _outcome = {
            let mut state = self.shared.lock();
            state.receiver_dropped = true;
            state.waker = None;
            state.outcome.take()
        };
    }
}

impl<T> std::fmt::Debug for Completion<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("Completion")
            .field("ready", &state.outcome.is_some())
            .field("delivered", &state.delivered)
            .finish()
    }
}

/// Wakes a thread blocked in [`Completion::wait`].
struct Unparker(Thread);

impl Wake for Unparker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sent_value_is_received() {
        let (sender, completion) = channel();
        sender.send(Ok(5));
        assert_eq!(completion.wait().unwrap(), 5);
    }

    #[test]
    fn a_value_sent_from_another_thread_wakes_the_waiter() {
        let (sender, completion) = channel();
        let producer = thread::spawn(move || sender.send(Ok("hello".to_owned())));
        assert_eq!(completion.wait().unwrap(), "hello");
        producer.join().unwrap();
    }

    #[test]
    fn a_sender_dropped_unsent_reports_shutdown() {
        let (sender, completion) = channel::<u8>();
        drop(sender);
        assert!(matches!(completion.wait(), Err(Error::ShutDown)));
    }

    #[test]
    fn dropping_the_completion_cancels() {
        let (sender, completion) = channel::<u8>();
        assert!(!sender.is_cancelled());
        drop(completion);
        assert!(sender.is_cancelled());
        // Sending to a cancelled completion is allowed and simply discards the value.
        sender.send(Ok(1));
    }

    #[test]
    fn a_failed_completion_resolves_at_once() {
        let completion = Completion::<()>::failed(Error::ShutDown);
        assert!(matches!(completion.wait(), Err(Error::ShutDown)));
    }

    #[test]
    #[should_panic(expected = "Completion polled after it resolved")]
    fn polling_after_ready_is_refused() {
        let (sender, mut completion) = channel();
        sender.send(Ok(1));
        let mut context = Context::from_waker(Waker::noop());
        assert!(Pin::new(&mut completion).poll(&mut context).is_ready());
        let _ = Pin::new(&mut completion).poll(&mut context);
    }
}
