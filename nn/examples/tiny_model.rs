//! Loading a model and running it: a prompt prefilled in one forward, its logits checked
//! against the reference transformers computed for the same weights, then a few greedy decode
//! steps through the model's KV caches.
//!
//! ```sh
//! cargo run --example tiny_model   # from nn
//! ```
//!
//! The model is the crate's own test fixture `tests/fixtures/llama`: a two-layer Llama with
//! random weights (64 hidden, 512-token vocabulary), written by transformers together with its
//! logits for a fixed prompt. Its tokens are bare ids: there is no tokenizer. A real checkpoint
//! directory or GGUF file loads the same way.

use std::path::Path;

use mlx::{Array, Dtype};
use nn::Batch;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama");
    let loaded = nn::load::load(&fixture, Some(Dtype::F32))?;
    let model = loaded.model.as_ref();
    let spec = model.spec();
    println!(
        "loaded {} ({:?}) in {:.0?}: {} layers, vocabulary {}, {} parameters, {:?}",
        spec.model_type,
        loaded.format,
        loaded.duration,
        spec.num_layers(),
        spec.vocab_size,
        loaded.parameters,
        loaded.dtype
    );

    // The prompt and transformers' logits for it, saved beside the weights.
    let golden: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture.join("golden.json"))?)?;
    let prompt: Vec<u32> = golden["prompt_ids"]
        .as_array()
        .ok_or("golden.json has no prompt_ids")?
        .iter()
        .filter_map(|id| id.as_u64().map(|id| id as u32))
        .collect();
    let reference = mlx::load_safetensors(&fixture.join("logits.safetensors"))?
        .into_iter()
        .find_map(|(name, array)| (name == "logits").then_some(array))
        .ok_or("logits.safetensors has no logits")?;

    // Prefill: the whole prompt in one forward, filling a fresh cache per layer.
    let mut caches = model.new_caches()?;
    let forward = model.forward(&Batch::single(&prompt, 0)?, &mut caches)?;
    let logits = model.unembed(&forward.hidden)?.squeeze(&[0])?; // [tokens, vocab]
    let error = logits
        .subtract(&reference)?
        .abs()?
        .reshape(&[-1])?
        .max(&[0], false)?;
    let ours = logits.argmax(-1, false)?.to_vec::<u32>()?;
    let theirs: Vec<u32> = golden["argmax_ids"]
        .as_array()
        .ok_or("golden.json has no argmax_ids")?
        .iter()
        .filter_map(|id| id.as_u64().map(|id| id as u32))
        .collect();
    let agree = ours.iter().zip(&theirs).filter(|(a, b)| a == b).count();
    println!(
        "prefill of {} tokens: max |logit - transformers| = {:.1e}, argmax agrees at {agree}/{} positions",
        prompt.len(),
        error.item::<f32>()?,
        theirs.len()
    );

    // Decode: one token per forward, each appended to the caches at the next position.
    let mut next = *ours.last().ok_or("empty prompt")?;
    let mut generated = vec![next];
    for position in prompt.len()..prompt.len() + 7 {
        let forward = model.forward(&Batch::single(&[next], position)?, &mut caches)?;
        let logits: Array = model.unembed(&forward.hidden)?;
        next = logits.reshape(&[-1])?.argmax(0, false)?.item::<u32>()?;
        generated.push(next);
    }
    println!("greedy continuation: {generated:?}");
    Ok(())
}
