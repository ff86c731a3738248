//! Jobs run on one dedicated thread, in order, and hand their values back.

use std::cell::Cell;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::thread;

use mlx_thread::{Completion, Worker};

#[test]
fn run_returns_the_closures_value() {
    let worker = Worker::spawn().unwrap();
    assert_eq!(worker.run(|| 6 * 7), 42);
    assert_eq!(worker.run(|| "owned".to_owned()), "owned");
    let moved = [1, 2, 3];
    assert_eq!(worker.run(move || moved.iter().sum::<i32>()), 6);
    let fallible: Result<u8, String> = worker.run(|| Err("a value, not a panic".to_owned()));
    assert_eq!(fallible, Err("a value, not a panic".to_owned()));
}

#[test]
fn try_run_and_submit_return_the_value_too() {
    let worker = Worker::spawn().unwrap();
    assert_eq!(worker.try_run(|| 5_u64.pow(3)).unwrap(), 125);
    assert_eq!(worker.submit(|| [7_u8; 4]).wait().unwrap(), [7, 7, 7, 7]);
}

#[test]
fn every_job_runs_on_the_same_named_thread_that_is_not_the_callers() {
    let worker = Worker::spawn().unwrap();
    let caller = thread::current().id();
    let seen: Vec<_> = (0..20)
        .map(|_| {
            worker.run(|| {
                let current = thread::current();
                (current.id(), current.name().map(str::to_owned))
            })
        })
        .collect();
    let (first_id, first_name) = seen[0].clone();
    assert_ne!(first_id, caller);
    assert_eq!(first_name.as_deref(), Some(mlx_thread::DEFAULT_THREAD_NAME));
    assert!(seen.iter().all(|(id, _)| *id == first_id));
    assert!(!worker.is_worker_thread());
    assert!(worker.run({
        let handle = worker.handle();
        move || handle.is_worker_thread()
    }));
}

thread_local! {
    /// Stands in for MLX's per-thread stream state.
    static JOBS_SEEN_HERE: Cell<u32> = const { Cell::new(0) };
}

#[test]
fn thread_local_state_persists_from_job_to_job() {
    let worker = Worker::spawn().unwrap();
    let counts: Vec<u32> = (0..10)
        .map(|_| {
            worker.run(|| {
                JOBS_SEEN_HERE.with(|count| {
                    count.set(count.get() + 1);
                    count.get()
                })
            })
        })
        .collect();
    assert_eq!(counts, (1..=10).collect::<Vec<_>>());
}

#[test]
fn submitted_jobs_run_in_submission_order() {
    let worker = Worker::spawn().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let pending: Vec<Completion<()>> = (0..1000)
        .map(|i| {
            let log = Arc::clone(&log);
            worker.submit(move || log.lock().unwrap().push(i))
        })
        .collect();
    for completion in pending {
        completion.wait().unwrap();
    }
    assert_eq!(*log.lock().unwrap(), (0..1000).collect::<Vec<_>>());
}

#[test]
fn run_from_inside_a_job_runs_inline_instead_of_deadlocking() {
    let worker = Worker::spawn().unwrap();
    let handle = worker.handle();
    let (outer, inner, inner_try) = worker.run(move || {
        let outer = thread::current().id();
        let inner = handle.run(|| thread::current().id()).unwrap();
        let inner_try = handle.try_run(|| thread::current().id()).unwrap();
        (outer, inner, inner_try)
    });
    assert_eq!(outer, inner);
    assert_eq!(outer, inner_try);
}

#[test]
fn a_job_can_queue_follow_up_work_that_runs_after_it() {
    let worker = Worker::spawn().unwrap();
    let handle = worker.handle();
    let log = Arc::new(Mutex::new(Vec::new()));
    let follow_up = worker.run({
        let log = Arc::clone(&log);
        move || {
            let later = {
                let log = Arc::clone(&log);
                handle.submit(move || log.lock().unwrap().push("follow-up"))
            };
            log.lock().unwrap().push("first");
            later
        }
    });
    follow_up.wait().unwrap();
    assert_eq!(*log.lock().unwrap(), ["first", "follow-up"]);
}

#[inline(never)]
fn recurse(depth: u32) -> u64 {
    let frame = black_box([depth as u8; 1024]);
    if depth == 0 {
        return u64::from(frame[0]);
    }
    recurse(depth - 1) + u64::from(frame[1023])
}

#[test]
fn the_default_stack_holds_recursion_far_deeper_than_a_default_thread_allows() {
    // About 20k frames of over 1 KiB each: well past the 2 MiB of a default spawned thread,
    // well within the worker's 64 MiB.
    let worker = Worker::spawn().unwrap();
    let depth = 20_000;
    let expected: u64 = (1..=depth).map(|d| u64::from(d as u8)).sum();
    assert_eq!(worker.run(move || recurse(depth)), expected);
}

#[test]
fn completions_resolve_under_tokio_and_without_a_runtime() {
    let worker = Worker::spawn().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let from_tokio = runtime.block_on(async { worker.submit(|| 1_u8).await });
    assert_eq!(from_tokio.unwrap(), 1);
    assert_eq!(worker.submit(|| 2_u8).wait().unwrap(), 2);
}
