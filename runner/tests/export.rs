//! `mlxkit export` round trips: `smollm2:135m` exported as a transformers folder (dense f32,
//! and quantized in mlx-lm's layout), imported back into the store, must tokenize like the
//! original and give the original's greedy ids exactly — the weights are the same numbers.
//!
//! The model is fetched through the project's own pull path into the per-user cache. When it
//! cannot be fetched the tests fail loudly under `CI`, and are skipped with a notice otherwise.

use crate::support;

use std::path::PathBuf;
use std::sync::Mutex;

use mlx::{Array, Dtype};
use nn::{Batch, Model};
use runner::export::{ExportOptions, export};
use runner::model_name::ModelName;
use runner::store::Store;

const MODEL: &str = "smollm2:135m";
const PROMPT: &str = "Once upon a time, there was a little";
const GREEDY_TOKENS: usize = 12;

/// The tests share the MLX device; run them one at a time.
static DEVICE: Mutex<()> = Mutex::new(());

/// The folder (or GGUF file) the loader reads for a stored model.
fn weights(store: &Store, name: &ModelName) -> PathBuf {
    let manifest = store.get(name).unwrap().manifest;
    let view = store.materialize(&manifest).unwrap();
    runner::engine::from_store::weights_path(&view, &manifest).unwrap()
}

fn argmax(logits: &Array) -> u32 {
    let len = logits.shape()[1];
    logits
        .slice_axis(1, len - 1, len)
        .unwrap()
        .reshape(&[-1])
        .unwrap()
        .argmax(0, false)
        .unwrap()
        .item::<u32>()
        .unwrap()
}

/// Greedy ids: one prefill, then one token per forward through the caches.
fn greedy(model: &dyn Model, prompt: &[u32]) -> Vec<u32> {
    let mut caches = model.new_caches().unwrap();
    let mut step = |ids: &[u32], position: usize| {
        let out = model
            .forward(&Batch::single(ids, position).unwrap(), &mut caches)
            .unwrap();
        argmax(&model.unembed(&out.hidden).unwrap())
    };
    let mut tokens = vec![step(prompt, 0)];
    while tokens.len() < GREEDY_TOKENS {
        let position = prompt.len() + tokens.len() - 1;
        let last = tokens[tokens.len() - 1];
        tokens.push(step(&[last], position));
    }
    tokens
}

fn round_trip(quantized: bool) {
    let _device = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    let home = tempfile::tempdir().unwrap();
    let Some(store) = support::store_with(home.path(), MODEL) else {
        return;
    };
    let original = ModelName::parse(MODEL).unwrap();
    let folder = home.path().join("exported");
    let summary = export(
        &store,
        &original,
        &folder,
        ExportOptions {
            dtype: Dtype::F32,
            quantized,
            layers: None,
        },
    )
    .unwrap();
    assert_eq!(summary.quantized > 0, quantized, "{summary:?}");

    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(folder.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["torch_dtype"], "float32");
    assert_eq!(config["model_type"], "llama");
    // SmolLM2's Q4_1 maps one to one onto MLX affine 4-bit in groups of 32.
    if quantized {
        assert_eq!(config["quantization"]["bits"], 4, "{config}");
        assert_eq!(config["quantization"]["group_size"], 32, "{config}");
    } else {
        assert!(config.get("quantization").is_none(), "{config}");
    }

    let copy = ModelName::parse("exported:test").unwrap();
    runner::import::import_path(&store, &copy, &folder, "test", &mut |_, _, _| {}).unwrap();

    let original_path = weights(&store, &original);
    let copy_path = weights(&store, &copy);
    let original_tok = tokenizer::Tokenizer::from_gguf_file(&original_path).unwrap();
    let copy_tok = tokenizer::Tokenizer::from_hf_dir(&copy_path).unwrap();
    let prompt = original_tok.encode(PROMPT, true).unwrap();
    assert_eq!(copy_tok.encode(PROMPT, true).unwrap(), prompt);
    assert_eq!(copy_tok.eos(), original_tok.eos());
    assert_eq!(copy_tok.chat_template(), original_tok.chat_template());

    let a = nn::load::load(&original_path, Some(Dtype::F32)).unwrap();
    let expected = greedy(a.model.as_ref(), &prompt);
    drop(a);
    let b = nn::load::load(&copy_path, Some(Dtype::F32)).unwrap();
    let got = greedy(b.model.as_ref(), &prompt);
    assert_eq!(
        got,
        expected,
        "greedy ids differ: {:?} vs {:?}",
        copy_tok.decode(&got, false),
        original_tok.decode(&expected, false)
    );
}

#[test]
fn dense_f32_export_round_trips() {
    round_trip(false);
}

#[test]
fn quantized_export_round_trips() {
    round_trip(true);
}
