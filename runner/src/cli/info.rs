//! `mlxkit info`: what this build runs on.

use std::time::Instant;

use anyhow::Result;

/// The system report: MLX version, device, the distributed backends this MLX build has, the
/// CPU kernel path and a matmul timing.
pub(super) fn info(timing: bool) -> Result<()> {
    use mlx::{Device, Dtype, random};
    let version = mlx::version()?;
    let device = Device::best_available()?;
    device.set_default()?;
    println!("mlxkit {}", env!("CARGO_PKG_VERSION"));
    println!("MLX {version}");
    println!(
        "device: {device:?} (metal: {}, cuda: {})",
        mlx::metal_available()?,
        mlx::cuda_available()?
    );
    let backends: Vec<String> = mlx::distributed::available_backends()?
        .into_iter()
        .map(|b| b.to_string())
        .collect();
    println!("distributed backends: {}", backends.join(", "));
    println!(
        "BLAS: {}; single-row f32 matmul via sgemv: {}",
        mlx::blas_name(),
        mlx::blas_gemv_forwarding()
    );
    // Chosen at run time from this CPU's features, capped by MLXKIT_CPU_KERNELS.
    println!(
        "CPU kernels: {:?}, {} threads, packed-matvec activations {:?}",
        mlx::cpu_kernels(),
        mlx::cpu_threads(),
        mlx::quantized::packed_activations()
    );
    // Per primitive: its vector kernel, a compiled loop, or MLX's own op and why (on a GPU, on
    // the GPU's path asked for by MLXKIT_CPU_PRIMITIVES=off, or with no kernel for this CPU).
    println!("CPU primitives ({}):", std::env::consts::ARCH);
    for (name, path) in mlx::cpu_primitive_paths() {
        println!("  {name:<18} {path}");
    }
    if !timing {
        return Ok(());
    }
    let dtype = if device == Device::Gpu {
        Dtype::Bf16
    } else {
        Dtype::F32
    };
    let n = 2048;
    let a = random::uniform(&[n, n], Dtype::F32, &random::key(0)?)?.astype(dtype)?;
    a.eval()?;
    a.matmul(&a)?.eval()?;
    let runs = 5;
    let start = Instant::now();
    for _ in 0..runs {
        a.matmul(&a)?.eval()?;
    }
    let seconds = start.elapsed().as_secs_f64() / f64::from(runs);
    println!(
        "matmul {n}x{n} {dtype:?}: {:.1} ms, {:.1} GFLOP/s",
        seconds * 1e3,
        2.0 * f64::from(n).powi(3) / seconds / 1e9
    );
    Ok(())
}
