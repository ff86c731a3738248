//! A panic inside a closure comes back to the caller naming where it happened on the worker.

use std::panic::{self, AssertUnwindSafe};
use std::thread;

use mlx_thread::{Error, PanicReport, Worker};

/// The report inside an outcome that must be a panic.
fn expect_panic<T: std::fmt::Debug>(outcome: Result<T, Error>) -> PanicReport {
    match outcome {
        Err(Error::Panicked(report)) => *report,
        other => panic!("expected a panic report, got {other:?}"),
    }
}

/// The `String` payload `Worker::run` re-raises with.
fn reraised_text(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(text) => *text,
        Err(_) => panic!("Worker::run re-raises with a String payload"),
    }
}

#[inline(never)]
fn deep_helper(depth: u32) -> u32 {
    if depth == 0 {
        panic!("helper gave up");
    }
    deep_helper(depth - 1) + 1
}

/// The line on which `deep_helper` panics, found from the source so the test does not break
/// when lines above it move.
fn deep_helper_panic_line() -> u32 {
    let source = include_str!("panics.rs");
    let index = source
        .lines()
        .position(|line| line.trim() == "panic!(\"helper gave up\");")
        .expect("deep_helper's panic line is in this file");
    u32::try_from(index + 1).expect("small file")
}

#[test]
fn try_run_reports_message_file_and_line_inside_the_closure() {
    let worker = Worker::spawn().unwrap();
    let line = line!() + 1;
    let outcome = worker.try_run(|| -> u32 { panic!("shape mismatch: {} vs {}", 3, 4) });
    let report = expect_panic(outcome);
    assert_eq!(report.message(), "shape mismatch: 3 vs 4");
    let location = report.location().expect("the hook saw the panic");
    assert_eq!(location.file, file!());
    assert_eq!(location.line, line);
    assert!(location.column > 0);
    assert_eq!(report.thread_name(), "mlx-worker");
    assert_eq!(
        report.to_string(),
        format!("worker closure panicked at {location}: shape mismatch: 3 vs 4")
    );
}

#[test]
fn run_reraises_in_the_caller_with_the_original_location() {
    let worker = Worker::spawn().unwrap();
    let line = line!() + 1;
    let caught = panic::catch_unwind(AssertUnwindSafe(|| worker.run(|| panic!("lost the KV"))));
    let text = reraised_text(caught.unwrap_err());
    let first_line = text.lines().next().unwrap_or_default();
    assert!(
        first_line.starts_with(&format!("worker closure panicked at {}:{line}:", file!())),
        "{text}"
    );
    assert!(first_line.ends_with(": lost the KV"), "{text}");
    // The worker survived and still answers.
    assert_eq!(worker.run(|| 1 + 1), 2);
}

#[test]
#[should_panic(expected = "tests/panics.rs:")]
fn run_panics_in_the_caller_naming_this_file() {
    let worker = Worker::spawn().unwrap();
    worker.run(|| panic!("surfaces in the test thread"));
}

#[test]
fn the_origin_is_the_innermost_panic_site_not_the_closure() {
    let worker = Worker::spawn().unwrap();
    let report = expect_panic(worker.try_run(|| deep_helper(5)));
    assert_eq!(report.message(), "helper gave up");
    let location = report.location().unwrap();
    assert_eq!(location.file, file!());
    assert_eq!(location.line, deep_helper_panic_line());
}

#[test]
fn unwrap_on_none_points_at_the_unwrap_in_the_closure() {
    let worker = Worker::spawn().unwrap();
    let line = line!() + 1;
    let report = expect_panic(worker.try_run(|| std::hint::black_box(None::<u8>).unwrap()));
    let location = report.location().unwrap();
    assert_eq!((location.file.as_str(), location.line), (file!(), line));
    assert!(report.message().contains("None"), "{}", report.message());
}

#[test]
fn a_forced_backtrace_shows_the_frames_of_the_panic() {
    let worker = Worker::builder().force_backtraces(true).spawn().unwrap();
    let report = expect_panic(worker.try_run(|| deep_helper(3)));
    assert_eq!(
        report.backtrace().status(),
        std::backtrace::BacktraceStatus::Captured
    );
    assert!(
        report.backtrace().to_string().contains("deep_helper"),
        "{}",
        report.backtrace()
    );

    let caught = panic::catch_unwind(AssertUnwindSafe(|| worker.run(|| deep_helper(2))));
    let text = reraised_text(caught.unwrap_err());
    assert!(
        text.contains("\nbacktrace of thread 'mlx-worker':\n"),
        "{text}"
    );
    assert!(text.contains("deep_helper"), "{text}");
}

#[test]
fn a_non_string_payload_still_has_its_location() {
    let worker = Worker::spawn().unwrap();
    let line = line!() + 1;
    let report = expect_panic(worker.try_run(|| panic::panic_any(42_u8)));
    assert_eq!(report.message(), "Box<dyn Any>");
    assert_eq!(report.location().unwrap().line, line);
}

#[test]
fn the_worker_keeps_its_thread_and_serves_after_panics() {
    let worker = Worker::spawn().unwrap();
    let before = worker.run(|| thread::current().id());
    for round in 0..5 {
        let report = expect_panic(worker.try_run(move || -> () { panic!("round {round}") }));
        assert_eq!(report.message(), format!("round {round}"));
    }
    assert_eq!(worker.run(|| thread::current().id()), before);
}

#[test]
fn a_panic_the_closure_catches_itself_is_not_reported() {
    let worker = Worker::spawn().unwrap();
    let value = worker.try_run(|| {
        let inner = panic::catch_unwind(|| panic!("handled inside"));
        assert!(inner.is_err());
        7
    });
    assert_eq!(value.unwrap(), 7);
    // The next real panic reports its own message, not the one handled above.
    let report = expect_panic(worker.try_run(|| -> () { panic!("the real one") }));
    assert_eq!(report.message(), "the real one");
}

#[test]
fn an_awaited_completion_carries_the_panic_too() {
    let worker = Worker::spawn().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let line = line!() + 1;
    let completion = worker.submit(|| -> String { panic!("async boom") });
    let report = expect_panic(runtime.block_on(completion));
    assert_eq!(report.message(), "async boom");
    assert_eq!(report.location().unwrap().line, line);
}

#[test]
fn a_nested_run_on_the_worker_thread_lets_the_panic_reach_the_outer_job() {
    let worker = Worker::spawn().unwrap();
    let handle = worker.handle();
    let line = line!() + 2;
    let report =
        expect_panic(worker.try_run(move || handle.run(|| -> () { panic!("nested") }).map(|()| 0)));
    assert_eq!(report.message(), "nested");
    assert_eq!(report.location().unwrap().line, line);
}
