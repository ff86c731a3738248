//! Every misuse and every failing snapshot operation is an error naming the problem, and the
//! trie stays consistent afterwards; odd but legal sequences (caches rolled back below an
//! attached capture) are handled.

mod support;

use std::convert::Infallible;
use std::ops::Range;

use prefix_trie::{
    Capture, Config, Coverage, Error, LayerKind, Lookahead, PrefixTrie, Prompt, SchedulePolicy,
    Snapshot,
};
use support::{Engine, Fake, FakeError, Outcome, Sizes, run};

fn kv_engine() -> Engine {
    Engine::new(
        vec![LayerKind::Range, LayerKind::Point],
        Lookahead::None,
        SchedulePolicy {
            interval: 0,
            before_end: 2,
        },
        Sizes {
            range_per_key: 1,
            point: 8,
        },
    )
}

fn range(start: usize, end: usize) -> Fake {
    let keys = Prompt::new(&run(0, end as u32), &[], Lookahead::None)
        .unwrap()
        .keys()[start..]
        .to_vec();
    Fake::Range {
        start,
        keys,
        per_key: 1,
    }
}

fn no_page_out(_layer: usize, coverage: Coverage) -> Result<Fake, FakeError> {
    Err(FakeError(format!("unexpected page-out of {coverage:?}")))
}

#[test]
fn a_trie_needs_layers() {
    let config = Config {
        layers: vec![],
        lookahead: Lookahead::None,
        schedule: SchedulePolicy::default(),
    };
    assert!(matches!(
        PrefixTrie::<Fake>::new(config),
        Err(Error::InvalidConfig(_))
    ));
}

#[test]
fn unknown_and_ended_sessions_are_errors_and_others_may_be_live() {
    let mut engine = kv_engine();
    let prompt = engine.prompt(&run(0, 10), &[]);
    let first = engine.trie.begin(&prompt, &[]).unwrap();
    // A second session with the same prompt may begin while the first is live.
    let second = engine.trie.begin(&prompt, &[]).unwrap();
    assert_ne!(first.session, second.session);
    assert_eq!(engine.trie.live_sessions(), 2);
    engine.trie.abandon(first.session);
    assert_eq!(engine.trie.live_sessions(), 1);
    let ended = first.session;
    assert!(matches!(
        engine.trie.attach(ended, vec![]),
        Err(Error::UnknownSession(id)) if id == ended
    ));
    assert!(matches!(
        engine.trie.restore_plan(ended),
        Err(Error::UnknownSession(_))
    ));
    assert!(matches!(
        engine.trie.frontier_offset(ended),
        Err(Error::UnknownSession(_))
    ));
    assert!(matches!(
        engine
            .trie
            .close(ended, prompt.keys(), 0, vec![], no_page_out),
        Err(Error::UnknownSession(_))
    ));
    // Abandoning an ended session again is harmless; the other one is untouched.
    engine.trie.abandon(ended);
    assert_eq!(engine.trie.live_sessions(), 1);
    assert_eq!(engine.trie.restore_plan(second.session).unwrap().len(), 2);
    engine.check();
    // Ids are never reused.
    let third = engine.trie.begin(&prompt, &[]).unwrap();
    assert!(third.session != first.session && third.session != second.session);
}

#[test]
fn prompts_keyed_with_another_look_ahead_are_refused() {
    let mut engine = kv_engine();
    let paired = Prompt::new(&run(0, 10), &[], Lookahead::NextToken).unwrap();
    assert!(matches!(
        engine.trie.begin(&paired, &[]),
        Err(Error::LookaheadMismatch { trie: 0, prompt: 1 })
    ));
    assert!(matches!(
        engine.trie.find(&paired),
        Err(Error::LookaheadMismatch { .. })
    ));
}

#[test]
fn malformed_captures_are_refused_before_anything_is_stored() {
    let mut engine = kv_engine();
    let prompt = engine.prompt(&run(0, 10), &[]);
    let session = engine.trie.begin(&prompt, &[]).unwrap().session;
    let good = Capture {
        layer: 0,
        snapshot: range(0, 4),
    };
    let wrong_layer = Capture {
        layer: 7,
        snapshot: range(0, 4),
    };
    let result = engine.trie.attach(session, vec![good, wrong_layer]);
    assert!(matches!(
        result,
        Err(Error::LayerOutOfRange {
            layer: 7,
            layers: 2
        })
    ));
    assert_eq!(engine.trie.node_count(), 1);

    let point_on_range = Capture {
        layer: 0,
        snapshot: Fake::Point {
            history: vec![],
            bytes: 1,
        },
    };
    let result = engine.trie.attach(session, vec![point_on_range]);
    assert!(matches!(
        result,
        Err(Error::ShapeMismatch {
            layer: 0,
            kind: LayerKind::Range,
            ..
        })
    ));
    let empty = Capture {
        layer: 0,
        snapshot: range(3, 3),
    };
    assert!(matches!(
        engine.trie.attach(session, vec![empty]),
        Err(Error::EmptyCoverage { layer: 0, .. })
    ));
    engine.check();
}

#[test]
fn captures_past_the_prompt_are_dropped_and_counted() {
    let mut engine = kv_engine();
    let prompt = engine.prompt(&run(0, 10), &[]);
    let session = engine.trie.begin(&prompt, &[]).unwrap().session;
    let report = engine
        .trie
        .attach(
            session,
            vec![Capture {
                layer: 0,
                snapshot: range(0, 12),
            }],
        )
        .unwrap();
    assert_eq!(report.past_live, 1);
    assert_eq!(report.stored, 0);
}

#[test]
fn close_refuses_keys_that_do_not_extend_the_prompt_and_ends_the_request() {
    let mut engine = kv_engine();
    let prompt = engine.prompt(&run(0, 10), &[]);
    let session = engine.trie.begin(&prompt, &[]).unwrap().session;
    let other = engine.prompt(&run(1, 12), &[]);
    let result = engine
        .trie
        .close(session, other.keys(), 5, vec![], no_page_out);
    assert!(matches!(result, Err(Error::KeysDiverged { offset: 0 })));
    assert_eq!(engine.trie.live_sessions(), 0);
    engine.check();
}

#[test]
fn close_refuses_caches_ahead_of_the_keys_or_behind_the_restore_point() {
    let mut engine = kv_engine();
    let served = engine.serve(&run(0, 10), &[], &[], Outcome::CancelAt(6));
    assert_eq!(served.rest_at, 6);
    let prompt = engine.prompt(&run(0, 10), &[]);
    let begin = engine.trie.begin(&prompt, &[]).unwrap();
    assert_eq!(begin.restore_at, 6);
    let result = engine
        .trie
        .close(begin.session, prompt.keys(), 11, vec![], no_page_out);
    assert!(matches!(
        result,
        Err(Error::CacheAheadOfKeys {
            rest_at: 11,
            keys: 10
        })
    ));
    let session = engine.trie.begin(&prompt, &[]).unwrap().session;
    let result = engine
        .trie
        .close(session, prompt.keys(), 3, vec![], no_page_out);
    assert!(matches!(
        result,
        Err(Error::RestBeforeRestorePoint {
            rest_at: 3,
            restore_at: 6
        })
    ));
    engine.check();
}

#[test]
fn page_out_failures_are_reported_and_leave_a_consistent_trie() {
    let mut engine = kv_engine();
    let prompt = engine.prompt(&run(0, 10), &[]);
    let session = engine.trie.begin(&prompt, &[]).unwrap().session;
    let result = engine
        .trie
        .close(session, prompt.keys(), 9, vec![], no_page_out);
    assert!(matches!(result, Err(Error::PageOut { layer: 0, .. })));
    engine.check();

    let session = engine.trie.begin(&prompt, &[]).unwrap().session;
    let wrong = |_layer: usize, _coverage: Coverage| Ok::<_, Infallible>(range(0, 3));
    let result = engine.trie.close(session, prompt.keys(), 9, vec![], wrong);
    assert!(matches!(
        result,
        Err(Error::PageOutCoverage { layer: 0, .. })
    ));
    engine.check();
    // The recorded keys stayed without snapshots; a full request still works afterwards.
    assert_eq!(engine.resume_point(&run(0, 10), &[]), 0);
    engine.serve(&run(0, 10), &[], &[], Outcome::Finish(vec![5]));
}

/// A range snapshot whose split and merge always fail, as a real one might when memory runs
/// out.
#[derive(Debug)]
struct Brittle(Range<usize>);

impl Snapshot for Brittle {
    type Error = FakeError;
    fn coverage(&self) -> Coverage {
        Coverage::Range(self.0.clone())
    }
    fn bytes(&self) -> usize {
        self.0.len()
    }
    fn split(self, at: usize) -> Result<(Self, Self), FakeError> {
        Err(FakeError(format!("no memory to split at {at}")))
    }
    fn merge(self, _later: Self) -> Result<Self, FakeError> {
        Err(FakeError("no memory to merge".into()))
    }
}

fn brittle_trie_with_one_edge() -> (PrefixTrie<Brittle>, Prompt) {
    let config = Config {
        layers: vec![LayerKind::Range],
        lookahead: Lookahead::None,
        schedule: SchedulePolicy {
            interval: 0,
            before_end: 0,
        },
    };
    let mut trie = PrefixTrie::new(config).unwrap();
    let prompt = Prompt::new(&run(0, 10), &[], Lookahead::None).unwrap();
    let session = trie.begin(&prompt, &[]).unwrap().session;
    trie.close(
        session,
        prompt.keys(),
        9,
        vec![],
        |_, coverage| match coverage {
            Coverage::Range(range) => Ok::<_, Infallible>(Brittle(range)),
            Coverage::Point(_) => unreachable!(),
        },
    )
    .unwrap();
    (trie, prompt)
}

#[test]
fn a_failed_split_drops_the_layer_and_reports_it() {
    let (mut trie, _) = brittle_trie_with_one_edge();
    let diverging = Prompt::new(&[0, 1, 2, 3, 4, 99, 98], &[], Lookahead::None).unwrap();
    assert_eq!(trie.find(&diverging).unwrap().restore_at, 5);
    let result = trie.begin(&diverging, &[]);
    assert!(matches!(
        result,
        Err(Error::Snapshot {
            op: "split",
            layer: 0,
            ..
        })
    ));
    assert_eq!(trie.live_sessions(), 0);
    trie.check_invariants().unwrap();
    assert_eq!(trie.bytes(), 0);
    assert_eq!(trie.find(&diverging).unwrap().restore_at, 0);
}

#[test]
fn a_failed_merge_during_compaction_drops_the_layer_and_reports_it() {
    let (mut trie, _) = brittle_trie_with_one_edge();
    // Extending the conversation compacts the first edge (not a checkpoint) into the new one.
    let longer = Prompt::new(&run(0, 14), &[], Lookahead::None).unwrap();
    let begin = trie.begin(&longer, &[]).unwrap();
    assert_eq!(begin.restore_at, 9);
    trie.close(
        begin.session,
        longer.keys(),
        13,
        vec![],
        |_, coverage| match coverage {
            Coverage::Range(range) => Ok::<_, FakeError>(Brittle(range)),
            Coverage::Point(_) => unreachable!(),
        },
    )
    .unwrap_err();
    trie.check_invariants().unwrap();
    assert!(trie.dump().contains("layers ."), "{}", trie.dump());
}

#[test]
fn caches_rolled_back_below_an_attached_capture_end_the_live_path_where_they_rest() {
    let mut engine = kv_engine();
    let prompt = engine.prompt(&run(0, 20), &[]);
    let keys = prompt.keys().to_vec();
    let session = engine.trie.begin(&prompt, &[]).unwrap().session;
    let mut captures = engine.capture(&keys, 0, 8);
    captures.extend(engine.capture(&keys, 8, 12));
    engine.trie.attach(session, captures).unwrap();
    assert_eq!(engine.trie.frontier_offset(session).unwrap(), 12);

    let page_out = |_layer: usize, coverage: Coverage| -> Result<Fake, FakeError> {
        Ok(match coverage {
            Coverage::Range(range) => Fake::Range {
                start: range.start,
                keys: keys[range].to_vec(),
                per_key: 1,
            },
            Coverage::Point(at) => Fake::Point {
                history: keys[..at].to_vec(),
                bytes: 8,
            },
        })
    };
    // Just before close the path ends at 12; close rolls it back to where the caches rest.
    let report = engine
        .trie
        .close(session, &keys, 10, vec![], page_out)
        .unwrap();
    assert!(report.paged_out > 0);
    engine.check();
    // What was captured past the rollback stays usable.
    assert_eq!(engine.resume_point(&run(0, 20), &[]), 12);
    assert_eq!(
        engine.resume_point(&[run(0, 10), vec![99, 98]].concat(), &[]),
        10
    );
}
