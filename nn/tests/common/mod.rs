//! Batch invariance, shared by the tiny-fixture and real-model tests: a sequence decoded in a
//! batch with others gives what it gives alone.

#![allow(dead_code)] // Each test binary uses its own subset.

pub mod precision;

use kvcache::LayerCache;
use mlx::{Array, Dtype};
use nn::{Batch, Model};

/// Greedy tokens must agree up to the first position where the solo run's top-2 logit margin
/// is below this: closer than that, f32 summation order in a batched matrix product may
/// legitimately flip the argmax.
pub const MARGIN: f32 = 1e-3;

/// Largest accepted difference of any log-probability between the batched and the solo run.
/// The rows share matrix products whose summation order may differ from a one-row product by
/// f32 rounding (~1e-6 relative, through the layers); 1e-4 is the bound and two orders
/// above what that rounding produces, while a row reading another row's history or position
/// moves log-probabilities by whole units.
pub const LOGPROB_TOLERANCE: f32 = 1e-4;

struct Row {
    caches: Vec<Option<LayerCache>>,
    len: usize,
    next: u32,
    /// Log-probabilities of every step decoded so far.
    steps: Vec<Vec<f32>>,
    tokens: Vec<u32>,
}

fn log_softmax(logits: &Array) -> Vec<Vec<f32>> {
    let rows = logits.dim(0).unwrap() as usize;
    let values = logits.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
    let vocab = values.len() / rows;
    values
        .chunks(vocab)
        .map(|row| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
            let lse = max + sum.ln();
            row.iter().map(|&v| (v as f64 - lse) as f32).collect()
        })
        .collect()
}

/// The index of the largest logit (the first, on a tie).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

fn top2_margin(row: &[f32]) -> f32 {
    let mut sorted: Vec<f32> = row.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    sorted[0] - sorted.get(1).copied().unwrap_or(f32::NEG_INFINITY)
}

fn last_logits(model: &dyn Model, hidden: &Array) -> Array {
    let last = hidden.slice_axis(1, -1, hidden.dim(1).unwrap()).unwrap();
    model.unembed(&last).unwrap().squeeze(&[1]).unwrap()
}

fn prefilled(model: &dyn Model, prompt: &[u32]) -> Row {
    let mut caches = model.new_caches().unwrap();
    let out = model
        .forward(&Batch::single(prompt, 0).unwrap(), &mut caches)
        .unwrap();
    let lp = log_softmax(&last_logits(model, &out.hidden)).remove(0);
    Row {
        caches,
        len: prompt.len(),
        next: argmax(&lp),
        steps: vec![lp],
        tokens: Vec::new(),
    }
}

/// Decodes each prompt alone, then all together in one batched forward per step, row `r`
/// joining at step `r * join_every` (so the batch's composition and positions change), each
/// for `steps` greedy tokens. Panics where a row's tokens or log-probabilities differ.
pub fn check_batch_invariance(
    model: &dyn Model,
    prompts: &[Vec<u32>],
    steps: usize,
    join_every: usize,
) {
    let solo: Vec<Row> = prompts
        .iter()
        .map(|prompt| {
            let mut row = prefilled(model, prompt);
            for _ in 1..steps {
                let token = row.next;
                let out = model
                    .forward(&Batch::single(&[token], row.len).unwrap(), &mut row.caches)
                    .unwrap();
                row.len += 1;
                row.tokens.push(token);
                let lp = log_softmax(&last_logits(model, &out.hidden)).remove(0);
                row.next = argmax(&lp);
                row.steps.push(lp);
            }
            row
        })
        .collect();

    let mut rows: Vec<Row> = prompts.iter().map(|p| prefilled(model, p)).collect();
    let mut step = 0;
    loop {
        let active: Vec<usize> = (0..rows.len())
            .filter(|&r| step >= r * join_every && rows[r].steps.len() < steps)
            .collect();
        if active.is_empty() {
            if rows.iter().all(|r| r.steps.len() >= steps) {
                break;
            }
            step += 1;
            continue;
        }
        let tokens: Vec<Vec<u32>> = active.iter().map(|&r| vec![rows[r].next]).collect();
        let spec: Vec<(&[u32], usize)> = active
            .iter()
            .zip(&tokens)
            .map(|(&r, t)| (t.as_slice(), rows[r].len))
            .collect();
        let batch = Batch::rows(&spec).unwrap();
        let mut caches: Vec<&mut [Option<LayerCache>]> = rows
            .iter_mut()
            .enumerate()
            .filter(|(r, _)| active.contains(r))
            .map(|(_, row)| row.caches.as_mut_slice())
            .collect();
        let out = model.forward_rows(&batch, &mut caches).unwrap();
        let lps = log_softmax(&last_logits(model, &out.hidden));
        for (&r, lp) in active.iter().zip(lps) {
            let row = &mut rows[r];
            row.tokens.push(row.next);
            row.len += 1;
            row.next = argmax(&lp);
            row.steps.push(lp);
        }
        step += 1;
    }

    for (r, (alone, batched)) in solo.iter().zip(&rows).enumerate() {
        for (s, (a, b)) in alone.steps.iter().zip(&batched.steps).enumerate() {
            let worst = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(
                worst <= LOGPROB_TOLERANCE,
                "row {r}, step {s}: log-probabilities differ by {worst:e} in a batch"
            );
            if top2_margin(a) < MARGIN {
                break; // Past here the argmax may legitimately differ.
            }
            assert_eq!(
                argmax(a),
                argmax(b),
                "row {r}, step {s}: greedy token differs"
            );
        }
    }
}
