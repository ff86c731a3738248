//! Whatever mix of values and panics is queued, each job gets exactly its own outcome.

use mlx_thread::{Error, Worker};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Job {
    Value(u32),
    Panic(u32),
}

fn job() -> impl Strategy<Value = Job> {
    prop_oneof![
        any::<u32>().prop_map(Job::Value),
        any::<u32>().prop_map(Job::Panic)
    ]
}

fn panic_line() -> u32 {
    let source = include_str!("properties.rs");
    let index = source
        .lines()
        .position(|line| line.trim() == "Job::Panic(n) => panic!(\"job panic {n}\"),")
        .expect("the panicking arm is in this file");
    u32::try_from(index + 1).expect("small file")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn outcomes_match_their_jobs_one_for_one(jobs in proptest::collection::vec(job(), 0..40)) {
        let worker = Worker::spawn().unwrap();
        let pending: Vec<_> = jobs
            .iter()
            .cloned()
            .map(|job| {
                worker.submit(move || match job {
                    Job::Value(n) => n,
                    Job::Panic(n) => panic!("job panic {n}"),
                })
            })
            .collect();
        for (job, completion) in jobs.iter().zip(pending) {
            match (job, completion.wait()) {
                (Job::Value(n), Ok(value)) => prop_assert_eq!(value, *n),
                (Job::Panic(n), Err(Error::Panicked(report))) => {
                    prop_assert_eq!(report.message(), format!("job panic {n}"));
                    let location = report.location().unwrap();
                    prop_assert_eq!(location.file.as_str(), file!());
                    prop_assert_eq!(location.line, panic_line());
                }
                (job, outcome) => prop_assert!(false, "{job:?} gave {outcome:?}"),
            }
        }
        worker.shutdown().unwrap();
    }
}
