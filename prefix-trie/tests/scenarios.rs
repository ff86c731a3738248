//! One scenario per bug class the upstream runner shipped fixes for. Each drives the trie
//! through the fake engine (which checks every restore against recomputation) and pins the
//! resulting trie with an insta snapshot of its dump.

mod support;

use insta::assert_snapshot;
use prefix_trie::{Key, LayerKind, Lookahead, MediaItem, SchedulePolicy};
use support::{Engine, Outcome, Sizes, cat, run};

fn kv_only() -> Engine {
    Engine::new(
        vec![LayerKind::Range, LayerKind::Range],
        Lookahead::None,
        SchedulePolicy {
            interval: 0,
            before_end: 4,
        },
        Sizes {
            range_per_key: 1,
            point: 0,
        },
    )
}

/// Agents cancel long prefills on a timeout and retry; every retry must resume exactly where
/// the cancelled attempt stopped, or it never gets further than the timeout allows.
#[test]
fn cancelled_long_prefill_retry_resumes_where_it_stopped() {
    let mut engine = Engine::hybrid();
    let prompt = run(100, 140);
    let first = engine.serve(&prompt, &[], &[], Outcome::CancelAt(17));
    assert_eq!((first.restore_at, first.rest_at), (0, 17));
    assert_eq!(engine.resume_point(&prompt, &[]), 17);

    let second = engine.serve(&prompt, &[], &[], Outcome::CancelAt(30));
    assert_eq!((second.restore_at, second.rest_at), (17, 30));

    let third = engine.serve(&prompt, &[], &[], Outcome::Finish(vec![7, 8, 9]));
    assert_eq!(third.restore_at, 30);
    let next_turn = cat(&[&third.tokens, &run(300, 306)]);
    assert_eq!(
        engine
            .serve(&next_turn, &[], &[], Outcome::Finish(vec![1]))
            .restore_at,
        third.rest_at
    );
    assert_snapshot!(engine.trie.dump());
}

/// A request resuming partway into a cached edge splits it there: the head stays on the live
/// path (and is marked used), only the unused tail is left for eviction, and the captures of
/// the new branch start exactly where its node starts.
#[test]
fn request_resuming_partway_into_a_cached_edge_splits_it() {
    let mut engine = kv_only();
    let a = engine.serve(&run(0, 30), &[], &[], Outcome::Finish(vec![500, 501, 502]));
    assert_eq!(a.rest_at, 32);

    let b_prompt = cat(&[&run(0, 20), &run(900, 910)]);
    let b = engine.serve(&b_prompt, &[], &[], Outcome::Finish(vec![600, 601]));
    assert_eq!((b.matched, b.restore_at), (20, 20));
    let after_split = engine.trie.dump();

    // Following the original edge again reuses both halves.
    let c_prompt = cat(&[&a.tokens, &run(700, 705)]);
    let c = engine.serve(&c_prompt, &[], &[], Outcome::Finish(vec![800]));
    assert_eq!(c.restore_at, a.rest_at);

    // The least recently used leaf (B's branch) goes first; the shared head survives.
    let before = engine.trie.bytes();
    let report = engine.trie.evict(before - 1).unwrap();
    assert_eq!(report.removed, 1);
    engine.check();
    assert_eq!(engine.resume_point(&b_prompt, &[]), 26);
    assert_eq!(engine.resume_point(&c_prompt, &[]), c_prompt.len() - 1);
    assert_snapshot!("resume_partway_after_split", after_split);
    assert_snapshot!("resume_partway_after_evict", engine.trie.dump());
}

/// When the response is a prefix of a stored one, close lands inside the stored edge: the
/// split-off head must get every layer paged out, or the next turn cannot resume there.
#[test]
fn response_that_is_a_prefix_of_a_stored_one_gets_its_own_restore_point() {
    let mut engine = Engine::hybrid();
    let prompt = run(0, 12);
    let long = engine.serve(&prompt, &[], &[], Outcome::Finish(run(200, 210)));
    assert_eq!(long.rest_at, 21);

    let short = engine.serve(&prompt, &[], &[], Outcome::Finish(run(200, 204)));
    assert_eq!(short.rest_at, 15);
    assert!(short.rest_at < long.rest_at);

    let next_turn = cat(&[&short.tokens, &[300, 301, 302]]);
    let next = engine.serve(&next_turn, &[], &[], Outcome::Finish(vec![9]));
    assert_eq!(next.restore_at, short.rest_at);
    assert_snapshot!(engine.trie.dump());
}

/// Evicting a turn's checkpoint on the live path merges it into the next node; a request
/// that needed it rewinds to the newest checkpoint that survived before it.
#[test]
fn evicted_turn_rewinds_to_the_newest_surviving_checkpoint() {
    let mut engine = Engine::new(
        vec![LayerKind::Point, LayerKind::Range],
        Lookahead::None,
        SchedulePolicy {
            interval: 0,
            before_end: 2,
        },
        Sizes {
            range_per_key: 0,
            point: 64,
        },
    );
    let mut history = Vec::new();
    let mut turn_prompts = Vec::new();
    for turn in 0..4u32 {
        let prompt = cat(&[&history, &run(1000 * (turn + 1), 1000 * (turn + 1) + 6)]);
        let served = engine.serve(&prompt, &[], &[], Outcome::Finish(vec![turn, turn + 50]));
        turn_prompts.push(prompt);
        history = served.tokens;
    }
    // Regenerating the first reply uses turn one's checkpoint (just before its last key: the
    // trie captures there for point-shaped layers), so turn two's is now the least recently
    // used.
    let regenerated = engine.serve(&turn_prompts[0], &[], &[], Outcome::Finish(vec![7, 8]));
    assert_eq!(regenerated.restore_at, 5);
    // Edit the third turn's user message: the request diverges inside turn three.
    let mut edited = turn_prompts[2].clone();
    edited[17] = 4242;
    let before = engine.resume_point(&edited, &[]);
    assert_eq!(before, 13);
    let checkpoints_before = engine.trie.dump();

    // Evict one checkpoint at a time (least recently used first) until one this request
    // needed goes: each eviction merges a node into the next.
    let mut after = before;
    while after == before {
        let budget = engine.trie.bytes() - 1;
        let report = engine.trie.evict(budget).unwrap();
        assert_eq!((report.removed, report.merged, report.freed), (0, 1, 64));
        engine.check();
        after = engine.resume_point(&edited, &[]);
    }
    let edited_keys = engine.prompt(&edited, &[]).keys().to_vec();
    let newest_surviving = engine
        .trie
        .nodes()
        .filter(|node| node.snapshots[0].is_some() && node.end() <= before)
        .filter(|node| edited_keys.starts_with(&engine.trie.path_keys(node.id).unwrap()))
        .map(|node| node.end())
        .max()
        .unwrap_or(0);
    assert!(after < before);
    assert_eq!(after, newest_surviving);
    // The conversation itself still resumes at its end.
    let continued = cat(&[&history, &[77]]);
    assert_eq!(engine.resume_point(&continued, &[]), history.len() - 1);
    assert_snapshot!("evicted_turn_before", checkpoints_before);
    assert_snapshot!("evicted_turn_after", engine.trie.dump());
}

/// A long chat under a small budget stays within it: old turns' whole-state checkpoints are
/// reclaimed even though they lie on the live path, while every turn still resumes exactly
/// where the previous one ended.
#[test]
fn long_chat_under_a_small_budget_stays_within_it() {
    let mut engine = Engine::hybrid();
    let budget = 1600;
    let mut history: Vec<u32> = run(1, 9);
    let mut rest_at = 0;
    let mut reclaimed = 0;
    for turn in 0..60u32 {
        let prompt = cat(&[&history, &[2000 + turn, 2001, 2002, 2003, 2004, 2005]]);
        let served = engine.serve(
            &prompt,
            &[],
            &[],
            Outcome::Finish(vec![turn, turn + 1, turn + 2, 3, 4]),
        );
        if turn > 0 {
            assert_eq!(
                served.restore_at, rest_at,
                "turn {turn} did not resume at the last end"
            );
        }
        rest_at = served.rest_at;
        history = served.tokens;
        let report = engine.trie.evict(budget).unwrap();
        reclaimed += report.freed;
        engine.check();
        assert!(
            engine.trie.bytes() <= budget,
            "turn {turn}: {} bytes",
            engine.trie.bytes()
        );
        assert!(
            engine.trie.node_count() <= 40,
            "turn {turn}: {} nodes",
            engine.trie.node_count()
        );
    }
    assert!(reclaimed > 0);
    // The most recently used conversation end survives every eviction.
    assert_eq!(engine.resume_point(&cat(&[&history, &[1]]), &[]), rest_at);
    assert_snapshot!(engine.trie.dump());
}

/// Variants of one conversation (regenerate, edit the last message, cancel and retry) each
/// keep their own branch and resume where they left off.
#[test]
fn divergent_variants_of_one_conversation() {
    let mut engine = Engine::hybrid();
    let system = run(0, 16);
    let base = cat(&[&system, &run(100, 114)]);
    let first = engine.serve(&base, &[], &[], Outcome::Finish(vec![1, 2, 3]));

    // Regenerate: the same prompt resumes at the checkpoint just before its last key.
    let regenerated = engine.serve(&base, &[], &[], Outcome::Finish(vec![4, 5]));
    let keys = engine.prompt(&base, &[]).keys().len();
    assert_eq!(regenerated.restore_at, keys - 1);

    // Edit the last user message, cancel, retry.
    let edited = cat(&[&system, &run(100, 104), &run(500, 520)]);
    let cancelled = engine.serve(&edited, &[], &[], Outcome::CancelAt(25));
    assert_eq!(cancelled.rest_at, 25);
    let retried = engine.serve(&edited, &[], &[], Outcome::Finish(vec![6]));
    assert_eq!(retried.restore_at, 25);

    // Another variant diverges earlier and is cancelled twice.
    let other = cat(&[&system, &run(900, 930)]);
    assert_eq!(
        engine
            .serve(&other, &[], &[], Outcome::CancelAt(20))
            .rest_at,
        20
    );
    assert_eq!(
        engine
            .serve(&other, &[], &[], Outcome::CancelAt(37))
            .restore_at,
        20
    );
    assert_eq!(engine.resume_point(&other, &[]), 37);

    // Each finished variant continues from its own end.
    for served in [&first, &regenerated, &retried] {
        let continued = cat(&[&served.tokens, &[42]]);
        assert_eq!(engine.resume_point(&continued, &[]), served.rest_at);
    }
    assert_snapshot!(engine.trie.dump());
}

/// Clients that put a changing system message first (a "tokens left" counter) diverge near the
/// start every turn. Scheduling a capture where the changing part starts lets each turn resume
/// there instead of from scratch, and the dead branches are reclaimed under a budget.
#[test]
fn prompt_whose_system_message_changes_each_turn() {
    let header = run(0, 10);
    let conversation = |turn: u32| -> Vec<u32> {
        let mut tokens = header.clone();
        tokens.push(5000 + turn);
        tokens.extend(run(20, 25));
        for t in 0..=turn {
            tokens.extend(run(100 + 10 * t, 106 + 10 * t));
        }
        tokens
    };
    let schedule = SchedulePolicy {
        interval: 0,
        before_end: 4,
    };
    let sizes = Sizes {
        range_per_key: 1,
        point: 64,
    };
    let layers = vec![LayerKind::Point, LayerKind::Range];
    let mut guided = Engine::new(layers.clone(), Lookahead::None, schedule, sizes);
    let mut unguided = Engine::new(layers, Lookahead::None, schedule, sizes);
    for turn in 0..8 {
        let prompt = conversation(turn);
        let served = guided.serve(&prompt, &[], &[header.len()], Outcome::Finish(vec![1, 2]));
        let plain = unguided.serve(&prompt, &[], &[], Outcome::Finish(vec![1, 2]));
        // Without the hint only the second turn starts over; it schedules a capture at the
        // branch point, which later turns reuse.
        if turn > 0 {
            assert_eq!(served.matched, header.len());
            assert_eq!(served.restore_at, header.len());
            assert_eq!(plain.restore_at, if turn == 1 { 0 } else { header.len() });
        }
        guided.trie.evict(400).unwrap();
        guided.check();
        assert!(guided.trie.bytes() <= 400);
    }
    assert_snapshot!(guided.trie.dump());
}

/// Non-causal media items are evaluated in one forward: captures scheduled inside one move to
/// its end, and a match ending inside one resumes at its start. Different images behind the
/// same placeholder tokens never share state.
#[test]
fn non_causal_media_is_never_split() {
    let mut engine = Engine::new(
        vec![LayerKind::Range],
        Lookahead::None,
        SchedulePolicy {
            interval: 8,
            before_end: 0,
        },
        Sizes {
            range_per_key: 1,
            point: 0,
        },
    );
    let tokens = cat(&[&run(0, 5), &[9; 10], &run(20, 30)]);
    let image = |hash| MediaItem {
        tokens: 5..15,
        content_hash: hash,
        causal: false,
    };
    engine.serve(&tokens, &[image(1)], &[], Outcome::Finish(vec![3]));
    let dump = engine.trie.dump();
    assert!(
        !dump.contains("[0..8)"),
        "a capture landed inside the image:\n{dump}"
    );

    // A prompt ending inside the image resumes at its start, not inside it.
    let truncated = &tokens[..12];
    let truncated_image = MediaItem {
        tokens: 5..12,
        content_hash: 1,
        causal: false,
    };
    assert_eq!(engine.resume_point(truncated, &[truncated_image]), 5);
    // Another image behind the same placeholders shares only the text before it.
    assert_eq!(engine.resume_point(&tokens, &[image(2)]), 5);
    // The same image resumes past it.
    assert_eq!(engine.resume_point(&tokens, &[image(1)]), tokens.len() - 1);
    assert_snapshot!(dump);
}

/// With look-ahead keys a match never trusts a pair whose second token differs: a stop token
/// stripped from the next prompt makes the request re-evaluate the boundary token.
#[test]
fn look_ahead_keys_reuse_a_pair_only_when_its_next_token_matched() {
    let mut engine = Engine::new(
        vec![LayerKind::Range],
        Lookahead::NextToken,
        SchedulePolicy {
            interval: 0,
            before_end: 0,
        },
        Sizes {
            range_per_key: 1,
            point: 0,
        },
    );
    let prompt = run(1, 11);
    let first = engine.serve(&prompt, &[], &[], Outcome::Finish(vec![50, 51]));
    assert_eq!(first.rest_at, 11);
    // The next prompt keeps the reply (50) but drops the stop token (51).
    let next = cat(&[&prompt, &[50, 60, 61, 62]]);
    let served = engine.serve(&next, &[], &[], Outcome::Finish(vec![7]));
    assert_eq!((served.matched, served.restore_at), (10, 10));
    assert_snapshot!(engine.trie.dump());
}

/// How many children the node whose path is exactly `keys` has, if there is one.
fn children_at(engine: &Engine, keys: &[Key]) -> Option<usize> {
    engine
        .trie
        .nodes()
        .find(|node| engine.trie.path_keys(node.id).as_deref() == Some(keys))
        .map(|node| node.children)
}

/// Two conversations sharing a system prompt are live at once, twice over: both restore
/// exactly, both close, the shared prefix becomes one branching node, and each next turn
/// resumes at the end of its own history while the other one is live too.
#[test]
fn two_live_sessions_sharing_a_system_prompt() {
    let mut engine = Engine::hybrid();
    let system = run(0, 16);
    let a_prompt = cat(&[&system, &run(100, 110)]);
    let b_prompt = cat(&[&system, &run(200, 212)]);
    let mut a = engine.begin(&a_prompt, &[], &[]);
    let mut b = engine.begin(&b_prompt, &[], &[]);
    assert_eq!(engine.trie.live_sessions(), 2);
    // Interleaved prefill: A gets partway, B all the way, then A finishes.
    engine.prefill(&mut a, 12);
    engine.attach(&mut a);
    let b_end = b.prefill_end();
    engine.prefill(&mut b, b_end);
    engine.attach(&mut b);
    let mid_flight = engine.trie.dump();
    let a_done = engine.close(a, Outcome::Finish(vec![1, 2, 3]));
    assert_eq!(engine.trie.live_sessions(), 1);
    let b_done = engine.close(b, Outcome::Finish(vec![4, 5]));
    assert_eq!(engine.trie.live_sessions(), 0);

    // The system prompt's keys (with look-ahead, up to the last pair inside it) are one node
    // with a branch per conversation.
    let a_keys = engine.prompt(&a_prompt, &[]).keys().to_vec();
    let shared = &a_keys[..system.len() - 1];
    assert_eq!(children_at(&engine, shared), Some(2));

    // Both next turns live at once, each resuming at its own end.
    let a_next = cat(&[&a_done.tokens, &run(300, 306)]);
    let b_next = cat(&[&b_done.tokens, &run(400, 403)]);
    let a2 = engine.begin(&a_next, &[], &[]);
    let b2 = engine.begin(&b_next, &[], &[]);
    assert_eq!(a2.begin.restore_at, a_done.rest_at);
    assert_eq!(b2.begin.restore_at, b_done.rest_at);
    let b2_done = engine.close(b2, Outcome::Finish(vec![9]));
    let a2_done = engine.close(a2, Outcome::Finish(vec![8]));
    // Alternating conversations both stay cached.
    for done in [&a2_done, &b2_done] {
        let continued = cat(&[&done.tokens, &[42]]);
        assert_eq!(engine.resume_point(&continued, &[]), done.rest_at);
    }
    assert_snapshot!("two_live_sessions_mid_flight", mid_flight);
    assert_snapshot!("two_live_sessions_after", engine.trie.dump());
}

/// Two sessions with the same prompt live at once: the second walks into the nodes the
/// first created; each records its own reply as a branch.
#[test]
fn identical_prompts_live_at_once_share_their_nodes() {
    let mut engine = Engine::hybrid();
    let prompt = run(0, 20);
    let mut a = engine.begin(&prompt, &[], &[]);
    let mut b = engine.begin(&prompt, &[], &[]);
    engine.prefill(&mut a, 9);
    engine.attach(&mut a);
    engine.prefill(&mut b, 18);
    let report = engine.attach(&mut b);
    // B's capture at 8 found A's already there.
    assert!(report.kept_existing > 0);
    let a_done = engine.close(a, Outcome::Finish(vec![1, 2]));
    let b_done = engine.close(b, Outcome::Finish(vec![3, 4]));
    for done in [&a_done, &b_done] {
        let continued = cat(&[&done.tokens, &[42]]);
        assert_eq!(engine.resume_point(&continued, &[]), done.rest_at);
    }
    let keys = engine.prompt(&prompt, &[]).keys().to_vec();
    assert_eq!(children_at(&engine, &keys), Some(2));
}

/// Session B begins and closes while A is between begin and close; B splits A's attached
/// edge where their prompts diverge and compacts its own path. A's later close still records
/// its own keys and pages out only its own path.
#[test]
fn a_session_begun_and_closed_inside_another_leaves_it_intact() {
    let mut engine = kv_only();
    let a_prompt = run(0, 30);
    let mut a = engine.begin(&a_prompt, &[], &[]);
    // A's prefill captures only at 26 (4 before the end): attach it before B comes.
    engine.prefill(&mut a, 29);
    engine.attach(&mut a);
    assert_eq!(engine.trie.frontier_offset(a.session).unwrap(), 26);
    let a_frontier = engine
        .trie
        .nodes()
        .find(|node| !node.frontier_of.is_empty());
    assert_eq!(a_frontier.map(|node| node.end()), Some(26));

    // B shares A's first 20 keys, which A's attached capture already covers.
    let b_prompt = cat(&[&run(0, 20), &run(900, 910)]);
    let b = engine.begin(&b_prompt, &[], &[]);
    assert_eq!((b.begin.matched, b.begin.restore_at), (20, 20));
    let b_done = engine.close(b, Outcome::Finish(vec![600, 601]));
    assert_eq!(engine.trie.frontier_offset(a.session).unwrap(), 26);
    engine.check_restore(&a);

    let a_done = engine.close(a, Outcome::Finish(vec![500, 501]));
    assert_eq!(a_done.rest_at, 31);
    for done in [&a_done, &b_done] {
        let continued = cat(&[&done.tokens, &[42]]);
        assert_eq!(engine.resume_point(&continued, &[]), done.rest_at);
    }
    // The shared head is one node branching into both.
    let shared = engine.prompt(&run(0, 20), &[]).keys().to_vec();
    assert_eq!(children_at(&engine, &shared), Some(2));
}

/// Eviction between a session's begin and close (budget zero: everything it may take) leaves
/// the session's restore plan and its path whole; its close then stores the whole turn.
#[test]
fn eviction_while_a_session_is_live_does_not_break_it() {
    let mut engine = Engine::hybrid();
    let first = engine.serve(&run(0, 30), &[], &[], Outcome::Finish(vec![1, 2, 3]));
    let other = engine.serve(&run(500, 520), &[], &[], Outcome::Finish(vec![4]));
    let next = cat(&[&first.tokens, &run(40, 60)]);
    let mut live = engine.begin(&next, &[], &[]);
    assert_eq!(live.begin.restore_at, first.rest_at);

    engine.trie.evict(0).unwrap();
    engine.check();
    engine.check_restore(&live);
    // The unrelated conversation went; the live one's restore point stayed.
    assert!(engine.resume_point(&cat(&[&other.tokens, &[9]]), &[]) < other.rest_at);
    assert_eq!(engine.resume_point(&next, &[]), first.rest_at);

    engine.prefill(&mut live, 45);
    engine.attach(&mut live);
    engine.trie.evict(0).unwrap();
    engine.check();
    engine.check_restore(&live);
    let done = engine.close(live, Outcome::Finish(vec![7, 8]));
    let continued = cat(&[&done.tokens, &[42]]);
    assert_eq!(engine.resume_point(&continued, &[]), done.rest_at);
}

/// Abandoning one live session ends only that one: the other still restores, attaches and
/// closes; what the abandoned one attached stays stored.
#[test]
fn abandoning_one_session_leaves_the_other() {
    let mut engine = Engine::hybrid();
    let system = run(0, 12);
    let mut a = engine.begin(&cat(&[&system, &run(100, 120)]), &[], &[]);
    let mut b = engine.begin(&cat(&[&system, &run(200, 220)]), &[], &[]);
    engine.prefill(&mut b, 17);
    engine.attach(&mut b);
    engine.trie.abandon(b.session);
    assert_eq!(engine.trie.live_sessions(), 1);
    engine.check();
    assert!(engine.trie.attach(b.session, Vec::new()).is_err());
    // B's checkpoint at 8 survives the abandon.
    assert_eq!(engine.resume_point(&b.tokens, &[]), 16);

    engine.check_restore(&a);
    engine.prefill(&mut a, 20);
    engine.attach(&mut a);
    let done = engine.close(a, Outcome::Finish(vec![5]));
    let continued = cat(&[&done.tokens, &[42]]);
    assert_eq!(engine.resume_point(&continued, &[]), done.rest_at);
    assert_eq!(engine.trie.live_sessions(), 0);
}
