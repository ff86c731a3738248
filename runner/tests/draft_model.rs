//! Speculative decoding with a draft model beside the target, through the step loop on tiny
//! models: answers equal the target's own greedy answers whatever the draft proposes (a
//! different model, or the target's own weights, which are always right), batched with plain,
//! prompt-lookup and other draft-model rows, through catch-up, budgets, sliding windows and
//! cancellation; seeded sampling does not depend on the depth; unseeded sampling draws its
//! drafts from the draft's distribution without changing the target's.

use crate::steps;

use runner::engine::{DrafterKind, LoadedModel, Speculation};
use steps::{
    Handle, assert_first_tokens_alike, cancel_after, check_trie, cold, controller_of_drafting,
    controller_of_plain_decoding, engine, ids, model, run_to_idle, run_with, submit_with,
};

fn drafted(depth: usize) -> Speculation {
    Speculation::On {
        drafter: DrafterKind::Model,
        max_depth: Some(depth),
    }
}

/// `target`'s fixture served with `draft`'s fixture beside it.
fn with_draft(target: &str, draft: &str) -> LoadedModel {
    let mut engine = engine(target, 64 << 20);
    engine
        .attach_draft(draft.into(), model(draft), false)
        .unwrap();
    engine
}

fn sampled(seed: u64) -> sampler::Options {
    sampler::Options {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.9,
        seed: Some(seed),
        ..sampler::Options::default()
    }
}

#[test]
fn draft_model_answers_equal_the_targets_alone() {
    // Another model (most drafts rejected) and the target's own weights (all accepted).
    for (target, draft) in [
        ("llama", "llama_untied"),
        ("llama", "llama"),
        ("gemma3", "gemma3"),
    ] {
        // Drafting from the first round to the last, however rarely the drafts are right.
        // Made before the engine, so it is dropped after it: unloading writes the controller
        // into it, which would recreate a folder removed first.
        let state = tempfile::tempdir().unwrap();
        controller_of_drafting(5)
            .save(state.path().join(format!("draft-{draft}.json")))
            .unwrap();
        let mut engine = with_draft(target, draft);
        engine.keep_state_in(state.path().to_path_buf());
        assert_eq!(engine.draft_depth(DrafterKind::Model), Some(5));
        // Longer prompts than a prefill chunk (16 here): the draft catches up over rounds.
        let prompts: Vec<Vec<u32>> = (0..4).map(|r| ids(r, 5 + 13 * r as usize)).collect();
        let mut handles: Vec<Handle> = prompts
            .iter()
            .map(|p| submit_with(&mut engine, p, 40, sampler::Options::greedy(), drafted(5)))
            .collect();
        // A plain request and a prompt-lookup one share the steps.
        let plain = ids(9, 12);
        let mut plain_handle = submit_with(
            &mut engine,
            &plain,
            40,
            sampler::Options::greedy(),
            Speculation::Off,
        );
        let mut lookup = submit_with(
            &mut engine,
            &plain,
            40,
            sampler::Options::greedy(),
            Speculation::On {
                drafter: DrafterKind::Ngram,
                max_depth: Some(4),
            },
        );
        run_to_idle(&mut engine);
        let mut accepted = 0;
        for (prompt, handle) in prompts.iter().zip(&mut handles) {
            assert!(handle.ended());
            assert_eq!(handle.failed, None, "{target}/{draft}");
            assert_eq!(
                handle.tokens,
                cold(engine.model(), prompt, 40),
                "{target}/{draft}, prompt of {}",
                prompt.len()
            );
            let spec = handle.stats().speculation.expect("it speculated");
            assert_eq!(spec.drafter, DrafterKind::Model);
            assert!(spec.drafted > 0, "{target}/{draft}: {spec:?}");
            // The first token follows the prompt; every round commits its accepted drafts and
            // one more.
            assert_eq!(1 + spec.rounds + spec.accepted + spec.plain, 40, "{spec:?}");
            accepted += spec.accepted;
            if target == draft {
                assert_eq!(spec.accepted, spec.drafted, "its own drafts: {spec:?}");
            }
        }
        // Random weights seldom agree with other random weights; the target's own always do.
        if target == draft {
            assert!(accepted > 0, "{target}/{draft}: nothing accepted");
        }
        for handle in [&mut plain_handle, &mut lookup] {
            assert!(handle.ended());
            assert_eq!(handle.tokens, cold(engine.model(), &plain, 40));
        }
        check_trie(&engine);
    }
}

#[test]
fn seeded_sampling_with_a_draft_model_does_not_depend_on_the_depth() {
    let mut engine = with_draft("llama", "llama_untied");
    let prompt = ids(4, 20);
    let mut answers = Vec::new();
    for depth in [1, 4, 16, 4] {
        let handle = run_with(&mut engine, &prompt, 30, sampled(5), drafted(depth));
        assert_eq!(handle.failed, None);
        assert_eq!(handle.tokens.len(), 30);
        answers.push(handle.tokens);
    }
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
}

#[test]
fn a_cancelled_draft_model_request_ends_and_its_retry_matches() {
    let mut engine = with_draft("llama", "llama_untied");
    let prompt = ids(7, 40);
    let mut first = submit_with(
        &mut engine,
        &prompt,
        60,
        sampler::Options::greedy(),
        drafted(4),
    );
    cancel_after(&mut engine, &mut first, 12);
    check_trie(&engine);
    let retry = run_with(
        &mut engine,
        &prompt,
        60,
        sampler::Options::greedy(),
        drafted(4),
    );
    assert!(
        retry.stats().cached_tokens > 0,
        "the retry resumed from the trie"
    );
    assert_eq!(retry.tokens, cold(engine.model(), &prompt, 60));
}

#[test]
fn a_draft_model_request_without_a_draft_model_is_refused() {
    let mut engine = engine("llama", 64 << 20);
    let mut handle = submit_with(
        &mut engine,
        &ids(1, 8),
        4,
        sampler::Options::greedy(),
        drafted(4),
    );
    run_to_idle(&mut engine);
    handle.poll();
    let message = handle.failed.clone().expect("refused");
    assert!(message.contains("draft model"), "{message}");
}

#[test]
fn the_next_turn_finds_the_drafts_history_in_its_trie() {
    let mut engine = with_draft("llama", "llama");
    let first_turn = ids(3, 50);
    let first = run_with(
        &mut engine,
        &first_turn,
        12,
        sampler::Options::greedy(),
        drafted(4),
    );
    let before = engine.status().draft_cache_bytes;
    // The next turn: the first, its answer, and a new message.
    let mut second_turn = first_turn.clone();
    second_turn.extend_from_slice(&first.tokens);
    second_turn.extend(ids(8, 6));
    let second = run_with(
        &mut engine,
        &second_turn,
        30,
        sampler::Options::greedy(),
        drafted(4),
    );
    assert_eq!(second.tokens, cold(engine.model(), &second_turn, 30));
    let spec = second.stats().speculation.expect("it speculated");
    // The draft restored its history: no catch-up rounds without drafts (a 68-token context
    // would take four 16-token chunks), and its own weights guess every token.
    assert_eq!(spec.accepted, spec.drafted, "{spec:?}");
    assert!(
        spec.rounds <= 30 / 5 + 2,
        "the draft caught up instead of restoring: {spec:?}"
    );
    assert!(
        before > 0,
        "the first turn left nothing in the draft's trie"
    );
    check_trie(&engine);
}

#[test]
fn a_probe_after_a_plain_stretch_restarts_the_draft_from_a_window() {
    // A controller that has measured only plain decoding: it picks depth 0, so the sequence
    // decodes plainly from its first round on, and probes depth 1 at its 8th decision, by
    // which time the draft (fed nothing yet) is more than a window behind.
    let state = tempfile::tempdir().unwrap();
    let learnt = controller_of_plain_decoding(4);
    learnt.save(state.path().join("draft-llama.json")).unwrap();
    let mut engine = with_draft("llama", "llama");
    engine.keep_state_in(state.path().to_path_buf());
    assert_eq!(engine.draft_depth(DrafterKind::Model), Some(0));

    let prompt = ids(4, 60);
    let answer = run_with(
        &mut engine,
        &prompt,
        60,
        sampler::Options::greedy(),
        drafted(4),
    );
    assert_eq!(answer.tokens, cold(engine.model(), &prompt, 60));
    let spec = answer.stats().speculation.expect("it speculated");
    assert!(spec.plain > 0 && spec.drafted > 0, "{spec:?}");
    assert_eq!(1 + spec.rounds + spec.accepted + spec.plain, 60, "{spec:?}");
    // Its draft caches held a window of the text, not a prefix: nothing was recorded in the
    // draft's trie (a draft caught up from the start would have left its 100-odd tokens).
    assert_eq!(engine.status().draft_cache_bytes, 0);
    check_trie(&engine);
}

fn unseeded() -> sampler::Options {
    sampler::Options {
        seed: None,
        ..sampled(0)
    }
}

#[test]
fn unseeded_drafts_are_drawn_from_the_draft_accepted_as_p_over_q_and_leave_the_text_unbiased() {
    // T 0.8, top-k 40, top-p 0.9, repeat penalty 1.1, unseeded: drafts are drawn from the
    // draft's distribution (the request's chain over the draft's logits, the penalty seeing
    // the earlier drafts) and verified with min(1, p/q). The target's own weights as the
    // draft give q = p up to f32 rounding, so nearly every draft is accepted, where argmax
    // drafts are accepted only as often as the target samples its argmax (72% here); and the
    // first three tokens of 2,000 requests are distributed as without speculation. (Unseeded,
    // the test is a fresh trial every run: it fails by chance once in about 3,000 runs. The
    // residual draw after a rejection is tested in `speculate`'s `lossless` tests.)
    const DRAWS: u64 = 2000;
    // A controller that has learnt to draft: a cold one weighs what a round costs against a
    // plain step, and with the target's own weights as the draft the two are close, so how
    // often it drafted depended on the machine's timing (81 drafts, under the 100 below, in
    // one CI run). Made before the engine, which writes the controller back when it unloads.
    let state = tempfile::tempdir().unwrap();
    controller_of_drafting(3)
        .save(state.path().join("draft-llama.json"))
        .unwrap();
    let mut engine = with_draft("llama", "llama");
    engine.keep_state_in(state.path().to_path_buf());
    let prompt = ids(7, 10);
    let options = sampler::Options {
        repeat_penalty: 1.1,
        ..unseeded()
    };
    let (accepted, proposed) =
        assert_first_tokens_alike(&mut engine, &prompt, DRAWS, |_| options.clone(), drafted(3));
    // q and p differ by f32 rounding between the two forwards: a rejection is a rare event
    // (a top-p boundary token on one side of the cut only).
    assert!(proposed >= 100, "only {proposed} drafts");
    assert!(
        accepted * 100 >= proposed * 95,
        "{accepted} of {proposed} drafts accepted"
    );
}
