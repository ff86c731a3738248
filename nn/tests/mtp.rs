//! Multi-token-prediction heads against their reference forward (issue 49).
//!
//! `nn/tests/fixtures/qwen3_5_mtp/` holds a head drawn at random beside the `qwen3_5` fixture's
//! decoder, in one checkpoint as Qwen3.5 ships it; `llama_mtp/` holds one in the same layout
//! over a Llama layer, in a file of its own that `nn::load::load_with_head` attaches to the
//! `llama` fixture, as a head trained apart ships; `deepseek_v3_mtp/` holds DeepSeek-V3's
//! next-token-prediction layer after the `deepseek_v3` fixture's decoder. Each has what a
//! float64 forward written from the published layout gives for it
//! (`scripts/make_mtp_fixture.py`; numpy for the first two, transformers' own decoder layer
//! inside it for DeepSeek's). The head is fed the fixture's conditioning rather than the
//! decoder's own state, so the comparison isolates the head; 1e-4 is the tolerance of every f32
//! parity test here (the reference is exact to far better, and f32 sums over a 64-wide hidden
//! state and a 512-token vocabulary stay well inside it).

mod common;

use std::path::{Path, PathBuf};

use common::argmax;

use kvcache::LayerCache;
use mlx::{Array, Dtype};
use nn::{Batch, DraftHead, Model, Weights, build_model};
use quant::{SafetensorsFile, Tensor};

const TOLERANCE: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Every tensor of `path`, by name.
fn tensors(path: &Path) -> Vec<(String, Tensor)> {
    let file = SafetensorsFile::open(path).unwrap();
    file.entries()
        .keys()
        .map(|name| (name.clone(), Tensor::Dense(file.load(name).unwrap())))
        .collect()
}

/// Each fixture's model with its head: Qwen3.5's and DeepSeek-V3's from one checkpoint,
/// Llama's attached. Llama's is attached twice: to the safetensors checkpoint and to the same
/// weights as a GGUF file (as a catalog model is stored).
fn with_heads() -> [(&'static str, Box<dyn Model>); 4] {
    [
        ("qwen3_5_mtp", load("qwen3_5_mtp", &[]).unwrap()),
        ("deepseek_v3_mtp", load("deepseek_v3_mtp", &[]).unwrap()),
        ("llama_mtp", attached(&fixture("llama")).unwrap()),
        (
            "llama_mtp",
            attached(&fixture("llama").join("model.gguf")).unwrap(),
        ),
    ]
}

/// The `llama` fixture's decoder at `target`, with `llama_mtp`'s head attached.
fn attached(target: &Path) -> nn::Result<Box<dyn Model>> {
    let head = fixture("llama_mtp").join("head.safetensors");
    let settings = nn::load::LoadSettings {
        dtype: Some(Dtype::F32),
        ..nn::load::LoadSettings::default()
    };
    Ok(nn::load::load_with_head(target, Some(&head), settings)?.model)
}

/// The decoder of fixture `name` with its head, leaving out the tensors named in `without`.
fn load(name: &str, without: &[&str]) -> nn::Result<Box<dyn Model>> {
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture(name).join("config.json")).unwrap()).unwrap();
    let mut all = tensors(&fixture(name).join("model.safetensors"));
    all.retain(|(name, _)| !without.contains(&name.as_str()));
    let mut weights = Weights::new(all, Dtype::F32);
    let model = build_model(&config, &mut weights)?;
    assert!(weights.unused().is_empty(), "{:?}", weights.unused());
    Ok(model)
}

struct Reference {
    tokens: Vec<u32>,
    conditioning: Array,
    logits: Vec<f32>,
    chain_tokens: Vec<u32>,
    chain_logits: Vec<f32>,
}

fn reference(name: &str) -> Reference {
    let file = SafetensorsFile::open(&fixture(name).join("reference.safetensors")).unwrap();
    let ids = |name: &str| -> Vec<u32> {
        let values: Vec<i32> = file.load(name).unwrap().to_vec().unwrap();
        values.into_iter().map(|id| id as u32).collect()
    };
    Reference {
        tokens: ids("tokens"),
        conditioning: file.load("conditioning").unwrap(),
        logits: file.load("logits").unwrap().to_vec().unwrap(),
        chain_tokens: ids("chain_tokens"),
        chain_logits: file.load("chain_logits").unwrap().to_vec().unwrap(),
    }
}

/// The head's logits and final state over `tokens` at `position` on, conditioned on
/// `conditioning`, appending to `caches`.
fn head_step(
    model: &dyn Model,
    head: &dyn DraftHead,
    caches: &mut [Option<LayerCache>],
    tokens: &[u32],
    position: usize,
    conditioning: &Array,
) -> (Vec<f32>, Array) {
    let batch = Batch::single(tokens, position).unwrap();
    let forward = head
        .forward_head(&batch, conditioning, &mut [caches])
        .unwrap();
    let logits = model.unembed(&forward.hidden).unwrap().to_vec().unwrap();
    (logits, forward.conditioning().clone())
}

fn assert_close(got: &[f32], expected: &[f32], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: lengths");
    let worst = got
        .iter()
        .zip(expected)
        .map(|(g, e)| (g - e).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= TOLERANCE, "{what}: worst difference {worst}");
}

/// Positions `start..end` of a `[1, n, hidden]` state.
fn rows(state: &Array, start: usize, end: usize) -> Array {
    state.slice_axis(1, start as i32, end as i32).unwrap()
}

#[test]
fn the_head_matches_its_reference_in_one_forward_and_in_chunks() {
    for (name, model) in with_heads() {
        matches_in_one_forward_and_in_chunks(name, model.as_ref());
    }
}

fn matches_in_one_forward_and_in_chunks(name: &str, model: &dyn Model) {
    let head = model.draft_head().expect("the fixture's head loads");
    let reference = reference(name);
    let n = reference.tokens.len();

    let mut caches = head.new_head_caches().unwrap();
    let (logits, _) = head_step(
        model,
        head,
        &mut caches,
        &reference.tokens,
        0,
        &reference.conditioning,
    );
    assert_close(&logits, &reference.logits, &format!("{name}: one forward"));

    // Through the head's own cache, five positions at a time.
    let vocab = reference.logits.len() / n;
    let mut caches = head.new_head_caches().unwrap();
    for start in (0..n).step_by(5) {
        let end = (start + 5).min(n);
        let (logits, _) = head_step(
            model,
            head,
            &mut caches,
            &reference.tokens[start..end],
            start,
            &rows(&reference.conditioning, start, end),
        );
        assert_close(
            &logits,
            &reference.logits[start * vocab..end * vocab],
            &format!("{name}: positions {start}..{end}"),
        );
    }
}

/// Chained drafting: each step conditions on the previous step's own state and reads the
/// previous step's greedy token, as a drafter proposing several tokens does.
#[test]
fn a_chain_of_drafts_matches_its_reference() {
    for (name, model) in with_heads() {
        chain_matches(name, model.as_ref());
    }
}

fn chain_matches(name: &str, model: &dyn Model) {
    let head = model.draft_head().unwrap();
    let reference = reference(name);
    let n = reference.tokens.len();
    let vocab = reference.logits.len() / n;

    let mut caches = head.new_head_caches().unwrap();
    let (logits, state) = head_step(
        model,
        head,
        &mut caches,
        &reference.tokens,
        0,
        &reference.conditioning,
    );
    let mut state = rows(&state, n - 1, n);
    let mut token = argmax(&logits[(n - 1) * vocab..]);
    for (step, &expected) in reference.chain_tokens.iter().enumerate() {
        assert_eq!(token, expected, "{name}: chained token {step}");
        let (logits, next) = head_step(model, head, &mut caches, &[token], n + step, &state);
        assert_close(
            &logits,
            &reference.chain_logits[step * vocab..(step + 1) * vocab],
            &format!("{name}: chained step {step}"),
        );
        token = argmax(&logits);
        state = next;
    }
}

/// The head reads the target's final state: a forward offers it as its conditioning, so the
/// head drafts from a real prompt's state without anything more computed.
#[test]
fn the_decoder_offers_its_final_state_as_the_heads_conditioning() {
    for (_, model) in with_heads() {
        offers_its_final_state(model.as_ref());
    }
}

fn offers_its_final_state(model: &dyn Model) {
    let head = model.draft_head().unwrap();
    let prompt = [5, 17, 200, 42, 9, 311];
    let mut caches = model.new_caches().unwrap();
    let forward = model
        .forward(&Batch::single(&prompt, 0).unwrap(), &mut caches)
        .unwrap();
    assert!(forward.conditioning.is_none());
    let state = forward.conditioning();
    assert_eq!(state.shape(), forward.hidden.shape());

    // Position S pairs the target's state at S with the token at S + 1.
    let next_tokens = [17, 200, 42, 9, 311, 64];
    let mut head_caches = head.new_head_caches().unwrap();
    let (logits, _) = head_step(model, head, &mut head_caches, &next_tokens, 0, state);
    assert_eq!(logits.len(), prompt.len() * model.spec().vocab_size);
    assert!(logits.iter().all(|l| l.is_finite()));
}

#[test]
fn a_model_without_the_head_drafts_with_nothing_of_its_own() {
    // The qwen3_5 fixture's config names no head: its decoder alone.
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("qwen3_5").join("config.json")).unwrap())
            .unwrap();
    let mut weights = Weights::new(
        tensors(&fixture("qwen3_5").join("model.safetensors")),
        Dtype::F32,
    );
    let model = build_model(&config, &mut weights).unwrap();
    assert!(model.draft_head().is_none());
}

#[test]
fn a_head_missing_a_tensor_is_refused_by_name() {
    for (name, missing) in [
        ("qwen3_5_mtp", "mtp.layers.0.self_attn.k_norm.weight"),
        ("deepseek_v3_mtp", "model.layers.2.hnorm.weight"),
    ] {
        let error = load(name, &[missing])
            .err()
            .expect("a head without one of its tensors")
            .to_string();
        assert!(error.contains(missing), "{error}");
    }
}

/// DeepSeek-V3's head reads a zero embedding at position 0 and the real one everywhere else:
/// the reference's logits at 0 come only from the state, so a head that read the embedding
/// there would miss them, while the chunked test shows every later position reads it.
#[test]
fn deepseek_v3s_head_sets_the_first_positions_embedding_to_zero() {
    let model = load("deepseek_v3_mtp", &[]).unwrap();
    let head = model.draft_head().unwrap();
    let reference = reference("deepseek_v3_mtp");
    let vocab = reference.logits.len() / reference.tokens.len();
    let first_state = rows(&reference.conditioning, 0, 1);
    let mut logits_by_token = Vec::new();
    for token in [reference.tokens[0], reference.tokens[0] + 1] {
        let mut caches = head.new_head_caches().unwrap();
        let (logits, _) = head_step(model.as_ref(), head, &mut caches, &[token], 0, &first_state);
        assert_close(&logits, &reference.logits[..vocab], "position 0");
        logits_by_token.push(logits);
    }
    assert_eq!(logits_by_token[0], logits_by_token[1]);
}

/// A drafter runs the head for every speculating sequence of a step at once: two rows at
/// different positions, each over its own cache, give what each gives alone (to the parity
/// tolerance: only the matrix products' summation order may differ).
#[test]
fn rows_drafted_together_match_each_alone() {
    for (name, model) in with_heads() {
        rows_together_match(name, model.as_ref());
    }
}

fn rows_together_match(name: &str, model: &dyn Model) {
    let head = model.draft_head().unwrap();
    let reference = reference(name);
    let n = reference.tokens.len();
    let vocab = reference.logits.len() / n;
    // Row a has taken the first 7 positions, row b the first 4, each through its own cache.
    let (a, b) = (7, 4);
    let mut cache_a = head.new_head_caches().unwrap();
    let mut cache_b = head.new_head_caches().unwrap();
    head_step(
        model,
        head,
        &mut cache_a,
        &reference.tokens[..a],
        0,
        &rows(&reference.conditioning, 0, a),
    );
    head_step(
        model,
        head,
        &mut cache_b,
        &reference.tokens[..b],
        0,
        &rows(&reference.conditioning, 0, b),
    );
    // Then one position each, in one batch.
    let batch = Batch::rows(&[
        (&reference.tokens[a..a + 1], a),
        (&reference.tokens[b..b + 1], b),
    ])
    .unwrap();
    let conditioning = mlx::concatenate(
        &[
            rows(&reference.conditioning, a, a + 1),
            rows(&reference.conditioning, b, b + 1),
        ],
        0,
    )
    .unwrap();
    let forward = head
        .forward_head(&batch, &conditioning, &mut [&mut cache_a, &mut cache_b])
        .unwrap();
    let logits: Vec<f32> = model.unembed(&forward.hidden).unwrap().to_vec().unwrap();
    assert_close(
        &logits[..vocab],
        &reference.logits[a * vocab..(a + 1) * vocab],
        &format!("{name}: row a in a batch"),
    );
    assert_close(
        &logits[vocab..],
        &reference.logits[b * vocab..(b + 1) * vocab],
        &format!("{name}: row b in a batch"),
    );
}

#[test]
fn an_attached_head_is_refused_where_it_does_not_fit() {
    // A family that reads no head.
    let head = fixture("llama_mtp").join("head.safetensors");
    let error = nn::load::load_with_head(&fixture("qwen3"), Some(&head), Default::default())
        .err()
        .expect("qwen3 reads no attached head")
        .to_string();
    assert!(
        error.contains("do not read a multi-token-prediction head"),
        "{error}"
    );

    // A head trained for another vocabulary: its config says so, and is read.
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("head.safetensors");
    let mut bytes = std::fs::read(&head).unwrap();
    let said = br#"\"vocab_size\": 512"#;
    let at = bytes
        .windows(said.len())
        .position(|w| w == said)
        .expect("the fixture head's config names its vocabulary");
    // Same length, so the header's offsets still hold.
    bytes[at + said.len() - 3..at + said.len()].copy_from_slice(b"999");
    std::fs::write(&other, bytes).unwrap();
    let error = nn::load::load_with_head(&fixture("llama"), Some(&other), Default::default())
        .err()
        .expect("a head for another vocabulary")
        .to_string();
    assert!(
        error.contains("trained for a `vocab_size` of 999; this model's is 512"),
        "{error}"
    );
}

/// A model whose head is cut to its tokenizer (Qwen's padded rows) keeps its drafter head,
/// and the drafts' logits are cut as the model's are.
#[test]
fn a_model_cut_to_its_tokenizer_keeps_its_head() {
    let model =
        nn::limited_vocabulary::LimitedVocabulary::wrap(load("qwen3_5_mtp", &[]).unwrap(), 500);
    let head = model.draft_head().expect("the wrapped model's head");
    let reference = reference("qwen3_5_mtp");
    let mut caches = head.new_head_caches().unwrap();
    let (logits, _) = head_step(
        model.as_ref(),
        head,
        &mut caches,
        &reference.tokens[..1],
        0,
        &rows(&reference.conditioning, 0, 1),
    );
    assert_close(
        &logits,
        &reference.logits[..500],
        "the cut head's first row",
    );
}
