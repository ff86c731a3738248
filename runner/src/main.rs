//! `mlxkit`: until the engine and server land, it reports what MLX this build runs on and how
//! fast a matmul is on the default device — the first thing to check on a new machine.

use std::time::Instant;

use anyhow::{Context, Result};
use mlx::{random, Device, Dtype};

fn main() -> Result<()> {
    let version = mlx::version().context("reading the MLX version")?;
    let device = Device::best_available()?;
    device.set_default()?;
    println!("mlxkit {}", env!("CARGO_PKG_VERSION"));
    println!("MLX {version}");
    println!(
        "device: {device:?} (metal: {}, cuda: {})",
        mlx::metal_available()?,
        mlx::cuda_available()?
    );

    // f32 on CPU, where MLX's bf16 kernels are slow; bf16 on a GPU.
    let dtype = if device == Device::Gpu { Dtype::Bf16 } else { Dtype::F32 };
    let n = 2048;
    let key = random::key(0)?;
    let a = random::uniform(&[n, n], Dtype::F32, &key)?.astype(dtype)?;
    a.eval()?;
    a.matmul(&a)?.eval()?; // warm-up
    let runs = 5;
    let start = Instant::now();
    for _ in 0..runs {
        a.matmul(&a)?.eval()?;
    }
    let seconds = start.elapsed().as_secs_f64() / f64::from(runs);
    let gflops = 2.0 * f64::from(n).powi(3) / seconds / 1e9;
    println!(
        "matmul {n}x{n} {dtype:?}: {:.1} ms, {gflops:.1} GFLOP/s",
        seconds * 1e3
    );
    Ok(())
}
