//! What a caller learns about a panic that happened on the worker thread.

use std::backtrace::{Backtrace, BacktraceStatus};
use std::fmt;

/// A panic raised by a job on the worker thread, described where it happened.
///
/// The location and backtrace are recorded by a panic hook on the worker thread at the moment of
/// the panic, so they point at the `panic!` (or `unwrap`, index, …) inside the closure, not at
/// the place where the caller re-raises or inspects it.
///
/// `Display` prints one line, `worker closure panicked at FILE:LINE:COLUMN: MESSAGE`; the
/// alternate form (`{:#}`) appends the backtrace when one was captured.
#[derive(Debug)]
pub struct PanicReport {
    message: String,
    location: Option<PanicLocation>,
    backtrace: Backtrace,
    thread_name: String,
}

/// A source position, copied out of [`std::panic::Location`] so it can travel across threads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PanicLocation {
    /// Source file as the compiler named it (relative to the crate's workspace root for
    /// workspace crates, e.g. `mlx-thread/tests/panics.rs`).
    pub file: String,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub column: u32,
}

impl PanicReport {
    pub(crate) fn new(
        message: String,
        location: Option<PanicLocation>,
        backtrace: Backtrace,
        thread_name: String,
    ) -> Self {
        Self {
            message,
            location,
            backtrace,
            thread_name,
        }
    }

    /// The panic message, or `Box<dyn Any>` when the payload was not a string (the same
    /// convention as the standard library's panic output).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Where the panic was raised. `None` only when another panic hook replaced this crate's
    /// after the worker started, so the moment of the panic could not be observed.
    pub fn location(&self) -> Option<&PanicLocation> {
        self.location.as_ref()
    }

    /// The stack at the moment of the panic. Captured when `RUST_BACKTRACE` or
    /// `RUST_LIB_BACKTRACE` ask for it, or always when the worker was built with
    /// [`WorkerBuilder::force_backtraces`](crate::WorkerBuilder::force_backtraces); otherwise
    /// its status is [`BacktraceStatus::Disabled`].
    pub fn backtrace(&self) -> &Backtrace {
        &self.backtrace
    }

    /// The name of the worker thread the panic happened on.
    pub fn thread_name(&self) -> &str {
        &self.thread_name
    }
}

impl fmt::Display for PanicReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            Some(location) => write!(f, "worker closure panicked at {location}: ")?,
            None => write!(f, "worker closure panicked (location unknown): ")?,
        }
        f.write_str(&self.message)?;
        if f.alternate() && self.backtrace.status() == BacktraceStatus::Captured {
            write!(
                f,
                "\nbacktrace of thread '{}':\n{}",
                self.thread_name, self.backtrace
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for PanicLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(backtrace: Backtrace) -> PanicReport {
        PanicReport::new(
            "boom".to_owned(),
            Some(PanicLocation {
                file: "src/foo.rs".to_owned(),
                line: 12,
                column: 5,
            }),
            backtrace,
            "mlx-worker".to_owned(),
        )
    }

    #[test]
    fn display_names_the_origin_then_the_message() {
        let report = report(Backtrace::disabled());
        assert_eq!(
            report.to_string(),
            "worker closure panicked at src/foo.rs:12:5: boom"
        );
    }

    #[test]
    fn alternate_display_appends_a_captured_backtrace_only() {
        assert_eq!(
            format!("{:#}", report(Backtrace::disabled())),
            "worker closure panicked at src/foo.rs:12:5: boom"
        );
        let with_trace = format!("{:#}", report(Backtrace::force_capture()));
        assert!(with_trace.starts_with(
            "worker closure panicked at src/foo.rs:12:5: boom\nbacktrace of thread 'mlx-worker':\n"
        ));
    }

    #[test]
    fn unknown_location_is_said_out_loud() {
        let report = PanicReport::new(
            "boom".to_owned(),
            None,
            Backtrace::disabled(),
            "mlx-worker".to_owned(),
        );
        assert_eq!(
            report.to_string(),
            "worker closure panicked (location unknown): boom"
        );
    }
}
