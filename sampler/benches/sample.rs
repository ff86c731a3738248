//! `Sampler::sample` per token on the default device, one slot, at two vocabulary sizes
//! (SmolLM2's 49,152 and Qwen's 151,936): greedy, and with every filter, penalty and logprobs.
//!
//! Run `cargo bench -p mlxkit-sampler`. Each iteration samples and evaluates the token (and the
//! logprobs), so the lazy graph is timed, not just built.
//!
//! Medians on 2026-11-29, commit 35d3053, MLX 0.32.4 CPU wheel, a 2-core shared Intel Xeon VM
//! (other builds running, so the tails are noisy), f32 logits:
//!
//! | bench | 49,152 | 151,936 |
//! |---|---|---|
//! | greedy | 65 µs | 181 µs |
//! | full filter chain | 633 µs | 1.70 ms |
//! | full filter chain + top-5 logprobs | 1.89 ms | 5.29 ms |
//! | top-p alone (full sort) | 16.3 ms | 55.9 ms |
//!
//! The last row is why top-k feeds top-p only its `k` survivors. On this CPU, MLX's argsort
//! of 151,936 floats takes ~35 ms and its logsumexp ~5 ms (the cost of logprobs), while a
//! plain elementwise pass takes ~30 µs.

use mlx::{Array, Dtype, random};
use sampler::{Options, Sampler};

fn main() {
    divan::main();
}

const VOCABS: [i32; 2] = [49_152, 151_936];

fn logits(vocab: i32) -> Array {
    let key = random::key(1).expect("key");
    let logits = random::uniform(&[1, vocab], Dtype::F32, &key)
        .and_then(|u| u.multiply(20.0))
        .expect("logits");
    logits.eval().expect("eval");
    logits
}

fn full_chain() -> Options {
    Options {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.05,
        repeat_last_n: 64,
        repeat_penalty: 1.1,
        presence_penalty: 0.5,
        frequency_penalty: 0.5,
        logit_bias: [(11, 2.0), (13, -5.0)].into(),
        seed: Some(42),
        logprobs: None,
    }
}

fn run(bencher: divan::Bencher, vocab: i32, options: Options) {
    let logits = logits(vocab);
    let history: Vec<u32> = (0..100).map(|i| (i * 37) % 1000).collect();
    let mut sampler = Sampler::new();
    sampler.add(0, options, &history).expect("add");
    bencher.bench_local(|| {
        let sampled = sampler.sample(&[0], &logits).expect("sample");
        let mut outputs = vec![&sampled.tokens];
        if let Some(lp) = &sampled.logprobs {
            outputs.extend([&lp.chosen, &lp.top_ids, &lp.top_logprobs]);
        }
        mlx::eval(outputs).expect("eval");
    });
}

#[divan::bench(args = VOCABS, sample_count = 50)]
fn greedy(bencher: divan::Bencher, vocab: i32) {
    run(bencher, vocab, Options::greedy());
}

#[divan::bench(args = VOCABS, sample_count = 50)]
fn full_filter_chain(bencher: divan::Bencher, vocab: i32) {
    run(bencher, vocab, full_chain());
}

#[divan::bench(args = VOCABS, sample_count = 50)]
fn full_filter_chain_with_top5_logprobs(bencher: divan::Bencher, vocab: i32) {
    run(
        bencher,
        vocab,
        Options {
            logprobs: Some(5),
            ..full_chain()
        },
    );
}

#[divan::bench(args = VOCABS, sample_count = 50)]
fn top_p_alone(bencher: divan::Bencher, vocab: i32) {
    run(
        bencher,
        vocab,
        Options {
            top_p: 0.9,
            ..Options::plain(0.8)
        },
    );
}
