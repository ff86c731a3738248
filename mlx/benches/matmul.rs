//! Matmul throughput on the default device: dense f32, 4-bit quantized matvec, and the shim's
//! packed CPU matvec per instruction set and thread count.
//!
//! Run `cargo bench -p mlx`. The dense numbers depend on the BLAS the binary loaded: build once
//! with `MLXKIT_NO_OPENBLAS=1` (in another target dir) to measure the wheel's reference BLAS.

use mlx::quantized::{QuantSpec, quantize};
use mlx::{Array, Dtype, random};

fn main() {
    divan::main();
}

fn random_matrix(rows: i32, cols: i32, seed: u64) -> Array {
    let key = random::key(seed).expect("key");
    let m = random::uniform(&[rows, cols], Dtype::F32, &key).expect("uniform");
    m.eval().expect("eval");
    m
}

#[divan::bench(sample_count = 10)]
fn dense_f32_4096x4096(bencher: divan::Bencher) {
    let a = random_matrix(4096, 4096, 1);
    let b = random_matrix(4096, 4096, 2);
    bencher.bench_local(|| {
        let c = a.matmul(&b).expect("matmul");
        c.eval().expect("eval");
    });
}

#[divan::bench(args = [Dtype::F32, Dtype::Bf16], sample_count = 20)]
fn quantized_4bit_1x4096_by_4096x4096(bencher: divan::Bencher, activations: Dtype) {
    let w = random_matrix(4096, 4096, 3)
        .astype(activations)
        .expect("astype");
    let q = quantize(&w, QuantSpec::affine(64, 4)).expect("quantize");
    mlx::eval([&q.weights, &q.scales]).expect("eval");
    let x = random_matrix(1, 4096, 4)
        .astype(activations)
        .expect("astype");
    x.eval().expect("eval");
    bencher.bench_local(|| {
        let y = q.matmul(&x, true).expect("qmm");
        y.eval().expect("eval");
    });
}

/// The packed CPU matvec (`mlx-sys/shim/qmv.cc`) on a SmolLM2 MLP shape, 4-bit groups of 32,
/// for one decode row and a batch of 8, with the CPU's best kernels and with AVX2 (on one
/// thread and on all).
fn packed_matvec(bencher: divan::Bencher, rows: i32, kernels: mlx::CpuKernels, threads: usize) {
    let w = random_matrix(1536, 576, 5);
    let q = quantize(&w, QuantSpec::affine(32, 4)).expect("quantize");
    mlx::eval([&q.weights, &q.scales]).expect("eval");
    let x = random_matrix(rows, 576, 6);
    let before = (mlx::cpu_kernels(), mlx::cpu_threads());
    mlx::set_cpu_kernels(kernels);
    mlx::set_cpu_threads(threads);
    bencher.bench_local(|| {
        let y = q.matmul(&x, true).expect("qmm");
        y.eval().expect("eval");
    });
    mlx::set_cpu_kernels(before.0);
    mlx::set_cpu_threads(before.1);
}

#[divan::bench(args = [1, 8], sample_count = 200)]
fn packed_4bit_576x1536_best_one_thread(bencher: divan::Bencher, rows: i32) {
    packed_matvec(bencher, rows, mlx::CpuKernels::Avx512, 1);
}

#[divan::bench(args = [1, 8], sample_count = 200)]
fn packed_4bit_576x1536_avx2_one_thread(bencher: divan::Bencher, rows: i32) {
    packed_matvec(bencher, rows, mlx::CpuKernels::Avx2, 1);
}

#[divan::bench(args = [1, 8], sample_count = 200)]
fn packed_4bit_576x1536_best_all_threads(bencher: divan::Bencher, rows: i32) {
    packed_matvec(bencher, rows, mlx::CpuKernels::Avx512, 8);
}
