//! Many threads and tasks submitting at once all get their own results, in their own order.

use std::sync::{Arc, Mutex};
use std::thread;

use mlx_thread::{Completion, Error, Worker, WorkerHandle};

const SUBMITTERS: usize = 32;
const JOBS_EACH: usize = 200;

#[test]
fn handles_are_clone_send_sync_and_completions_are_send() {
    fn assert_shareable<T: Clone + Send + Sync + 'static>() {}
    fn assert_send<T: Send + 'static>() {}
    assert_shareable::<WorkerHandle>();
    assert_send::<Completion<Vec<u8>>>();
    assert_send::<Worker>();
    assert_shareable::<Arc<Error>>();
}

#[test]
fn thirty_two_blocking_submitters_each_get_their_own_answers() {
    let worker = Worker::spawn().unwrap();
    let worker_thread = worker.run(|| thread::current().id());
    let submitters: Vec<_> = (0..SUBMITTERS)
        .map(|submitter| {
            let handle = worker.handle();
            thread::spawn(move || {
                (0..JOBS_EACH)
                    .map(|i| {
                        let (who, what, on) = handle
                            .run(move || (submitter, i * i, thread::current().id()))
                            .unwrap();
                        assert_eq!((who, what), (submitter, i * i));
                        on
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for submitter in submitters {
        let threads = submitter.join().unwrap();
        assert_eq!(threads.len(), JOBS_EACH);
        assert!(threads.iter().all(|id| *id == worker_thread));
    }
}

#[test]
fn concurrent_submitters_each_see_their_own_jobs_in_order() {
    let worker = Worker::spawn().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let submitters: Vec<_> = (0..SUBMITTERS)
        .map(|submitter| {
            let handle = worker.handle();
            let log = Arc::clone(&log);
            thread::spawn(move || {
                // Queue everything first, then wait: the jobs of all submitters interleave in
                // the worker's queue.
                let pending: Vec<_> = (0..JOBS_EACH)
                    .map(|i| {
                        let log = Arc::clone(&log);
                        handle.submit(move || log.lock().unwrap().push((submitter, i)))
                    })
                    .collect();
                for completion in pending {
                    completion.wait().unwrap();
                }
            })
        })
        .collect();
    for submitter in submitters {
        submitter.join().unwrap();
    }
    let log = log.lock().unwrap();
    assert_eq!(log.len(), SUBMITTERS * JOBS_EACH);
    for submitter in 0..SUBMITTERS {
        let mine: Vec<usize> = log
            .iter()
            .filter(|(who, _)| *who == submitter)
            .map(|(_, i)| *i)
            .collect();
        assert_eq!(
            mine,
            (0..JOBS_EACH).collect::<Vec<_>>(),
            "submitter {submitter}"
        );
    }
}

#[test]
fn concurrent_panics_are_reported_to_the_submitter_that_caused_them() {
    let worker = Worker::spawn().unwrap();
    let submitters: Vec<_> = (0..SUBMITTERS)
        .map(|submitter| {
            let handle = worker.handle();
            thread::spawn(move || {
                for i in 0..20 {
                    let outcome = handle.try_run(move || {
                        if i % 2 == 0 {
                            panic!("submitter {submitter} job {i}");
                        }
                        submitter * 1000 + i
                    });
                    match outcome {
                        Ok(value) => assert_eq!(value, submitter * 1000 + i),
                        Err(Error::Panicked(report)) => {
                            assert_eq!(report.message(), format!("submitter {submitter} job {i}"));
                            assert_eq!(report.location().unwrap().file, file!());
                        }
                        Err(other) => panic!("unexpected {other}"),
                    }
                }
            })
        })
        .collect();
    for submitter in submitters {
        submitter.join().unwrap();
    }
}

#[test]
fn many_tokio_tasks_await_completions_from_a_multi_thread_runtime() {
    let worker = Worker::spawn().unwrap();
    let worker_thread = worker.run(|| thread::current().id());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap();
    let totals = runtime.block_on(async {
        let tasks: Vec<_> = (0..64_u64)
            .map(|task| {
                let handle = worker.handle();
                tokio::spawn(async move {
                    let mut total = 0;
                    for i in 0..50_u64 {
                        let (value, on) = handle
                            .submit(move || (task * 100 + i, thread::current().id()))
                            .await
                            .unwrap();
                        assert_eq!(on, worker_thread);
                        total += value;
                    }
                    total
                })
            })
            .collect();
        let mut totals = Vec::new();
        for task in tasks {
            totals.push(task.await.unwrap());
        }
        totals
    });
    let expected: Vec<u64> = (0..64_u64)
        .map(|task| (0..50).map(|i| task * 100 + i).sum())
        .collect();
    assert_eq!(totals, expected);
}

#[test]
fn completions_made_on_one_thread_are_awaited_on_others() {
    let worker = Worker::spawn().unwrap();
    let mut pending: Vec<(usize, Completion<usize>)> =
        (0..64).map(|i| (i, worker.submit(move || i * 3))).collect();
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let mine: Vec<_> = pending.drain(..8).collect();
            thread::spawn(move || {
                for (i, completion) in mine {
                    assert_eq!(completion.wait().unwrap(), i * 3);
                }
            })
        })
        .collect();
    for waiter in waiters {
        waiter.join().unwrap();
    }
}
