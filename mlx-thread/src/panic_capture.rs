//! Recording where a worker job panicked, at the moment it panics.
//!
//! `catch_unwind` hands back only the payload; the location and the stack are gone by then. The
//! one place that sees them is the panic hook, which runs on the panicking thread before
//! unwinding starts. So the crate installs, once per process, a hook that wraps whatever hook was
//! there before: on a worker thread it stores a [`PanicReport`] in a thread-local, then it always
//! chains to the previous hook so the usual `thread 'mlx-worker' panicked at …` line still
//! reaches stderr. Other threads see no difference.

use std::any::Any;
use std::backtrace::Backtrace;
use std::cell::{Cell, RefCell};
use std::panic::{self, PanicHookInfo};
use std::sync::Once;
use std::thread;

use crate::{PanicLocation, PanicReport};

/// How a worker thread captures backtraces when one of its jobs panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BacktraceMode {
    /// Follow `RUST_BACKTRACE` / `RUST_LIB_BACKTRACE`, like `Backtrace::capture`.
    FromEnvironment,
    /// Always capture, like `Backtrace::force_capture`.
    Always,
}

thread_local! {
    /// `Some` on worker threads only: the hook records panics here and nowhere else.
    static MODE: Cell<Option<BacktraceMode>> = const { Cell::new(None) };
    /// The report of the most recent panic on this worker thread, until a job collects it.
    static LAST_PANIC: RefCell<Option<PanicReport>> = const { RefCell::new(None) };
}

static INSTALL_HOOK: Once = Once::new();

/// Installs the recording hook (once per process) and marks the calling thread as a worker.
pub(crate) fn enter_worker_thread(mode: BacktraceMode) {
    install_hook();
    MODE.with(|cell| cell.set(Some(mode)));
}

/// Installs the recording hook in front of the current one. Must run on a thread that is not
/// panicking (`take_hook` refuses otherwise), which is why it runs first thing on the new worker
/// thread rather than in `spawn`, whose caller might be unwinding (a `Drop` during a panic).
fn install_hook() {
    INSTALL_HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            record(info);
            previous(info);
        }));
    });
}

/// Forgets any report left over from a panic that an earlier job caught itself, so a later
/// report can never be mistaken for the current job's.
pub(crate) fn clear() {
    // `try_with`: thread-locals may already be gone while the thread is being torn down.
    let _ = LAST_PANIC.try_with(|slot| slot.borrow_mut().take());
}

/// The report for the panic whose payload `catch_unwind` just returned. Falls back to the payload
/// alone (no location, no backtrace) when the hook did not see the panic, which happens only if
/// someone replaced the process's panic hook after this crate installed its own.
pub(crate) fn take_report(payload: &(dyn Any + Send)) -> PanicReport {
    let recorded = LAST_PANIC
        .try_with(|slot| slot.borrow_mut().take())
        .ok()
        .flatten();
    recorded.unwrap_or_else(|| {
        PanicReport::new(
            payload_message(payload),
            None,
            Backtrace::disabled(),
            current_thread_name(),
        )
    })
}

fn record(info: &PanicHookInfo<'_>) {
    let Some(mode) = MODE.try_with(Cell::get).ok().flatten() else {
        return;
    };
    let backtrace = match mode {
        BacktraceMode::FromEnvironment => Backtrace::capture(),
        BacktraceMode::Always => Backtrace::force_capture(),
    };
    let location = info.location().map(|location| PanicLocation {
        file: location.file().to_owned(),
        line: location.line(),
        column: location.column(),
    });
    let message = payload_message(info.payload());
    let report = PanicReport::new(message, location, backtrace, current_thread_name());
    // A panic inside a panic hook aborts the process, so never `borrow_mut` blindly: the slot is
    // only borrowed briefly by `clear`/`take_report`, which cannot be interrupted by a panic on
    // this same thread, but `try_borrow_mut` keeps that an argument rather than a risk.
    let _ = LAST_PANIC.try_with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            *slot = Some(report);
        }
    });
}

/// The text of a panic payload, following the standard library's convention for non-strings.
pub(crate) fn payload_message(payload: &(dyn Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&'static str>() {
        (*message).to_owned()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "Box<dyn Any>".to_owned()
    }
}

fn current_thread_name() -> String {
    thread::current().name().unwrap_or("<unnamed>").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_message_reads_both_string_kinds_and_names_the_rest() {
        let literal: Box<dyn Any + Send> = Box::new("static text");
        let owned: Box<dyn Any + Send> = Box::new(String::from("owned text"));
        let other: Box<dyn Any + Send> = Box::new(42_u32);
        assert_eq!(payload_message(&*literal), "static text");
        assert_eq!(payload_message(&*owned), "owned text");
        assert_eq!(payload_message(&*other), "Box<dyn Any>");
    }

    #[test]
    fn threads_that_are_not_workers_record_nothing() {
        install_hook();
        assert_eq!(MODE.with(Cell::get), None, "test threads are not workers");
        let leftover = thread::spawn(|| {
            let caught = panic::catch_unwind(|| panic!("not on a worker"));
            assert!(caught.is_err());
            LAST_PANIC.with(|slot| slot.borrow().is_some())
        })
        .join()
        .expect("the probe thread itself does not panic");
        assert!(!leftover);
    }

    #[test]
    fn a_worker_thread_records_message_and_location() {
        let report = thread::spawn(|| {
            enter_worker_thread(BacktraceMode::FromEnvironment);
            clear();
            let line = line!() + 1;
            let payload = panic::catch_unwind(|| panic!("recorded {}", 7)).unwrap_err();
            (take_report(&*payload), line)
        })
        .join()
        .expect("the probe thread itself does not panic");
        let (report, line) = report;
        assert_eq!(report.message(), "recorded 7");
        let location = report.location().expect("the hook saw the panic");
        assert!(location.file.ends_with("panic_capture.rs"), "{location}");
        assert_eq!(location.line, line);
    }

    #[test]
    fn without_the_hook_the_payload_still_gives_the_message() {
        let report = thread::spawn(|| {
            // Not entered as a worker: the hook records nothing, so the fallback is used.
            let payload = panic::catch_unwind(|| panic!("fallback")).unwrap_err();
            take_report(&*payload)
        })
        .join()
        .expect("the probe thread itself does not panic");
        assert_eq!(report.message(), "fallback");
        assert_eq!(report.location(), None);
    }
}
