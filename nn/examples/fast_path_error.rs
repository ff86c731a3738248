//! What an optional fast path costs in accuracy on a real model: 8-bit activations in the
//! packed decode kernel (`int8`), a half-precision KV cache (`f16-kv`) or an 8-bit one
//! (`q8-kv`).
//!
//! ```sh
//! cargo run --release -p mlxkit-nn --example fast_path_error -- MODEL.gguf int8|f16-kv|q8-kv [STEPS] [PROMPT]
//! ```
//!
//! Decodes `STEPS` greedy tokens after a fixed prompt of `PROMPT` tokens on the default path
//! (f32 activations, f32 cache), then feeds the very same tokens through the fast path (teacher
//! forcing, so both see one context), and prints per step the largest logit difference, the
//! largest difference among the reference's top-5 log-probabilities, and whether the argmax
//! changed.

use kvcache::KvStorage;
use mlx::quantized::{Activations, set_packed_activations};
use mlx::{Array, Dtype};
use nn::{Batch, Model};

const USAGE: &str = "usage: fast_path_error MODEL.gguf int8|f16-kv|q8-kv [STEPS] [PROMPT]";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or(USAGE)?;
    let mode = args.get(2).ok_or(USAGE)?.as_str();
    let steps: usize = args.get(3).map_or(Ok(32), |s| s.parse())?;
    let prompt_len: usize = args.get(4).map_or(Ok(24), |s| s.parse())?;
    let loaded = nn::load::load(std::path::Path::new(path), Some(Dtype::F32))?;
    let model = loaded.model.as_ref();
    let prompt: Vec<u32> = (0..prompt_len)
        .map(|i| 100 + (i * 37 % 3000) as u32)
        .collect();

    set_packed_activations(Activations::F32);
    let (tokens, reference) = decode(model, &prompt, steps, None, None)?;
    let (_, fast) = match mode {
        "int8" => {
            set_packed_activations(Activations::Int8);
            decode(model, &prompt, steps, Some(&tokens), None)?
        }
        "f16-kv" => decode(
            model,
            &prompt,
            steps,
            Some(&tokens),
            Some(Dtype::F16.into()),
        )?,
        "q8-kv" => decode(model, &prompt, steps, Some(&tokens), Some(KvStorage::Q8))?,
        _ => return Err(USAGE.into()),
    };

    let (mut worst_logit, mut worst_top5, mut flips) = (0f32, 0f32, 0);
    for (step, (r, q)) in reference.iter().zip(&fast).enumerate() {
        let logit = r.iter().zip(q).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        let (lr, lq) = (log_softmax(r), log_softmax(q));
        let mut order: Vec<usize> = (0..r.len()).collect();
        order.sort_by(|&a, &b| r[b].total_cmp(&r[a]));
        let top5 = order[..5]
            .iter()
            .fold(0f32, |m, &i| m.max((lr[i] - lq[i]).abs()));
        let argmax_q = (0..q.len())
            .max_by(|&a, &b| q[a].total_cmp(&q[b]))
            .unwrap_or(0);
        let flipped = argmax_q != order[0];
        flips += usize::from(flipped);
        worst_logit = worst_logit.max(logit);
        worst_top5 = worst_top5.max(top5);
        println!(
            "step {step:3}: max |Δlogit| {logit:.4}, top-5 |Δlogprob| {top5:.4}, top-2 margin \
             {:.4}{}",
            r[order[0]] - r[order[1]],
            if flipped { "  (argmax changed)" } else { "" }
        );
    }
    println!(
        "{steps} steps: max |Δlogit| {worst_logit:.4}, max top-5 |Δlogprob| {worst_top5:.4}, \
         argmax changed at {flips} steps"
    );
    Ok(())
}

/// Greedy decoding (or, with `forced`, feeding those tokens), with caches storing keys and
/// values as `kv_storage`: the tokens and each step's logits.
#[allow(clippy::type_complexity)]
fn decode(
    model: &dyn Model,
    prompt: &[u32],
    steps: usize,
    forced: Option<&[u32]>,
    kv_storage: Option<KvStorage>,
) -> Result<(Vec<u32>, Vec<Vec<f32>>), Box<dyn std::error::Error>> {
    let mut caches = model.new_caches()?;
    if let Some(storage) = kv_storage {
        for cache in caches.iter_mut().flatten() {
            cache.set_kv_storage(storage)?;
        }
    }
    let out = model.forward(&Batch::single(prompt, 0)?, &mut caches)?;
    let hidden = out.hidden.slice_axis(1, -1, prompt.len() as i32)?;
    let mut logits = row(model, &hidden)?;
    let (mut tokens, mut all) = (Vec::new(), Vec::new());
    for step in 0..steps {
        let next = match forced {
            Some(f) => f[step],
            None => (0..logits.len())
                .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                .unwrap_or(0) as u32,
        };
        tokens.push(next);
        all.push(logits);
        let out = model.forward(&Batch::single(&[next], prompt.len() + step)?, &mut caches)?;
        logits = row(model, &out.hidden)?;
    }
    Ok((tokens, all))
}

fn row(model: &dyn Model, hidden: &Array) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    Ok(model
        .unembed(hidden)?
        .astype(Dtype::F32)?
        .reshape(&[-1])?
        .to_vec::<f32>()?)
}

fn log_softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let sum: f32 = x.iter().map(|&v| (v - max).exp()).sum();
    let log_sum = max + sum.ln();
    x.iter().map(|&v| v - log_sum).collect()
}
