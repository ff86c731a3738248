//! The packed CPU matvec with f32 against 8-bit activations, alternating, on SmolLM2's shapes.
//!
//! ```sh
//! cargo run --release -p mlxkit-mlx --example activations -- [ROUNDS]
//! ```
//!
//! Each round times every (shape, rows, threads) case once per precision, back to back, as the
//! fastest of 30 calls; the ratio of the two is taken within the round, so a machine that
//! speeds up or slows down between rounds (a shared VM) moves both sides alike. Prints the
//! median of the per-round ratios (> 1: int8 faster).

use std::time::{Duration, Instant};

use mlx::quantized::{Activations, QuantSpec, Quantized, quantize};
use mlx::{Array, Dtype, random};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::args().nth(1).map_or(Ok(7), |s| s.parse())?;
    let shapes = [
        ("mlp 4-bit 1536x576", 1536, 576, 4),
        ("head 8-bit 49152x576", 49152, 576, 8),
    ];
    let most = mlx::cpu_threads();
    for (name, out, inp, bits) in shapes {
        let key = random::key(1)?;
        let w = random::uniform(&[out, inp], Dtype::F32, &key)?;
        let q = quantize(&w, QuantSpec::affine(32, bits))?;
        mlx::eval([&q.weights, &q.scales])?;
        for rows in [1, 8] {
            let x = random::uniform(&[rows, inp], Dtype::F32, &random::key(2)?)?;
            x.eval()?;
            for threads in [1, most] {
                mlx::set_cpu_threads(threads);
                let mut ratios = Vec::new();
                let (mut best_f32, mut best_int8) = (Duration::MAX, Duration::MAX);
                for _ in 0..rounds {
                    let f = fastest(&q, &x, Activations::F32)?;
                    let i = fastest(&q, &x, Activations::Int8)?;
                    best_f32 = best_f32.min(f);
                    best_int8 = best_int8.min(i);
                    ratios.push(f.as_secs_f64() / i.as_secs_f64());
                }
                ratios.sort_by(f64::total_cmp);
                println!(
                    "{name}, {rows} rows, {threads} threads: f32 {:8.1} µs, int8 {:8.1} µs \
                     (fastest), int8 speed-up {:.2}x (median of {rounds} rounds, {:.2}–{:.2})",
                    best_f32.as_secs_f64() * 1e6,
                    best_int8.as_secs_f64() * 1e6,
                    ratios[rounds / 2],
                    ratios[0],
                    ratios[rounds - 1]
                );
            }
        }
    }
    Ok(())
}

fn fastest(q: &Quantized, x: &Array, activations: Activations) -> mlx::Result<Duration> {
    let mut best = Duration::MAX;
    for _ in 0..30 {
        let start = Instant::now();
        q.matmul_with(x, true, activations)?.eval()?;
        best = best.min(start.elapsed());
    }
    Ok(best)
}
