//! Host-side references for the op tests: deterministic data and f64 loops.
#![allow(dead_code)]

use mlx::Array;

/// Deterministic pseudo-random values in [-1, 1) (a 64-bit LCG; no dependency, stable forever).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

pub fn array(shape: &[i32], seed: u64) -> (Vec<f32>, Array) {
    let n: i32 = shape.iter().product();
    let data = values(n as usize, seed);
    let a = Array::from_slice(&data, shape).unwrap();
    (data, a)
}

pub fn assert_close(actual: &[f32], expected: &[f64], tol: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        let err = (*a as f64 - e).abs();
        assert!(
            err <= tol,
            "{what}: element {i}: got {a}, expected {e} (error {err:e} > {tol:e})"
        );
    }
}

/// The transpose of a row-major `[rows, cols]` matrix.
pub fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols)
        .flat_map(|c| (0..rows).map(move |r| m[r * cols + c]))
        .collect()
}

/// Row-major `[m, k] @ [k, n]` in f64.
pub fn matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f64;
            for p in 0..k {
                acc += a[i * k + p] as f64 * b[p * n + j] as f64;
            }
            out[i * n + j] = acc;
        }
    }
    out
}

/// Softmax of each row of length `n`, in f64.
pub fn softmax_rows(x: &[f64], n: usize) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|row| {
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let exps: Vec<f64> = row.iter().map(|v| (v - max).exp()).collect();
            let sum: f64 = exps.iter().sum();
            exps.into_iter().map(move |e| e / sum)
        })
        .collect()
}

/// Held by tests that switch the shim's CPU kernels or thread count, or that compare results
/// bit for bit (which a switch halfway through would break).
pub static KERNELS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `test` once with each instruction set of the shim's kernels this CPU has (portable,
/// AVX2, AVX-512), holding [`KERNELS`], and restores the kernels in use before.
pub fn each_kernel_level(mut test: impl FnMut(mlx::CpuKernels)) {
    let _serial = KERNELS.lock().unwrap_or_else(|e| e.into_inner());
    let before = mlx::cpu_kernels();
    let mut seen = Vec::new();
    for level in [
        mlx::CpuKernels::Portable,
        mlx::CpuKernels::Avx2,
        mlx::CpuKernels::Avx512,
    ] {
        let in_effect = mlx::set_cpu_kernels(level);
        if seen.contains(&in_effect) {
            continue;
        }
        seen.push(in_effect);
        eprintln!("kernels: {in_effect:?}");
        test(in_effect);
    }
    mlx::set_cpu_kernels(before);
}
