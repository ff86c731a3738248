//! What a trip through the worker costs: the overhead every MLX call in the runner pays on top
//! of the MLX work itself.

use mlx_thread::{Worker, WorkerHandle};

fn main() {
    divan::main();
}

/// One blocking `run` of an empty closure: queue, wake the worker, wake the caller.
#[divan::bench]
fn run_empty(bencher: divan::Bencher) {
    let worker = Worker::spawn().expect("spawn worker");
    bencher.bench_local(|| worker.run(|| divan::black_box(1_u64)));
}

/// `batch` submissions queued back to back, then all awaited: the pipelined case, where the
/// worker never sleeps between jobs.
#[divan::bench(args = [1, 16, 256])]
fn submit_then_wait(bencher: divan::Bencher, batch: usize) {
    let worker = Worker::spawn().expect("spawn worker");
    bencher
        .counter(divan::counter::ItemsCount::new(batch))
        .bench_local(|| {
            let pending: Vec<_> = (0..batch as u64)
                .map(|i| worker.submit(move || divan::black_box(i)))
                .collect();
            pending
                .into_iter()
                .map(|completion| completion.wait().expect("job ran"))
                .sum::<u64>()
        });
}

/// `run` from 4 threads at once through cloned handles: contention on the queue.
#[divan::bench]
fn run_from_four_threads(bencher: divan::Bencher) {
    const THREADS: usize = 4;
    const JOBS_PER_THREAD: u64 = 64;
    let worker = Worker::spawn().expect("spawn worker");
    let handles: Vec<WorkerHandle> = (0..THREADS).map(|_| worker.handle()).collect();
    bencher
        .counter(divan::counter::ItemsCount::new(
            THREADS * JOBS_PER_THREAD as usize,
        ))
        .bench_local(|| {
            std::thread::scope(|scope| {
                for handle in &handles {
                    scope.spawn(move || {
                        for i in 0..JOBS_PER_THREAD {
                            handle
                                .run(move || divan::black_box(i))
                                .expect("worker alive");
                        }
                    });
                }
            });
        });
}
