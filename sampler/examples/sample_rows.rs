//! Sampling a batch: three sequences, each with its own options, decode together; every step
//! turns one `[3, V]` block of logits into three tokens on the device.
//!
//! ```sh
//! cargo run --example sample_rows   # from sampler
//! ```
//!
//! The "model" is a fixed table of logits over an eight-token vocabulary, the same every step,
//! so the differences come from the options alone: greedy always takes the argmax, a seeded
//! temperature draw varies but repeats with its seed, and a logit bias and a frequency penalty
//! steer a greedy row away from the argmax and from tokens it already produced.

use std::collections::BTreeMap;

use mlx::Array;
use sampler::{Options, Sampler};

const VOCAB: usize = 8;
const LOGITS: [f32; VOCAB] = [2.0, 1.8, 1.5, 0.5, 0.0, -1.0, -2.0, -3.0];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rows = [
        ("greedy", Options::greedy()),
        (
            "seeded t=1.0, logprobs",
            Options {
                seed: Some(7),
                logprobs: Some(2),
                ..Options::plain(1.0)
            },
        ),
        (
            "greedy, frequency penalty, token 0 biased",
            Options {
                frequency_penalty: 0.5,
                repeat_last_n: 8,
                logit_bias: BTreeMap::from([(0, -100.0)]),
                ..Options::greedy()
            },
        ),
    ];

    let mut sampler = Sampler::new();
    for (slot, (_, options)) in rows.iter().enumerate() {
        // The prompt's last tokens seed each penalty window; empty here.
        sampler.add(slot, options.clone(), &[])?;
    }
    let slots: Vec<usize> = (0..rows.len()).collect();
    let logits = Array::from_slice(
        &LOGITS.repeat(rows.len()),
        &[rows.len() as i32, VOCAB as i32],
    )?;

    let mut generated = vec![Vec::new(); rows.len()];
    let mut chosen_logprobs = Vec::new();
    for _ in 0..6 {
        let sampled = sampler.sample(&slots, &logits)?;
        // The tokens stay on the device until read; an engine would dispatch the next forward
        // first. Reading here syncs.
        for (row, token) in sampled.tokens.to_vec::<u32>()?.into_iter().enumerate() {
            generated[row].push(token);
        }
        if let Some(logprobs) = &sampled.logprobs {
            chosen_logprobs.push(logprobs.chosen.to_vec::<f32>()?[1]);
        }
    }

    for ((name, _), tokens) in rows.iter().zip(&generated) {
        println!("{name:>40}: {tokens:?}");
    }
    let rounded: Vec<String> = chosen_logprobs.iter().map(|l| format!("{l:.2}")).collect();
    println!(
        "{:>40}: [{}]",
        "row 1's logprobs (of the raw logits)",
        rounded.join(", ")
    );

    // Same seed, same options: the same draws, whatever else shares the batch.
    let mut again = Sampler::new();
    again.add(0, rows[1].1.clone(), &[])?;
    let one_row = Array::from_slice(&LOGITS, &[1, VOCAB as i32])?;
    let mut replay = Vec::new();
    for _ in 0..6 {
        replay.push(again.sample(&[0], &one_row)?.tokens.to_vec::<u32>()?[0]);
    }
    println!(
        "{:>40}: {replay:?} (same as row 1: {})",
        "seed 7 alone",
        replay == generated[1]
    );

    // The penalty window the device keeps for row 2, oldest first.
    println!(
        "{:>40}: {:?}",
        "row 2's penalty window",
        sampler.history(2)?
    );
    Ok(())
}
