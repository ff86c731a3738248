//! Batch invariance on the tiny fixtures: eight sequences of different lengths decoded in one
//! batched forward per step, joining at different steps, each give what they give alone
//! (tolerances in `common`). Gemma 3's fixture has an 8-token sliding window, which every row
//! outgrows.

mod common;

use std::path::Path;

fn model(name: &str) -> Box<dyn nn::Model> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    nn::load::load(&dir, Some(mlx::Dtype::F32)).unwrap().model
}

fn prompts(vocab: u32) -> Vec<Vec<u32>> {
    (0..8u32)
        .map(|r| {
            (0..3 + 5 * r)
                .map(|i| (i * 37 + r * 11 + 1) % vocab)
                .collect()
        })
        .collect()
}

fn check(name: &str) {
    let model = model(name);
    let vocab = model.spec().vocab_size as u32;
    common::check_batch_invariance(model.as_ref(), &prompts(vocab), 24, 2);
}

#[test]
fn llama() {
    check("llama");
}

#[test]
fn gemma3_with_sliding_windows() {
    check("gemma3");
}

#[test]
fn gemma4_with_shared_keys_and_per_layer_inputs() {
    check("gemma4");
}

#[test]
fn gemma4_with_experts() {
    check("gemma4_moe");
}

#[test]
fn qwen3() {
    check("qwen3");
}

#[test]
fn qwen3_moe() {
    check("qwen3_moe");
}
