//! The step loop on tiny models (`nn/tests/fixtures`), driven step by step: batching, the
//! prefix trie behind every request, cancellation, admission. Every answer is compared with a
//! cold recompute (a fresh cache, one sequence, greedy).

use crate::steps;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use kvcache::KvStorage;
use proptest::prelude::*;
use runner::engine::DoneReason;
use steps::{CONTEXT, Handle, check_trie, cold, engine, ids, run, run_to_idle, run_turn, submit};

#[test]
fn one_request_equals_a_cold_recompute() {
    // The hybrids restore their recurrent and convolution layers from snapshots where the
    // others slice KV.
    for name in ["llama", "qwen3_5", "lfm2"] {
        let mut engine = engine(name, 64 << 20);
        let prompt = ids(1, 40);
        let handle = run(&mut engine, &prompt, 12);
        assert_eq!(handle.tokens, cold(engine.model(), &prompt, 12));
        let stats = handle.stats();
        assert_eq!((stats.prompt_tokens, stats.cached_tokens), (40, 0));
        assert_eq!(stats.generated_tokens, 12);
        assert_eq!(handle.done.unwrap().0, DoneReason::Length);
        check_trie(&engine);
    }
}

#[test]
fn zero_tokens_asked_evaluates_the_prompt_only() {
    let mut engine = engine("llama", 64 << 20);
    let handle = run(&mut engine, &ids(1, 20), 0);
    assert!(handle.tokens.is_empty());
    assert_eq!(handle.done.unwrap().0, DoneReason::Length);
    // What it evaluated is cached.
    assert_eq!(run(&mut engine, &ids(1, 20), 2).stats().cached_tokens, 19);
}

#[test]
fn eight_at_once_equal_each_alone() {
    for name in [
        "llama",
        "gemma3",
        "qwen3_5",
        "lfm2",
        "mistral",
        "mixtral",
        "gemma2",
        "olmo2",
        "phi3",
        "deepseek_v3",
        "glm4_moe_lite",
        "gpt_oss",
        "nemotron_h",
        "nemotron_h_moe",
        "granitemoehybrid",
        "mistral3",
        "llama4",
        "gemma4",
        "gemma4_moe",
    ] {
        let mut engine = engine(name, 64 << 20);
        let prompts: Vec<Vec<u32>> = (0..8).map(|r| ids(r, 5 + 7 * r as usize)).collect();
        let mut handles: Vec<Handle> = prompts.iter().map(|p| submit(&mut engine, p, 20)).collect();
        run_to_idle(&mut engine);
        for (prompt, handle) in prompts.iter().zip(&mut handles) {
            assert!(handle.ended());
            assert_eq!(handle.tokens, cold(engine.model(), prompt, 20), "{name}");
        }
        check_trie(&engine);
    }
}

/// Two conversations sharing a system prompt, alternating. The last message of each begins
/// after the system prompt, as the server tells the engine from the chat template: the hybrid
/// captures its recurrent state there (it restores only where a snapshot was taken, while KV
/// slices anywhere), and just before each prompt's last token.
#[test]
fn alternating_conversations_both_stay_cached() {
    for name in ["llama", "qwen3_5", "lfm2", "nemotron_h", "gemma4"] {
        let mut engine = engine(name, 64 << 20);
        let system = ids(9, 30);
        let a: Vec<u32> = system.iter().copied().chain(ids(1, 8)).collect();
        let b: Vec<u32> = system.iter().copied().chain(ids(2, 8)).collect();
        let first_a = run_turn(&mut engine, &a, 6, system.len());
        let first_b = run_turn(&mut engine, &b, 6, system.len());
        // B shares the system prompt with A.
        assert_eq!(first_b.stats().cached_tokens, 30, "{name}");
        for _ in 0..2 {
            for (prompt, first) in [(&a, &first_a), (&b, &first_b)] {
                let again = run_turn(&mut engine, prompt, 6, system.len());
                assert_eq!(again.tokens, first.tokens, "{name}");
                assert!(
                    again.stats().prompt_eval_count() <= 1,
                    "{name}: {:?}",
                    again.stats()
                );
                check_trie(&engine);
            }
        }
        // The next turn of A evaluates only what it adds.
        let reply_end = a.len() + first_a.tokens.len();
        let turn: Vec<u32> = a
            .iter()
            .copied()
            .chain(first_a.tokens.iter().copied())
            .chain(ids(5, 6))
            .collect();
        let next = run_turn(&mut engine, &turn, 6, reply_end);
        assert!(
            next.stats().prompt_eval_count() <= 6 + 1,
            "{name}: {:?}",
            next.stats()
        );
        assert_eq!(next.tokens, cold(engine.model(), &turn, 6), "{name}");
    }
}

#[test]
fn forks_share_their_common_part() {
    // The hybrids restore their recurrent and convolution layers from snapshots where the
    // others slice KV.
    for name in ["llama", "qwen3_5", "lfm2"] {
        let mut engine = engine(name, 64 << 20);
        let base = ids(3, 50);
        run(&mut engine, &base, 4);
        for branch in [7, 8] {
            let fork: Vec<u32> = base.iter().copied().chain(ids(branch, 10)).collect();
            let handle = run(&mut engine, &fork, 4);
            assert!(
                handle.stats().cached_tokens >= 50 - 4,
                "{:?}",
                handle.stats()
            );
            assert_eq!(handle.tokens, cold(engine.model(), &fork, 4));
        }
        check_trie(&engine);
    }
}

#[test]
fn a_cancelled_prefill_resumes_where_it_stopped() {
    // The hybrids restore their recurrent and convolution layers from snapshots where the
    // others slice KV.
    for name in ["llama", "qwen3_5", "lfm2"] {
        let mut engine = engine(name, 64 << 20);
        let long = ids(4, 200);
        let mut handle = submit(&mut engine, &long, 8);
        for _ in 0..5 {
            engine.step(); // 5 chunks of 16.
        }
        handle.cancel.store(true, Ordering::Relaxed);
        // A short request sent right after runs at once.
        let short = run(&mut engine, &ids(6, 3), 2);
        assert_eq!(short.tokens, cold(engine.model(), &ids(6, 3), 2));
        assert!(handle.ended());
        assert_eq!(handle.done.unwrap().0, DoneReason::Cancelled);
        let retry = run(&mut engine, &long, 8);
        assert!(retry.stats().cached_tokens >= 5 * 16, "{:?}", retry.stats());
        assert_eq!(retry.tokens, cold(engine.model(), &long, 8));
        check_trie(&engine);
    }
}

/// KV layers copy any prefix of a sequence still prefilling. (A recurrent state exists only at
/// a sequence's running offset, so a hybrid cannot take the first 60 of 64 tokens this way.)
#[test]
fn a_request_copies_a_prefix_from_one_still_running() {
    let mut engine = engine("llama", 64 << 20);
    let long = ids(4, 120);
    let mut first = submit(&mut engine, &long, 6);
    for _ in 0..4 {
        engine.step(); // 64 tokens prefilled, nothing in the trie yet.
    }
    let second_prompt: Vec<u32> = long[..60].iter().copied().chain(ids(8, 5)).collect();
    let second = run(&mut engine, &second_prompt, 6);
    assert_eq!(second.stats().cached_tokens, 60);
    assert_eq!(second.tokens, cold(engine.model(), &second_prompt, 6));
    assert!(first.ended());
    assert_eq!(first.tokens, cold(engine.model(), &long, 6));
    check_trie(&engine);
}

#[test]
fn a_sliding_window_conversation_evaluates_only_new_turns() {
    // The fixture's window is 8 tokens; every turn outgrows it.
    let mut engine = engine("gemma3", 64 << 20);
    let mut conversation = ids(2, 12);
    for turn in 0..4 {
        let handle = run(&mut engine, &conversation, 5);
        assert_eq!(handle.tokens, cold(engine.model(), &conversation, 5));
        if turn > 0 {
            assert!(
                handle.stats().prompt_eval_count() <= 6 + 1,
                "{:?}",
                handle.stats()
            );
        }
        conversation.extend(&handle.tokens);
        conversation.extend(ids(turn + 20, 6));
    }
}

#[test]
fn a_small_budget_bounds_the_trie() {
    let budget = 200_000;
    let mut engine = engine("llama", budget);
    let mut conversations: Vec<Vec<u32>> = (0..6).map(|c| ids(c, 20)).collect();
    for round in 0..50 {
        let c = (round * 7) % conversations.len();
        let prompt = conversations[c].clone();
        let handle = run(&mut engine, &prompt, 4);
        assert_eq!(handle.tokens, cold(engine.model(), &prompt, 4));
        assert!(engine.prefix_cache().bytes() <= budget, "round {round}");
        check_trie(&engine);
        conversations[c].extend(&handle.tokens);
        conversations[c].extend(ids(round as u32, 3));
        if conversations[c].len() > 150 {
            conversations[c].truncate(20);
        }
    }
}

/// The KV budget is shared by every resident model: sequences another model reserves count
/// against it, though a model with nothing running always admits one.
#[test]
fn the_kv_budget_counts_what_other_models_reserve() {
    let mut measuring = engine("llama", 64 << 20);
    let _one = submit(&mut measuring, &ids(1, 20), 8);
    measuring.step();
    let one = measuring.kv_reserved();
    assert!(one > 0);
    // Room for two of those sequences.
    let mut config = steps::config(64 << 20);
    config.memory.kv_bytes = 2 * one;
    let two_fit =
        || runner::engine::LoadedModel::new(steps::model("llama"), CONTEXT, config).unwrap();
    let admitted = |reserved_elsewhere: usize| {
        let mut engine = two_fit();
        let _handles = [
            submit(&mut engine, &ids(1, 20), 8),
            submit(&mut engine, &ids(2, 20), 8),
        ];
        engine.step_beside(reserved_elsewhere);
        let status = engine.status();
        (status.running, status.queued)
    };
    assert_eq!(admitted(0), (2, 0), "alone, both fit");
    assert_eq!(
        admitted(one),
        (1, 1),
        "beside another model's sequence, one waits"
    );
    assert_eq!(
        admitted(2 * one),
        (1, 1),
        "with the budget spent elsewhere, one still runs"
    );
}

#[test]
fn bad_prompts_fail_and_the_loop_goes_on() {
    let mut engine = engine("llama", 64 << 20);
    let mut empty = run(&mut engine, &[], 4);
    assert!(empty.ended() && empty.failed.is_some());
    let mut long = run(&mut engine, &ids(1, CONTEXT), 4);
    assert!(long.ended() && long.failed.as_deref().unwrap().contains("context"));
    let mut out_of_vocab = run(&mut engine, &[1, 2, u32::MAX], 4);
    assert!(out_of_vocab.ended() && out_of_vocab.failed.is_some());
    let fine = run(&mut engine, &ids(1, 10), 3);
    assert_eq!(fine.tokens, cold(engine.model(), &ids(1, 10), 3));
}

/// One event of the property test.
#[derive(Debug, Clone)]
enum Action {
    /// Start a request: conversation, new-turn tokens, max tokens.
    Start(usize, u32, usize),
    /// Cancel the n-th running request.
    Cancel(usize),
    /// Run this many steps.
    Steps(usize),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        (0..3usize, 0..4u32, 1..6usize).prop_map(|(c, t, n)| Action::Start(c, t, n)),
        (0..4usize).prop_map(Action::Cancel),
        (1..6usize).prop_map(Action::Steps),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Random interleavings of start / cancel / finish / new turn over several sequences:
    /// every finished answer equals a cold recompute, a cancelled one is a prefix of it, and
    /// the trie's invariants hold after every event.
    #[test]
    fn interleavings_match_a_cold_recompute(actions in prop::collection::vec(action(), 1..24)) {
        let mut engine = engine("llama", 400_000);
        let mut conversations: Vec<Vec<u32>> = (0..3).map(|c| ids(c + 40, 18)).collect();
        let mut running: Vec<(Vec<u32>, usize, usize, Handle)> = Vec::new();
        let mut finished = Vec::new();
        for action in actions.into_iter().chain([Action::Steps(10_000)]) {
            match action {
                Action::Start(c, turn, n) => {
                    let mut prompt = conversations[c].clone();
                    prompt.extend(ids(turn + 60, 3));
                    let handle = submit(&mut engine, &prompt, n);
                    running.push((prompt, c, n, handle));
                }
                Action::Cancel(i) => {
                    if let Some((_, _, _, handle)) = running.get(i) {
                        handle.cancel.store(true, Ordering::Relaxed);
                    }
                }
                Action::Steps(n) => {
                    for _ in 0..n {
                        if engine.is_idle() {
                            break;
                        }
                        engine.step();
                        check_trie(&engine);
                    }
                }
            }
            let mut still = Vec::new();
            for (prompt, c, n, mut handle) in running.drain(..) {
                if handle.ended() {
                    if handle.done.as_ref().is_some_and(|(r, _)| *r == DoneReason::Length) {
                        conversations[c] = prompt.iter().copied().chain(handle.tokens.iter().copied()).collect();
                    }
                    finished.push((prompt, n, handle));
                } else {
                    still.push((prompt, c, n, handle));
                }
            }
            running = still;
        }
        prop_assert!(running.is_empty());
        for (prompt, n, handle) in finished {
            let expected = cold(engine.model(), &prompt, n);
            let (reason, _) = handle.done.expect("no failures");
            match reason {
                DoneReason::Length => prop_assert_eq!(&handle.tokens, &expected),
                _ => prop_assert_eq!(&handle.tokens[..], &expected[..handle.tokens.len()]),
            }
        }
    }
}

/// With keys and values stored in f16 or as 8-bit codes (`--kv-cache f16|q8`), batching and
/// the prefix trie still leave every answer what the request gets alone on a fresh engine with
/// the same storage: the full-attention kernel, the sliding-window layers (MLX's attention over
/// a mask, which takes the history widened) and a hybrid's attention layers alike. 8-bit codes
/// come in groups of 32, so the q8 runs take the fixtures whose heads are that wide (the
/// sliding-window cache's 8-bit form is checked in the kvcache crate and on Gemma 3).
#[test]
fn a_narrow_kv_cache_batches_and_reuses_like_a_request_alone() {
    let runs = [
        (KvStorage::Float(mlx::Dtype::F16), "llama"),
        (KvStorage::Float(mlx::Dtype::F16), "gemma3"),
        (KvStorage::Float(mlx::Dtype::F16), "qwen3_5"),
        (KvStorage::Q8, "qwen3"),
        (KvStorage::Q8, "qwen3_5"),
    ];
    for (storage, name) in runs {
        let narrow_engine = || {
            let config = runner::engine::LoopConfig {
                kv_storage: Some(storage),
                ..steps::config(64 << 20)
            };
            runner::engine::LoadedModel::new(steps::model(name), CONTEXT, config).unwrap()
        };
        let prompts: Vec<Vec<u32>> = (0..4).map(|r| ids(r, 9 + 11 * r as usize)).collect();
        let alone: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| run(&mut narrow_engine(), p, 16).tokens)
            .collect();
        let mut engine = narrow_engine();
        let mut handles: Vec<Handle> = prompts.iter().map(|p| submit(&mut engine, p, 16)).collect();
        run_to_idle(&mut engine);
        for ((handle, expected), prompt) in handles.iter_mut().zip(&alone).zip(&prompts) {
            assert!(handle.ended());
            assert_eq!(
                &handle.tokens,
                expected,
                "{name} ({storage}), batched, prompt of {}",
                prompt.len()
            );
        }
        // A longer turn of the last conversation restores its cached prefix from the trie.
        let mut longer = prompts[3].clone();
        longer.extend(ids(9, 6));
        let again = run(&mut engine, &longer, 8);
        assert!(
            again.stats().cached_tokens > 0,
            "{name} ({storage}): nothing reused"
        );
        assert_eq!(
            again.tokens,
            run(&mut narrow_engine(), &longer, 8).tokens,
            "{name} ({storage})"
        );
        check_trie(&engine);
    }
}

/// A model whose heads an 8-bit cache cannot group is refused at load, naming the width.
#[test]
fn an_8_bit_kv_cache_refuses_heads_it_cannot_group() {
    let config = runner::engine::LoopConfig {
        kv_storage: Some(KvStorage::Q8),
        ..steps::config(64 << 20)
    };
    let err = match runner::engine::LoadedModel::new(steps::model("llama"), CONTEXT, config) {
        Ok(_) => panic!("16-value heads were accepted for 8-bit storage"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("groups of 32") && err.contains("16-value heads"),
        "{err}"
    );
}

/// An image the server left undecoded (its features were kept when the request was prepared)
/// whose features are gone when its tokens come: the engine decodes it itself, and the answer
/// is the one the decoded pixels give. Bytes that do not decode fail that job alone.
#[test]
fn an_undecoded_image_is_decoded_when_its_features_are_gone() {
    use runner::engine::{EncoderInput, ImageProcessing, PromptMedia, UndecodedImage};

    let png = {
        let image =
            image::RgbImage::from_fn(24, 16, |x, y| image::Rgb([x as u8 * 9, y as u8 * 13, 77]));
        let mut bytes = Vec::new();
        image
            .write_to(
                &mut std::io::Cursor::new(&mut bytes),
                image::ImageFormat::Png,
            )
            .unwrap();
        bytes
    };
    let config = media::ImageProcessorConfig::siglip(32);
    let answer = |input: EncoderInput, id: media::MediaId| {
        let mut engine = engine("gemma3_vision", 64 << 20);
        let vision = engine.model().vision().unwrap().image_input();
        let mut prompt = ids(2, 6);
        let tokens = prompt.len()..prompt.len() + vision.tokens_per_image;
        prompt.extend(std::iter::repeat_n(
            vision.image_token,
            vision.tokens_per_image,
        ));
        prompt.extend(ids(3, 5));
        let mut handle = steps::submit_media(
            &mut engine,
            &prompt,
            6,
            vec![PromptMedia { tokens, id, input }],
        );
        run_to_idle(&mut engine);
        assert!(handle.ended());
        // The loop goes on after a failed job.
        assert_eq!(run(&mut engine, &ids(4, 8), 2).tokens.len(), 2);
        handle
    };

    let decoded = media::prepare_image(&png, &media::ImageLimits::default(), &config).unwrap();
    let direct = answer(EncoderInput::Pixels(Arc::new(decoded.pixels)), decoded.id);
    let undecoded = UndecodedImage {
        bytes: png.clone().into(),
        processing: ImageProcessing::Fixed(config, None),
    };
    assert_eq!(undecoded.id(), decoded.id);
    let late = answer(EncoderInput::Undecoded(Arc::new(undecoded)), decoded.id);
    assert_eq!(late.tokens, direct.tokens);
    assert_eq!(late.stats().images_encoded, 1);
    assert_eq!(direct.tokens.len(), 6);

    let broken = UndecodedImage {
        bytes: png[..png.len() / 2].to_vec().into(),
        processing: ImageProcessing::Fixed(config, None),
    };
    let failed = answer(EncoderInput::Undecoded(Arc::new(broken)), decoded.id);
    assert!(
        failed
            .failed
            .as_deref()
            .is_some_and(|m| m.contains("invalid image")),
        "{:?}",
        failed.failed
    );
}
