//! Gemma 4's assistant against transformers (issue 49).
//!
//! `nn/tests/fixtures/gemma4_assistant/` holds an assistant drawn at random for the `gemma4`
//! fixture (narrower than it, one sliding and one full layer, a centroid-masked head) and what
//! transformers' own `Gemma4AssistantForCausalLM` gives for one drafting round after a
//! 12-token prompt (longer than the target's 8-token window), in float64
//! (`scripts/make_assistant_fixture.py`). Here the target is our Gemma 4, whose own parity with
//! transformers the `parity` tests hold, and its caches are what the assistant reads; 1e-4 is
//! the tolerance of every f32 parity test (the target's states carry its own ~1e-6 error in).

mod common;

use std::path::{Path, PathBuf};

use common::argmax;

use kvcache::LayerCache;
use mlx::{Array, Dtype};
use nn::arch::gemma4_assistant::Gemma4Assistant;
use nn::{Assistant, Batch, Model, Weights};
use quant::{SafetensorsFile, Tensor};

const TOLERANCE: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn target() -> nn::load::Loaded {
    nn::load::load(&fixture("gemma4"), Some(Dtype::F32)).unwrap()
}

fn config(name: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(fixture(name).join("config.json")).unwrap()).unwrap()
}

/// The assistant's tensors, less those named in `without`, with `edit` applied to them.
fn assistant_weights(without: &[&str], edit: impl Fn(&str, Array) -> Array) -> Weights {
    let file =
        SafetensorsFile::open(&fixture("gemma4_assistant").join("model.safetensors")).unwrap();
    let tensors: Vec<(String, Tensor)> = file
        .entries()
        .keys()
        .filter(|name| !without.contains(&name.as_str()))
        .map(|name| {
            let array = edit(name, file.load(name).unwrap());
            (name.clone(), Tensor::Dense(array))
        })
        .collect();
    Weights::new(tensors, Dtype::F32)
}

/// The fixture's assistant for `target`, its config edited by `edit`.
fn assistant(
    target: &nn::load::Loaded,
    edit: impl Fn(&mut serde_json::Value),
) -> nn::Result<Gemma4Assistant> {
    let mut config = config("gemma4_assistant");
    edit(&mut config);
    let mut weights = assistant_weights(&[], |_, a| a);
    let assistant = Gemma4Assistant::new(
        &config,
        &mut weights,
        target.model.as_ref(),
        &target.config_json,
    )?;
    assert!(weights.unused().is_empty(), "{:?}", weights.unused());
    Ok(assistant)
}

struct Reference {
    prompt: Vec<u32>,
    first: u32,
    chain_tokens: Vec<u32>,
    chain_logits: Vec<f32>,
    plain_logits: Vec<f32>,
}

fn reference() -> Reference {
    let file =
        SafetensorsFile::open(&fixture("gemma4_assistant").join("reference.safetensors")).unwrap();
    let ids = |name: &str| -> Vec<u32> {
        let values: Vec<i32> = file.load(name).unwrap().to_vec().unwrap();
        values.into_iter().map(|id| id as u32).collect()
    };
    Reference {
        prompt: ids("prompt"),
        first: ids("first")[0],
        chain_tokens: ids("chain_tokens"),
        chain_logits: file.load("chain_logits").unwrap().to_vec().unwrap(),
        plain_logits: file.load("plain_logits").unwrap().to_vec().unwrap(),
    }
}

/// The target's caches after `prompt`, and its final state at the last position. Its
/// sliding caches hold one position past the window, which the assistant reads.
fn prefilled(model: &dyn Model, prompt: &[u32]) -> (Vec<Option<LayerCache>>, Array) {
    let mut caches = model.new_caches_rewindable(1).unwrap();
    let forward = model
        .forward(&Batch::single(prompt, 0).unwrap(), &mut caches)
        .unwrap();
    let n = prompt.len() as i32;
    (caches, forward.hidden.slice_axis(1, n - 1, n).unwrap())
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

/// A round's drafts and each step's logits, feeding `tokens` (or, when `None`, each step's
/// own argmax) back.
fn round(
    assistant: &dyn Assistant,
    target: &dyn Model,
    caches: &[Option<LayerCache>],
    state: Array,
    first: u32,
    position: usize,
    steps: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let (mut token, mut state) = (first, state);
    let (mut drafts, mut logits) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let batch = Batch::single(&[token], position).unwrap();
        let step = assistant
            .draft_step(target, &batch, &state, &[caches])
            .unwrap();
        let row: Vec<f32> = step.logits.to_vec().unwrap();
        token = argmax(&row);
        drafts.push(token);
        logits.push(row);
        state = step.state;
    }
    (drafts, logits)
}

#[test]
fn a_round_matches_transformers_with_either_head() {
    let target = target();
    let model = target.model.as_ref();
    let reference = reference();
    let (caches, state) = prefilled(model, &reference.prompt);
    let position = reference.prompt.len();
    let steps = reference.chain_tokens.len();
    let vocab = reference.chain_logits.len() / steps;

    let ordered = nn::load::load_assistant(
        &fixture("gemma4_assistant"),
        model,
        &target.config_json,
        Dtype::F32,
    )
    .unwrap();
    let (drafts, logits) = round(
        ordered.as_ref(),
        model,
        &caches,
        state.clone(),
        reference.first,
        position,
        steps,
    );
    assert_eq!(drafts, reference.chain_tokens);
    for (step, row) in logits.iter().enumerate() {
        assert_close(
            row,
            &reference.chain_logits[step * vocab..(step + 1) * vocab],
            &format!("ordered head, step {step}"),
        );
    }

    // The plain tied head on the same weights, fed the same drafts.
    let plain = assistant(&target, |c| c["use_ordered_embeddings"] = false.into()).unwrap();
    let mut token = reference.first;
    let mut state = state;
    for step in 0..steps {
        let batch = Batch::single(&[token], position).unwrap();
        let out = plain
            .draft_step(model, &batch, &state, &[caches.as_slice()])
            .unwrap();
        assert_close(
            &out.logits.to_vec::<f32>().unwrap(),
            &reference.plain_logits[step * vocab..(step + 1) * vocab],
            &format!("plain head, step {step}"),
        );
        token = reference.chain_tokens[step];
        state = out.state;
    }
}

/// Two sequences drafting together, at different positions over their own caches, each
/// give what they give alone (to the parity tolerance).
#[test]
fn rows_drafted_together_match_each_alone() {
    let target = target();
    let model = target.model.as_ref();
    let assistant = assistant(&target, |_| {}).unwrap();
    let reference = reference();
    let prompts = [&reference.prompt[..], &reference.prompt[..5]];
    let alone: Vec<(Vec<Option<LayerCache>>, Array, Vec<f32>)> = prompts
        .iter()
        .map(|prompt| {
            let (caches, state) = prefilled(model, prompt);
            let batch = Batch::single(&[reference.first], prompt.len()).unwrap();
            let logits = assistant
                .draft_step(model, &batch, &state, &[caches.as_slice()])
                .unwrap()
                .logits
                .to_vec()
                .unwrap();
            (caches, state, logits)
        })
        .collect();
    let batch = Batch::rows(&[
        (&[reference.first][..], prompts[0].len()),
        (&[reference.first][..], prompts[1].len()),
    ])
    .unwrap();
    let states = mlx::concatenate(&[alone[0].1.clone(), alone[1].1.clone()], 0).unwrap();
    let out = assistant
        .draft_step(
            model,
            &batch,
            &states,
            &[alone[0].0.as_slice(), alone[1].0.as_slice()],
        )
        .unwrap();
    let together: Vec<f32> = out.logits.to_vec().unwrap();
    let vocab = together.len() / 2;
    assert_close(&together[..vocab], &alone[0].2, "row 0 in a batch");
    assert_close(&together[vocab..], &alone[1].2, "row 1 in a batch");
}

#[test]
fn an_assistant_that_does_not_fit_its_target_is_refused_by_what_differs() {
    let target = target();
    // What the assistant's config is changed to (a JSON pointer and its new value), and what
    // the refusal must say.
    let cases = [
        ("/backbone_hidden_size", 96, "`hidden_size` of 96"),
        (
            "/text_config/vocab_size",
            600,
            "scores 600 tokens and the target 512",
        ),
        (
            "/text_config/per_layer_config/1/head_dim",
            64,
            "read 2 key/value heads of width 64",
        ),
        (
            "/text_config/sliding_window",
            16,
            "sliding window is 16 tokens; the target's is 8",
        ),
        (
            "/text_config/num_kv_shared_layers",
            1,
            "`num_kv_shared_layers` must be its 2 layers",
        ),
    ];
    for (pointer, value, expected) in cases {
        let mut config = config("gemma4_assistant");
        *config.pointer_mut(pointer).unwrap() = value.into();
        let mut weights = assistant_weights(&[], |_, a| a);
        let error = Gemma4Assistant::new(
            &config,
            &mut weights,
            target.model.as_ref(),
            &target.config_json,
        )
        .err()
        .unwrap_or_else(|| panic!("accepted: {expected}"))
        .to_string();
        assert!(error.contains(expected), "{expected}: {error}");
    }

    // A target of another family.
    let llama = nn::load::load(&fixture("llama"), Some(Dtype::F32)).unwrap();
    let error = nn::load::load_assistant(
        &fixture("gemma4_assistant"),
        llama.model.as_ref(),
        &llama.config_json,
        Dtype::F32,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(error.contains("Gemma 4 models, not `llama`"), "{error}");
    // The same checks from the configs alone, as `create` runs them.
    let mut misfit = config("gemma4_assistant");
    misfit["backbone_hidden_size"] = 96.into();
    let error = nn::arch::gemma4_assistant::check_fit(&misfit, &target.config_json)
        .unwrap_err()
        .to_string();
    assert!(error.contains("`hidden_size` of 96"), "{error}");
    nn::arch::gemma4_assistant::check_fit(&config("gemma4_assistant"), &target.config_json)
        .unwrap();
}

#[test]
fn a_token_ordering_that_is_not_a_permutation_is_refused() {
    let target = target();
    let mut weights = assistant_weights(&[], |name, array| {
        if name != "masked_embedding.token_ordering" {
            return array;
        }
        let mut ids: Vec<i64> = array.to_vec().unwrap();
        ids[7] = ids[3];
        Array::from_slice(&ids, &[ids.len() as i32]).unwrap()
    });
    let error = Gemma4Assistant::new(
        &config("gemma4_assistant"),
        &mut weights,
        target.model.as_ref(),
        &target.config_json,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        error.contains("masked_embedding.token_ordering") && error.contains("once"),
        "{error}"
    );
}

#[test]
fn drafting_where_the_targets_cache_does_not_end_is_an_error() {
    let target = target();
    let model = target.model.as_ref();
    let assistant = assistant(&target, |_| {}).unwrap();
    let reference = reference();
    let (caches, state) = prefilled(model, &reference.prompt);
    let batch = Batch::single(&[reference.first], reference.prompt.len() + 3).unwrap();
    let error = assistant
        .draft_step(model, &batch, &state, &[caches.as_slice()])
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("holds 12 positions"), "{error}");
}
