//! One worker thread owns thread-bound state (as MLX's default stream is); other threads and
//! async tasks hand it closures, and a closure's panic comes back as an error naming where it
//! happened, while the worker keeps serving.
//!
//! ```sh
//! cargo run --example one_worker   # from mlx-thread
//! ```

use std::cell::RefCell;

use mlx_thread::{Error, Worker};

thread_local! {
    // Stands in for MLX's per-thread state: each OS thread would have a separate copy, so it
    // is only coherent if every job touches it from the same thread.
    static LOG: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

fn record(entry: String) -> usize {
    LOG.with(|log| {
        let mut log = log.borrow_mut();
        log.push(entry);
        log.len()
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The worker's panic recorder wraps whichever hook is current when it starts, so a custom
    // hook goes in first. This one prints a single line instead of the default message (and
    // backtrace, under RUST_BACKTRACE), keeping the output short.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("(panic hook) {}", info.to_string().replace('\n', " "));
    }));
    let worker = Worker::builder().name("example-worker").spawn()?;

    // Blocking submission from the main thread.
    let count = worker.run(|| record("from main".to_string()));
    println!("main thread: the worker's log holds {count} entry");

    // A cloneable handle serves other OS threads; their jobs queue onto the same thread.
    let senders: Vec<_> = (0..3)
        .map(|i| {
            let handle = worker.handle();
            std::thread::spawn(move || handle.run(move || record(format!("from thread {i}"))))
        })
        .collect();
    for sender in senders {
        sender
            .join()
            .map_err(|_| "a submitting thread panicked")??;
    }

    // Async code awaits a `Completion`; here on a Tokio runtime's own threads.
    let handle = worker.handle();
    let runtime = tokio::runtime::Runtime::new()?;
    let count = runtime.block_on(async move {
        let task = tokio::spawn(async move {
            handle
                .submit(|| record("from a tokio task".to_string()))
                .await
        });
        task.await
    })??;
    println!("after 3 threads and 1 task: {count} entries, all in one thread's log");

    // A panicking job does not take the worker down; the report points into the closure.
    match worker.try_run(|| -> usize { panic!("shape mismatch in the graph") }) {
        Err(Error::Panicked(report)) => {
            let location = report.location().map(ToString::to_string);
            println!(
                "job panicked on {:?}: {:?} at {}",
                report.thread_name(),
                report.message(),
                location.as_deref().unwrap_or("an unknown location")
            );
        }
        other => return Err(format!("expected a panic report, got {other:?}").into()),
    }

    let log = worker.run(|| LOG.with(|log| log.borrow().clone()));
    println!("the worker still serves; its log: {log:?}");

    // Queued jobs finish, then the thread is joined; later submissions fail cleanly.
    let late = worker.handle();
    worker.shutdown()?;
    match late.run(|| ()) {
        Err(Error::ShutDown) => println!("after shutdown: {}", Error::ShutDown),
        other => return Err(format!("expected ShutDown, got {other:?}").into()),
    }
    Ok(())
}
