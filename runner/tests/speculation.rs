//! Speculative decoding through the step loop on tiny models: a speculating request produces
//! exactly what it would alone without speculation (greedy), batched with plain ones, through
//! stop tokens, budgets, sliding windows and cancellation; the trie stays consistent.

use crate::steps;

use runner::engine::{DoneReason, DrafterKind, LoadedModel, Speculation};
use steps::{
    Handle, assert_first_tokens_alike, cancel_after, check_trie, cold, controller_of_drafting,
    controller_of_plain_decoding, engine, ids, run_to_idle, submit, submit_job, submit_with,
};

fn ngram(depth: usize) -> Speculation {
    Speculation::On {
        drafter: DrafterKind::Ngram,
        max_depth: Some(depth),
    }
}

/// A prompt that repeats a phrase, so prompt lookup has something to propose.
fn repetitive(seed: u32, len: usize) -> Vec<u32> {
    let phrase = ids(seed, 7);
    phrase.iter().copied().cycle().take(len).collect()
}

fn speculate(engine: &mut LoadedModel, prompt: &[u32], n: usize, depth: usize) -> Handle {
    let mut handle = submit_with(engine, prompt, n, sampler::Options::greedy(), ngram(depth));
    run_to_idle(engine);
    assert!(handle.ended());
    handle
}

#[test]
fn greedy_speculation_equals_plain_decoding() {
    for name in ["llama", "gemma3"] {
        let mut engine = engine(name, 64 << 20);
        let mut accepted = 0;
        let mut plain = 0;
        for seed in 0..6 {
            let prompt = if seed % 2 == 0 {
                repetitive(seed, 30 + seed as usize)
            } else {
                ids(seed, 20)
            };
            let handle = speculate(&mut engine, &prompt, 40, 6);
            assert_eq!(
                handle.tokens,
                cold(engine.model(), &prompt, 40),
                "{name} seed {seed}"
            );
            let stats = handle.stats();
            assert_eq!(stats.generated_tokens, 40);
            let spec = stats.speculation.expect("the request speculated");
            assert!(spec.rounds > 0 && spec.rounds <= 40, "{spec:?}");
            assert!(spec.accepted <= spec.drafted);
            // The first token follows the prompt; every round commits its accepted drafts and
            // one more.
            assert_eq!(1 + spec.rounds + spec.accepted + spec.plain, 40, "{spec:?}");
            accepted += spec.accepted;
            plain += spec.plain;
            check_trie(&engine);
        }
        assert!(accepted > 0, "{name}: no draft was ever accepted");
        // Prompt lookup finds nothing to propose in the random prompts: their controller
        // sends them back to the plain forward, whose tokens are the same.
        assert!(plain > 0, "{name}: no token was decoded in a plain stretch");
    }
}

#[test]
fn speculating_and_plain_sequences_share_steps() {
    for name in ["llama", "gemma3"] {
        let mut engine = engine(name, 64 << 20);
        let prompts: Vec<Vec<u32>> = (0..8).map(|r| repetitive(r, 10 + 5 * r as usize)).collect();
        let mut handles: Vec<Handle> = prompts
            .iter()
            .enumerate()
            .map(|(r, p)| {
                let speculation = if r % 2 == 0 {
                    ngram(1 + r)
                } else {
                    Speculation::Off
                };
                submit_with(&mut engine, p, 24, sampler::Options::greedy(), speculation)
            })
            .collect();
        run_to_idle(&mut engine);
        for (r, (prompt, handle)) in prompts.iter().zip(&mut handles).enumerate() {
            assert!(handle.ended());
            assert_eq!(
                handle.tokens,
                cold(engine.model(), prompt, 24),
                "{name} row {r}"
            );
            assert_eq!(handle.stats().speculation.is_some(), r % 2 == 0);
        }
        check_trie(&engine);
    }
}

#[test]
fn budgets_and_sliding_windows_hold_while_speculating() {
    // Gemma 3's fixture slides its window (8, plus 16 slack) inside these generations, so
    // rejected drafts are taken back across the ring's edge.
    let mut engine = engine("gemma3", 64 << 20);
    for (n, depth, len) in [(1, 8, 40), (2, 8, 40), (3, 16, 5), (61, 16, 5), (40, 4, 12)] {
        let prompt = repetitive(3, len);
        let handle = speculate(&mut engine, &prompt, n, depth);
        assert_eq!(handle.failed, None);
        assert_eq!(handle.tokens, cold(engine.model(), &prompt, n), "n {n}");
        assert_eq!(handle.done.as_ref().map(|d| d.0), Some(DoneReason::Length));
        check_trie(&engine);
    }
}

#[test]
fn a_stop_token_among_accepted_drafts_ends_the_answer_there() {
    let mut engine = engine("llama", 64 << 20);
    let prompt = repetitive(5, 35);
    let plain = cold(engine.model(), &prompt, 40);
    // Stop at the first token that recurs: the drafter will have proposed it.
    let stop = plain
        .iter()
        .enumerate()
        .find(|&(i, t)| plain[..i].contains(t))
        .map(|(_, &t)| t)
        .expect("a tiny model repeats itself within 40 tokens");
    let cut = plain.iter().position(|&t| t == stop).unwrap_or(plain.len());
    let mut stopped = submit_job(
        &mut engine,
        &prompt,
        40,
        sampler::Options::greedy(),
        vec![stop],
        Vec::new(),
        ngram(8),
    );
    run_to_idle(&mut engine);
    assert!(stopped.ended());
    assert_eq!(stopped.tokens, plain[..cut]);
    assert_eq!(stopped.done.as_ref().map(|d| d.0), Some(DoneReason::Stop));
    check_trie(&engine);
}

#[test]
fn a_cancelled_speculating_request_resumes_from_the_trie() {
    let mut engine = engine("llama", 64 << 20);
    let prompt = repetitive(7, 30);
    let mut first = submit_with(
        &mut engine,
        &prompt,
        200,
        sampler::Options::greedy(),
        ngram(8),
    );
    cancel_after(&mut engine, &mut first, 12);
    let produced = first.tokens.len();
    assert!(produced > 0);
    check_trie(&engine);
    // What it produced is an exact prefix of the plain answer, and the same conversation
    // continued from it is served from the trie.
    let plain = cold(engine.model(), &prompt, produced);
    assert_eq!(first.tokens, plain);
    let turn: Vec<u32> = prompt.iter().copied().chain(plain).collect();
    let again = speculate(&mut engine, &turn, 10, 8);
    assert_eq!(again.tokens, cold(engine.model(), &turn, 10));
    assert!(
        again.stats().cached_tokens + 1 >= turn.len() - 1,
        "{:?}",
        again.stats()
    );
    check_trie(&engine);
}

fn sampled(seed: u64) -> sampler::Options {
    sampler::Options {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.9,
        repeat_penalty: 1.1,
        seed: Some(seed),
        ..sampler::Options::default()
    }
}

#[test]
fn seeded_sampling_does_not_depend_on_the_depth() {
    let mut engine = engine("llama", 64 << 20);
    let prompt = repetitive(2, 30);
    let mut answers = Vec::new();
    for depth in [1, 6, 16, 6] {
        let mut handle = submit_with(&mut engine, &prompt, 30, sampled(11), ngram(depth));
        run_to_idle(&mut engine);
        assert!(handle.ended());
        assert_eq!(handle.tokens.len(), 30);
        answers.push(handle.tokens);
    }
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
}

#[test]
fn sampled_speculation_draws_what_plain_sampling_draws() {
    // T 0.8, top-k 40, top-p 0.9, repeat penalty 1.1 (which sees the drafts before each
    // position): the first three tokens of 2,000 seeded requests with and without speculation.
    const DRAWS: u64 = 2000;
    // A controller that has learnt to draft, so how often it drafts does not hang on the
    // machine's timing. Made before the engine, which writes the controller back when it
    // unloads.
    let state = tempfile::tempdir().unwrap();
    controller_of_drafting(4)
        .save(state.path().join("ngram.json"))
        .unwrap();
    let mut engine = engine("llama", 64 << 20);
    engine.keep_state_in(state.path().to_path_buf());
    // A token the fixture tends to repeat, repeated: prompt lookup proposes more of it, and
    // the target accepts some and rejects some.
    let prompt = [repetitive(2, 30), vec![122; 6]].concat();
    let (accepted, drafted) =
        assert_first_tokens_alike(&mut engine, &prompt, DRAWS, sampled, ngram(4));
    assert!(
        accepted > 100,
        "only {accepted} of {drafted} drafts were accepted"
    );
}

#[test]
fn the_depth_controller_survives_a_restart() {
    let state = tempfile::tempdir().unwrap();
    let prompt = repetitive(6, 40);
    let depth = {
        let mut engine = engine("llama", 64 << 20);
        engine.keep_state_in(state.path().to_path_buf());
        for n in [30, 20, 25] {
            speculate(&mut engine, &prompt, n, 8);
        }
        engine
            .draft_depth(DrafterKind::Ngram)
            .expect("the controller has decided")
        // Unloading writes the controller.
    };
    assert!(state.path().join("ngram.json").exists());
    // Its decisions replay offline, each reproduced.
    let log = std::fs::read_to_string(state.path().join("ngram.log.json")).unwrap();
    let replay = speculate::DecisionLog::from_json(&log).unwrap().replay();
    assert!(replay.decisions > 0);
    assert!(replay.mismatches.is_empty(), "{:?}", replay.mismatches);
    assert_eq!(replay.controller.best(1), depth);
    let mut engine = engine("llama", 64 << 20);
    engine.keep_state_in(state.path().to_path_buf());
    assert_eq!(engine.draft_depth(DrafterKind::Ngram), Some(depth));
}

/// Eight sequences of one drafter decoding together ask their controller once per step, not
/// once each: its probe schedule counts steps, so a probe makes one step in eight draft, not
/// about one sequence in every step (each such round broke the plain forward of the others).
#[test]
fn a_batch_decides_its_depth_once_per_step() {
    let state = tempfile::tempdir().unwrap();
    let tokens = 40;
    {
        let mut engine = engine("llama", 64 << 20);
        engine.keep_state_in(state.path().to_path_buf());
        let mut handles: Vec<Handle> = (0..8)
            .map(|r| {
                // Random prompts: prompt lookup rarely has anything, so the batch mostly
                // decodes plainly and probes now and then.
                let prompt = ids(100 + r, 12);
                submit_with(
                    &mut engine,
                    &prompt,
                    tokens,
                    sampler::Options::greedy(),
                    ngram(4),
                )
            })
            .collect();
        run_to_idle(&mut engine);
        for handle in &mut handles {
            assert!(handle.ended());
            assert_eq!(handle.stats().generated_tokens, tokens);
        }
        // Unloading writes the controller and its log.
    }
    let log = std::fs::read_to_string(state.path().join("ngram.log.json")).unwrap();
    let log = speculate::DecisionLog::from_json(&log).unwrap();
    let decisions = log
        .events()
        .filter(|e| matches!(e, speculate::Event::Depth { .. }))
        .count();
    // A step decides at most twice per batch size it sees: among the sequences starting
    // rounds and among those reading a plain token. Per sequence, it was about 8 x 40.
    assert!(decisions > 0);
    assert!(
        decisions <= 2 * (tokens + 8),
        "{decisions} decisions for 8 sequences of {tokens} tokens"
    );
}

#[test]
fn layer_skip_drafts_leave_answers_unchanged() {
    // The hybrids' first layer is recurrent: its state is saved before each draft and put
    // back after, and the verification rolls back through captures taken inside the round.
    for name in [
        "llama",
        "gemma3",
        "qwen3_5",
        "lfm2",
        "nemotron_h",
        "granitemoehybrid",
    ] {
        let mut engine = engine(name, 64 << 20);
        let layer_skip = Speculation::On {
            drafter: DrafterKind::SelfDraft(1),
            max_depth: Some(4),
        };
        let mut rejected = 0;
        // Short prompts: Gemma 3's fixture window (8, plus 16 slack) wraps during the answer,
        // so drafts are taken back across the ring's edge.
        let prompts: Vec<Vec<u32>> = (0..3).map(|r| repetitive(r, 6 + 2 * r as usize)).collect();
        // Three at once, so layer-skip rows draft together.
        let mut handles: Vec<Handle> = prompts
            .iter()
            .map(|p| submit_with(&mut engine, p, 30, sampler::Options::greedy(), layer_skip))
            .collect();
        run_to_idle(&mut engine);
        for (prompt, handle) in prompts.iter().zip(&mut handles) {
            assert!(handle.ended());
            assert_eq!(handle.failed, None, "{name}");
            assert_eq!(handle.tokens, cold(engine.model(), prompt, 30), "{name}");
            let spec = handle.stats().speculation.expect("it speculated");
            assert_eq!(spec.drafter, DrafterKind::SelfDraft(1));
            assert!(spec.drafted > 0, "{spec:?}");
            rejected += spec.drafted - spec.accepted;
        }
        // These hybrids' rounds had to roll their recurrent states back past a rejected
        // draft (Granite's fixture settles on one token, so its drafts all land).
        if ["qwen3_5", "lfm2", "nemotron_h"].contains(&name) {
            assert!(rejected > 0, "{name}: every draft was accepted");
        }
        check_trie(&engine);
        // A draft as deep as the model is refused by name.
        let too_deep = Speculation::On {
            drafter: DrafterKind::SelfDraft(64),
            max_depth: None,
        };
        let mut refused = submit_with(
            &mut engine,
            &prompts[0],
            4,
            sampler::Options::greedy(),
            too_deep,
        );
        run_to_idle(&mut engine);
        refused.poll();
        let message = refused.failed.clone().expect("refused");
        assert!(message.contains("self:64"), "{message}");
    }
}

#[test]
fn a_round_right_after_a_plain_stretch_stays_within_the_budget() {
    // The controller measured only plain decoding: rounds give way to plain decoding until a
    // probe at its 8th decision, decided while the next plain token is already in flight.
    // Whatever the budget left then, the answer has exactly the tokens asked for, and the
    // target's.
    let learnt = controller_of_plain_decoding(8);
    let prompt = ids(6, 12);
    let mut probed = 0;
    for budget in 4..16 {
        let state = tempfile::tempdir().unwrap();
        learnt.save(state.path().join("self-1.json")).unwrap();
        let mut engine = engine("llama", 64 << 20);
        engine.keep_state_in(state.path().to_path_buf());
        let mut answer = submit_with(
            &mut engine,
            &prompt,
            budget,
            sampler::Options::greedy(),
            Speculation::On {
                drafter: DrafterKind::SelfDraft(1),
                max_depth: Some(8),
            },
        );
        run_to_idle(&mut engine);
        assert!(answer.ended());
        assert_eq!(answer.failed, None);
        let spec = answer.stats().speculation.expect("it speculated");
        probed += spec.drafted;
        assert_eq!(
            answer.tokens,
            cold(engine.model(), &prompt, budget),
            "a budget of {budget}: {spec:?}"
        );
    }
    assert!(probed > 0, "no probe drafted anything");
}

fn mtp(depth: usize) -> Speculation {
    Speculation::On {
        drafter: DrafterKind::Mtp,
        max_depth: Some(depth),
    }
}

/// Drafts from the head Qwen3.5's checkpoint ships (`nn/tests/fixtures/qwen3_5_mtp`, a head
/// drawn at random, so it guesses some tokens and misses most): eight greedy requests at
/// once, beside a plain one, answer what each answers alone, through the hybrid's recurrent
/// rollbacks; the trie stays consistent.
#[test]
fn mtp_drafts_leave_answers_unchanged() {
    drafts_leave_answers_unchanged("qwen3_5_mtp");
}

/// The same with DeepSeek-V3's head (`deepseek_v3_mtp`): a sparse layer over latent-attention
/// caches, of the target's and of its own.
#[test]
fn deepseek_v3_mtp_drafts_leave_answers_unchanged() {
    drafts_leave_answers_unchanged("deepseek_v3_mtp");
}

fn drafts_leave_answers_unchanged(fixture: &str) {
    let mut engine = engine(fixture, 64 << 20);
    eight_drafting_beside_a_plain_one(&mut engine, mtp(4), DrafterKind::Mtp);
}

/// What a test's drafting requests did, summed.
#[derive(Debug, Default)]
struct Drafting {
    drafted: usize,
    accepted: usize,
    rounds: usize,
}

/// Eight greedy requests drafting as `speculation` says, at once, beside a plain one: each
/// answers what it answers alone (through rejected rounds), its statistics name `drafter`,
/// something was drafted and something rejected, and the trie stays consistent.
fn eight_drafting_beside_a_plain_one(
    engine: &mut LoadedModel,
    speculation: Speculation,
    drafter: DrafterKind,
) -> Drafting {
    let prompts: Vec<Vec<u32>> = (0..8).map(|r| ids(40 + r, 9 + 3 * r as usize)).collect();
    let mut handles: Vec<Handle> = prompts
        .iter()
        .map(|p| submit_with(engine, p, 30, sampler::Options::greedy(), speculation))
        .collect();
    let plain = ids(50, 12);
    let mut plain_handle = submit_with(
        engine,
        &plain,
        20,
        sampler::Options::greedy(),
        Speculation::Off,
    );
    run_to_idle(engine);
    let mut totals = Drafting::default();
    for (prompt, handle) in prompts.iter().zip(&mut handles) {
        assert!(handle.ended());
        assert_eq!(handle.failed, None);
        assert_eq!(handle.tokens, cold(engine.model(), prompt, 30));
        let spec = handle.stats().speculation.expect("it speculated");
        assert_eq!(spec.drafter, drafter);
        totals.drafted += spec.drafted;
        totals.accepted += spec.accepted;
        totals.rounds += spec.rounds;
    }
    assert!(plain_handle.ended());
    assert_eq!(plain_handle.tokens, cold(engine.model(), &plain, 20));
    assert!(totals.drafted > 0, "nothing was drafted");
    assert!(
        totals.accepted < totals.drafted,
        "every draft was accepted: no rollback ran"
    );
    check_trie(engine);
    totals
}

/// A seeded request at T = 0.8 drafting as `speculation(depth)` says gives the same text at
/// each of `depths`.
fn seeded_text_at_every_depth(
    engine: &mut LoadedModel,
    speculation: impl Fn(usize) -> Speculation,
    depths: &[usize],
) {
    let prompt = ids(44, 14);
    let mut answers = Vec::new();
    for &depth in depths {
        let mut handle = submit_with(engine, &prompt, 24, sampled(5), speculation(depth));
        run_to_idle(engine);
        assert!(handle.ended());
        assert_eq!(handle.failed, None);
        answers.push(handle.tokens);
    }
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
}

/// A request whose prefix comes back from the trie, drafting as `speculation` says: its
/// drafter has no target states before the restored prefix's end and starts there; the answer
/// is the plain one. Returns the request.
fn drafting_after_a_restored_prefix(engine: &mut LoadedModel, speculation: Speculation) -> Handle {
    let first = ids(41, 24);
    let mut plain = submit(engine, &first, 8);
    run_to_idle(engine);
    assert!(plain.ended());
    let longer = [first.clone(), ids(61, 6)].concat();
    let mut again = submit_with(engine, &longer, 20, sampler::Options::greedy(), speculation);
    run_to_idle(engine);
    assert!(again.ended());
    assert_eq!(again.failed, None);
    assert_eq!(again.tokens, cold(engine.model(), &longer, 20));
    assert!(again.stats().cached_tokens > 0, "nothing was restored");
    check_trie(engine);
    again
}

/// A request whose prefix comes back from the trie: the head has no target states before the
/// restored prefix's end, so its cache starts there, and the answer is still the plain one.
#[test]
fn mtp_drafts_from_where_a_restored_prefix_ends() {
    // A controller that has learnt to draft: the random head's low acceptance would otherwise
    // soon send the request to plain decoding, and this is about its first rounds. Made before
    // the engine, which writes the controller back when it unloads.
    let state = tempfile::tempdir().unwrap();
    controller_of_drafting(3)
        .save(state.path().join("mtp.json"))
        .unwrap();
    let mut engine = engine("qwen3_5_mtp", 64 << 20);
    engine.keep_state_in(state.path().to_path_buf());
    let again = drafting_after_a_restored_prefix(&mut engine, mtp(3));
    assert!(again.stats().speculation.expect("it speculated").drafted > 0);
}

#[test]
fn seeded_mtp_sampling_does_not_depend_on_the_depth() {
    let mut engine = engine("qwen3_5_mtp", 64 << 20);
    seeded_text_at_every_depth(&mut engine, mtp, &[1, 4, 2]);
}

#[test]
fn mtp_is_refused_where_the_checkpoint_ships_no_head() {
    let mut engine = engine("qwen3_5", 64 << 20);
    let mut refused = submit_with(
        &mut engine,
        &ids(3, 8),
        4,
        sampler::Options::greedy(),
        mtp(3),
    );
    run_to_idle(&mut engine);
    refused.poll();
    let message = refused.failed.clone().expect("refused");
    assert!(message.contains("mtp"), "{message}");
    assert!(
        message.contains("no multi-token-prediction head"),
        "{message}"
    );
}

/// The `qwen3_5_mtp` fixture made into a target whose head predicts it exactly. Every layer's
/// output projection is zeroed, so each position's final state is its own token's embedding,
/// normed: the greedy answer goes from one token to the next by a fixed map. The head's `fc`
/// passes the next token's embedding through (`[I | 0]`), its layer adds nothing and its norm
/// is the target's, so from the state at `S` and the token at `S + 1` it gives the target's
/// own state at `S + 1`, and drafts the target's next token.
fn target_with_a_predicting_head() -> Box<dyn nn::Model> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/tests/fixtures/qwen3_5_mtp");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let hidden = config["hidden_size"].as_u64().unwrap() as usize;
    let file = quant::SafetensorsFile::open(&dir.join("model.safetensors")).unwrap();
    let mut tensors = Vec::new();
    for name in file.entries().keys() {
        let array = file.load(name).unwrap();
        let silenced = ["o_proj.weight", "out_proj.weight", "down_proj.weight"]
            .iter()
            .any(|end| name.ends_with(end))
            || name == "mtp.pre_fc_norm_embedding.weight";
        let array = if silenced {
            mlx::Array::zeros(&array.shape(), mlx::Dtype::F32).unwrap()
        } else if name == "mtp.fc.weight" {
            let mut pass = vec![0f32; hidden * 2 * hidden];
            for i in 0..hidden {
                pass[i * 2 * hidden + i] = 1.0;
            }
            mlx::Array::from_slice(&pass, &[hidden as i32, 2 * hidden as i32]).unwrap()
        } else if name == "mtp.norm.weight" {
            file.load("model.norm.weight").unwrap()
        } else {
            array
        };
        tensors.push((name.clone(), quant::Tensor::Dense(array)));
    }
    let mut weights = nn::Weights::new(tensors, mlx::Dtype::F32);
    nn::build_model(&config, &mut weights).unwrap()
}

/// With a head that predicts its target, every draft is accepted at every depth and across
/// rounds: the engine gives the head each target state beside the token after it, and the
/// chained steps their own states. A state paired with the wrong token would draft the token
/// one step behind (the answers below keep changing, so that token is never right). The three
/// sequences draft together, their chained steps one forward of a row each: a row read back
/// as another's drafts would miss too.
#[test]
fn a_head_that_predicts_its_target_has_every_draft_accepted() {
    let mut engine = LoadedModel::new(
        target_with_a_predicting_head(),
        steps::CONTEXT,
        steps::config(64 << 20),
    )
    .unwrap();
    let prompts: Vec<Vec<u32>> = (0..3).map(|r| ids(70 + r, 5 + 4 * r as usize)).collect();
    let mut handles: Vec<Handle> = prompts
        .iter()
        .map(|p| submit_with(&mut engine, p, 24, sampler::Options::greedy(), mtp(4)))
        .collect();
    run_to_idle(&mut engine);
    for (prompt, handle) in prompts.iter().zip(&mut handles) {
        assert!(handle.ended());
        assert_eq!(handle.failed, None);
        assert_eq!(handle.tokens, cold(engine.model(), prompt, 24));
        // The answer keeps changing token to token, so a draft one step behind would miss.
        assert!(
            handle.tokens.windows(2).all(|pair| pair[0] != pair[1]),
            "{:?}",
            handle.tokens
        );
        let spec = handle.stats().speculation.expect("it speculated");
        assert!(spec.drafted > 0, "{spec:?}");
        assert_eq!(spec.accepted, spec.drafted, "{spec:?}");
    }
}

/// The `gemma4` fixture with the Gemma 4 assistant drawn for it
/// (`nn/tests/fixtures/gemma4_assistant`, random: it guesses a few tokens and misses most)
/// loaded as its draft model, which requests call `gemma4-assistant`.
fn engine_with_assistant() -> LoadedModel {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/tests/fixtures");
    let target = nn::load::load(&fixtures.join("gemma4"), Some(mlx::Dtype::F32)).unwrap();
    let assistant = nn::load::load_assistant(
        &fixtures.join("gemma4_assistant"),
        target.model.as_ref(),
        &target.config_json,
        mlx::Dtype::F32,
    )
    .unwrap();
    let mut engine =
        LoadedModel::new(target.model, steps::CONTEXT, steps::config(64 << 20)).unwrap();
    engine.attach_assistant("gemma4-assistant".into(), assistant, false);
    engine
}

/// Drafting with the draft model loaded beside the target (of any kind), at most `depth` deep.
fn draft_model(depth: usize) -> Speculation {
    Speculation::On {
        drafter: DrafterKind::Model,
        max_depth: Some(depth),
    }
}

/// Eight greedy requests drafting with the assistant at once, beside a plain one, answer what
/// each answers alone: past the target's sliding window, through rejected rounds that rewind
/// the caches the assistant reads; the trie stays consistent.
#[test]
fn assistant_drafts_leave_answers_unchanged() {
    let mut engine = engine_with_assistant();
    assert_eq!(engine.draft_name(), Some("gemma4-assistant"));
    eight_drafting_beside_a_plain_one(&mut engine, draft_model(4), DrafterKind::Model);
}

#[test]
fn seeded_assistant_sampling_does_not_depend_on_the_depth() {
    let mut engine = engine_with_assistant();
    seeded_text_at_every_depth(&mut engine, draft_model, &[1, 4, 2]);
}

/// A request whose prefix comes back from the trie has no target state before the round
/// until a forward runs: its first round drafts nothing, later ones draft, and the answer is
/// the plain one.
#[test]
fn assistant_drafts_after_a_restored_prefix() {
    let state = tempfile::tempdir().unwrap();
    controller_of_drafting(3)
        .save(state.path().join("draft-gemma4-assistant.json"))
        .unwrap();
    let mut engine = engine_with_assistant();
    engine.keep_state_in(state.path().to_path_buf());
    let again = drafting_after_a_restored_prefix(&mut engine, draft_model(3));
    assert!(again.stats().speculation.expect("it speculated").drafted > 0);
}

/// The `gemma4` fixture made into a target whose next token is a fixed map of its current
/// one (every layer's output projections zeroed: each position's final state is its own
/// token's embedding, normed; its head untied, each row the embedding of the next id, so the
/// map moves on rather than repeating the token), and an assistant as wide as it that
/// computes that map: its `pre_projection` passes the token's embedding through, its layers
/// add nothing, and its final norm and head are the target's. From the round's token it
/// drafts the target's next, and from each draft the one after.
fn target_with_a_predicting_assistant() -> (Box<dyn nn::Model>, Box<dyn nn::Assistant>) {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/tests/fixtures");
    let read = |dir: &str| -> (serde_json::Value, quant::SafetensorsFile) {
        let dir = fixtures.join(dir);
        let config = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap());
        let file = quant::SafetensorsFile::open(&dir.join("model.safetensors")).unwrap();
        (config.unwrap(), file)
    };
    let dense = |array: mlx::Array| quant::Tensor::Dense(array);
    let (mut target_config, file) = read("gemma4");
    target_config["tie_word_embeddings"] = false.into();
    let embedding = file.load("model.embed_tokens.weight").unwrap();
    let vocab = embedding.dim(0).unwrap();
    let shifted: Vec<i32> = (0..vocab).map(|j| (j + 1) % vocab).collect();
    let head = embedding
        .take(&mlx::Array::from_slice(&shifted, &[vocab]).unwrap(), 0)
        .unwrap();
    let mut target_tensors = vec![("lm_head.weight".to_string(), dense(head.clone()))];
    for name in file.entries().keys() {
        let array = file.load(name).unwrap();
        let silenced = [
            "o_proj.weight",
            "down_proj.weight",
            "per_layer_projection.weight",
        ]
        .iter()
        .any(|end| name.ends_with(end));
        let array = if silenced {
            mlx::Array::zeros(&array.shape(), mlx::Dtype::F32).unwrap()
        } else {
            array
        };
        target_tensors.push((name.clone(), dense(array)));
    }
    let mut weights = nn::Weights::new(target_tensors, mlx::Dtype::F32);
    let target = nn::build_model(&target_config, &mut weights).unwrap();

    let (mut config, _) = read("gemma4_assistant");
    let hidden = 64;
    config["text_config"]["hidden_size"] = hidden.into();
    config["use_ordered_embeddings"] = false.into();
    let eye = |n: usize, m: usize| {
        let values: Vec<f32> = (0..n * m)
            .map(|i| if i / m == i % m { 1.0 } else { 0.0 })
            .collect();
        mlx::Array::from_slice(&values, &[n as i32, m as i32]).unwrap()
    };
    let zeros = |shape: &[i32]| mlx::Array::zeros(shape, mlx::Dtype::F32).unwrap();
    let ones = |n: i32| mlx::Array::ones(&[n], mlx::Dtype::F32).unwrap();
    let mut tensors = vec![
        ("pre_projection.weight".to_string(), eye(hidden, 2 * hidden)),
        ("post_projection.weight".to_string(), eye(hidden, hidden)),
        // Its head is tied to its embedding table, which it reads for nothing else.
        ("model.embed_tokens.weight".to_string(), head),
        (
            "model.norm.weight".to_string(),
            file.load("model.norm.weight").unwrap(),
        ),
    ];
    let h = hidden as i32;
    for (i, head_dim) in [(0, 16), (1, 32)] {
        let p = format!("model.layers.{i}");
        for norm in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ] {
            tensors.push((format!("{p}.{norm}.weight"), ones(h)));
        }
        tensors.extend([
            (
                format!("{p}.self_attn.q_proj.weight"),
                zeros(&[4 * head_dim, h]),
            ),
            (format!("{p}.self_attn.q_norm.weight"), ones(head_dim)),
            (
                format!("{p}.self_attn.o_proj.weight"),
                zeros(&[h, 4 * head_dim]),
            ),
            (format!("{p}.mlp.gate_proj.weight"), zeros(&[80, h])),
            (format!("{p}.mlp.up_proj.weight"), zeros(&[80, h])),
            (format!("{p}.mlp.down_proj.weight"), zeros(&[h, 80])),
            (format!("{p}.layer_scalar"), ones(1)),
        ]);
    }
    let tensors: Vec<(String, quant::Tensor)> =
        tensors.into_iter().map(|(n, a)| (n, dense(a))).collect();
    let mut weights = nn::Weights::new(tensors, mlx::Dtype::F32);
    let assistant = nn::arch::gemma4_assistant::Gemma4Assistant::new(
        &config,
        &mut weights,
        target.as_ref(),
        &target_config,
    )
    .unwrap();
    (target, Box::new(assistant))
}

/// With an assistant that predicts its target, every draft is accepted at every depth and
/// across rounds: the engine gives it each round's first token beside the target's state, at
/// the position the caches end, and each chained step its own draft. A round fed the token
/// before or after would draft a token off by one (the answers keep changing, so it would
/// miss). Three sequences draft together, a row each.
#[test]
fn an_assistant_that_predicts_its_target_has_every_draft_accepted() {
    let (target, drafter) = target_with_a_predicting_assistant();
    let mut engine = LoadedModel::new(target, steps::CONTEXT, steps::config(64 << 20)).unwrap();
    engine.attach_assistant("predicting".into(), drafter, false);
    let prompts: Vec<Vec<u32>> = (0..3).map(|r| ids(70 + r, 5 + 4 * r as usize)).collect();
    let mut handles: Vec<Handle> = prompts
        .iter()
        .map(|p| {
            submit_with(
                &mut engine,
                p,
                24,
                sampler::Options::greedy(),
                draft_model(4),
            )
        })
        .collect();
    run_to_idle(&mut engine);
    for (prompt, handle) in prompts.iter().zip(&mut handles) {
        assert!(handle.ended());
        assert_eq!(handle.failed, None);
        assert_eq!(handle.tokens, cold(engine.model(), prompt, 24));
        assert!(
            handle.tokens.windows(2).all(|pair| pair[0] != pair[1]),
            "{:?}",
            handle.tokens
        );
        let spec = handle.stats().speculation.expect("it speculated");
        assert!(spec.drafted > 0, "{spec:?}");
        assert_eq!(spec.accepted, spec.drafted, "{spec:?}");
    }
}

/// The `llama` fixture with the DFlash drafter drawn for it (`nn/tests/fixtures/dflash`,
/// random: taps at both layers, blocks of 4) loaded as its draft model, `llama-dflash`.
fn engine_with_block_drafter() -> LoadedModel {
    engine_with_block_drafter_for("llama")
}

/// The tiny `target` fixture (as wide as the drafter, with as many layers and the same
/// vocabulary) with the DFlash fixture's drafter beside it.
fn engine_with_block_drafter_for(target: &str) -> LoadedModel {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/tests/fixtures");
    let target = nn::load::load(&fixtures.join(target), Some(mlx::Dtype::F32)).unwrap();
    let config: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fixtures.join("dflash").join("config.json")).unwrap(),
    )
    .unwrap();
    let file =
        quant::SafetensorsFile::open(&fixtures.join("dflash").join("model.safetensors")).unwrap();
    let tensors: Vec<(String, quant::Tensor)> = file
        .entries()
        .keys()
        .map(|name| (name.clone(), quant::Tensor::Dense(file.load(name).unwrap())))
        .collect();
    let mut weights = nn::Weights::new(tensors, mlx::Dtype::F32);
    let dflash = nn::arch::dflash::DFlash::new(&config, &mut weights, &target.config_json).unwrap();
    let mut engine =
        LoadedModel::new(target.model, steps::CONTEXT, steps::config(64 << 20)).unwrap();
    engine
        .attach_block_drafter("llama-dflash".into(), dflash, false)
        .unwrap();
    engine
}

/// Eight greedy requests drafting blocks at once, beside a plain one, answer what each
/// answers alone; no round drafts past a block's three masks, whatever depth is asked; the
/// trie stays consistent.
#[test]
fn block_drafts_leave_answers_unchanged() {
    block_drafts_unchanged_for("llama");
}

/// The same drafter beside the Qwen3 fixture, which taps its layers alike.
#[test]
fn block_drafts_leave_a_qwen3_targets_answers_unchanged() {
    block_drafts_unchanged_for("qwen3");
}

fn block_drafts_unchanged_for(target: &str) {
    let mut engine = engine_with_block_drafter_for(target);
    let totals = eight_drafting_beside_a_plain_one(&mut engine, draft_model(8), DrafterKind::Model);
    assert!(totals.drafted <= 3 * totals.rounds, "{totals:?}");
}

#[test]
fn seeded_block_sampling_does_not_depend_on_the_depth() {
    let mut engine = engine_with_block_drafter();
    seeded_text_at_every_depth(&mut engine, draft_model, &[1, 3, 2]);
}

/// After a prefix comes back from the trie the drafter's context starts where the target's
/// states do; the answer is the plain one and later rounds draft.
#[test]
fn block_drafts_after_a_restored_prefix() {
    let mut engine = engine_with_block_drafter();
    drafting_after_a_restored_prefix(&mut engine, draft_model(3));
}
