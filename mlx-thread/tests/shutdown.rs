//! Shutting a worker down finishes queued jobs, joins its thread, and refuses later work.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::task::{Context, Poll, Waker};
use std::thread;

use mlx_thread::{Completion, Error, Worker};

#[test]
fn shutdown_waits_for_every_queued_job() {
    let worker = Worker::spawn().unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let (release, gate) = mpsc::channel::<()>();
    // The first job holds the worker until released, so the other 99 are certainly still
    // queued when shutdown begins.
    let first = worker.submit({
        let done = Arc::clone(&done);
        move || {
            gate.recv().unwrap();
            done.fetch_add(1, Ordering::SeqCst);
        }
    });
    let rest: Vec<_> = (0..99)
        .map(|_| {
            let done = Arc::clone(&done);
            worker.submit(move || done.fetch_add(1, Ordering::SeqCst))
        })
        .collect();
    release.send(()).unwrap();
    worker.shutdown().unwrap();
    assert_eq!(done.load(Ordering::SeqCst), 100);
    first.wait().unwrap();
    for completion in rest {
        completion.wait().unwrap();
    }
}

/// Sets its flag when the worker thread's thread-locals are destroyed, i.e. as it exits.
struct ExitWitness(Arc<AtomicBool>);

impl Drop for ExitWitness {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

thread_local! {
    static WITNESS: std::cell::RefCell<Option<ExitWitness>> = const { std::cell::RefCell::new(None) };
}

fn plant_witness(worker: &Worker) -> Arc<AtomicBool> {
    let exited = Arc::new(AtomicBool::new(false));
    worker.run({
        let exited = Arc::clone(&exited);
        move || WITNESS.with(|slot| *slot.borrow_mut() = Some(ExitWitness(exited)))
    });
    exited
}

#[test]
fn drop_joins_the_thread() {
    let worker = Worker::spawn().unwrap();
    let exited = plant_witness(&worker);
    assert!(!exited.load(Ordering::SeqCst));
    drop(worker);
    // Thread-local destructors run before a thread counts as finished, so a joined thread has
    // run them all.
    assert!(exited.load(Ordering::SeqCst));
}

#[test]
fn shutdown_joins_the_thread() {
    let worker = Worker::spawn().unwrap();
    let exited = plant_witness(&worker);
    worker.shutdown().unwrap();
    assert!(exited.load(Ordering::SeqCst));
}

#[test]
fn handles_fail_fast_after_shutdown() {
    let worker = Worker::spawn().unwrap();
    let handle = worker.handle();
    assert_eq!(handle.run(|| 1).unwrap(), 1);
    worker.shutdown().unwrap();
    assert!(matches!(handle.run(|| 1), Err(Error::ShutDown)));
    assert!(matches!(handle.try_run(|| 1), Err(Error::ShutDown)));
    assert!(matches!(handle.submit(|| 1).wait(), Err(Error::ShutDown)));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    assert!(matches!(
        runtime.block_on(handle.submit(|| 1)),
        Err(Error::ShutDown)
    ));
    assert_eq!(
        Error::ShutDown.to_string(),
        "the MLX worker has shut down; the job did not run"
    );
}

#[test]
fn a_handle_does_not_keep_the_worker_alive() {
    let worker = Worker::spawn().unwrap();
    let exited = plant_witness(&worker);
    let handle = worker.handle();
    drop(worker);
    assert!(exited.load(Ordering::SeqCst));
    assert!(matches!(handle.try_run(|| ()), Err(Error::ShutDown)));
}

#[test]
fn shutdown_lets_the_running_job_finish_and_refuses_new_ones_meanwhile() {
    let worker = Worker::spawn().unwrap();
    let handle = worker.handle();
    let (started_tx, started) = mpsc::channel::<()>();
    let (release, gate) = mpsc::channel::<()>();
    let caller = {
        let handle = handle.clone();
        thread::spawn(move || {
            handle.run(move || {
                started_tx.send(()).unwrap();
                gate.recv().unwrap();
                "finished"
            })
        })
    };
    started.recv().unwrap();
    let shutting_down = thread::spawn(move || worker.shutdown());
    // Wait until the queue is closed: from then on every submission is refused at once.
    // Probes that slip in before it are queued behind the running job; dropping their
    // completions cancels them.
    while !refused_at_once(handle.submit(|| ())) {
        thread::yield_now();
    }
    release.send(()).unwrap();
    assert_eq!(caller.join().unwrap().unwrap(), "finished");
    shutting_down.join().unwrap().unwrap();
}

/// True when `completion` failed at submission with `ShutDown`; never blocks on a queued job.
fn refused_at_once(mut completion: Completion<()>) -> bool {
    let mut context = Context::from_waker(Waker::noop());
    matches!(
        Pin::new(&mut completion).poll(&mut context),
        Poll::Ready(Err(Error::ShutDown))
    )
}

#[test]
fn dropping_a_completion_before_its_job_starts_cancels_the_job() {
    let worker = Worker::spawn().unwrap();
    let (release, gate) = mpsc::channel::<()>();
    let blocker = worker.submit(move || gate.recv().unwrap());
    let ran = Arc::new(AtomicBool::new(false));
    let cancelled = worker.submit({
        let ran = Arc::clone(&ran);
        move || ran.store(true, Ordering::SeqCst)
    });
    drop(cancelled);
    release.send(()).unwrap();
    blocker.wait().unwrap();
    // Jobs run in order, so once this one has run, the cancelled one had its turn.
    worker.run(|| ());
    assert!(!ran.load(Ordering::SeqCst));
}

#[test]
fn a_worker_dropped_inside_its_own_job_closes_without_deadlock() {
    let worker = Worker::spawn().unwrap();
    let handle = worker.handle();
    let inside = handle.run(move || {
        let handle = worker.handle();
        worker.shutdown().unwrap();
        handle.is_worker_thread()
    });
    assert!(inside.unwrap());
    assert!(matches!(handle.try_run(|| ()), Err(Error::ShutDown)));
}
