//! Where a batched decode step's time goes: building the graph on the host against evaluating
//! it, for 1 row and for B rows, alternating, on one model file.
//!
//! ```sh
//! cargo run --release -p mlxkit-nn --example decode_step -- MODEL.gguf [ROWS] [PROMPT] [STEPS]
//! ```
//!
//! Each round runs with one kernel thread and with all of them ([`mlx::set_cpu_threads`]). It
//! prefills `ROWS` fresh sequences of `PROMPT` tokens (the same text, one token
//! changed per row), then times `STEPS` greedy decode steps of one row and of all rows. The
//! step here is synchronous (build, then evaluate), unlike the engine's pipelined loop, so the
//! two parts can be told apart.

use std::time::{Duration, Instant};

use mlx::{Array, Dtype};
use nn::{Batch, Model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: decode_step MODEL.gguf [ROWS] [PROMPT] [STEPS]")?;
    let rows: usize = args.get(2).map_or(Ok(8), |s| s.parse())?;
    let prompt: usize = args.get(3).map_or(Ok(128), |s| s.parse())?;
    let steps: usize = args.get(4).map_or(Ok(32), |s| s.parse())?;
    let loaded = nn::load::load(std::path::Path::new(path), Some(Dtype::F32))?;
    let model = loaded.model.as_ref();
    let most = mlx::cpu_threads();
    let thread_counts: Vec<usize> = if most > 1 { vec![1, most] } else { vec![1] };
    for round in 0..3 {
        for &threads in &thread_counts {
            mlx::set_cpu_threads(threads);
            for &batch in &[1, rows] {
                let (build, total) = time_steps(model, batch, prompt, steps)?;
                println!(
                    "round {round} threads {threads} rows {batch:2}: step {:7.2} ms \
                     (graph build {:6.2} ms), {:6.1} tok/s",
                    ms(total) / steps as f64,
                    ms(build) / steps as f64,
                    (batch * steps) as f64 / total.as_secs_f64()
                );
            }
        }
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Prefills `rows` sequences and times `steps` decode steps over them: (graph build, total).
fn time_steps(
    model: &dyn Model,
    rows: usize,
    prompt: usize,
    steps: usize,
) -> Result<(Duration, Duration), Box<dyn std::error::Error>> {
    let mut caches: Vec<_> = (0..rows)
        .map(|_| model.new_caches())
        .collect::<Result<_, _>>()?;
    let mut last = Vec::with_capacity(rows);
    for (r, set) in caches.iter_mut().enumerate() {
        let ids: Vec<u32> = (0..prompt)
            .map(|i| 100 + ((i * 7 + if i == 0 { r } else { 0 }) % 5000) as u32)
            .collect();
        let out = model.forward(&Batch::single(&ids, 0)?, set)?;
        let logits = model.unembed(&out.hidden.slice_axis(1, -1, prompt as i32)?)?;
        last.push(logits.reshape(&[1, -1])?.argmax(-1, false)?);
    }
    let mut tokens = mlx::concatenate(&last, 0)?;
    tokens.eval()?;
    let (mut build, mut total) = (Duration::ZERO, Duration::ZERO);
    for step in 0..steps {
        let start = Instant::now();
        let batch = Batch::from_device(
            &tokens.reshape(&[rows as i32, 1])?,
            vec![prompt + step; rows],
        )?;
        let mut sets: Vec<&mut [Option<kvcache::LayerCache>]> =
            caches.iter_mut().map(|c| c.as_mut_slice()).collect();
        let out = model.forward_rows(&batch, &mut sets)?;
        let logits = model.unembed(&out.hidden)?.astype(Dtype::F32)?;
        let next: Array = logits.reshape(&[rows as i32, -1])?.argmax(-1, false)?;
        let built = Instant::now();
        next.eval()?;
        build += built - start;
        total += start.elapsed();
        tokens = next;
    }
    Ok((build, total))
}
