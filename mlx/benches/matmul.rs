//! Matmul throughput on the default device: dense f32 and 4-bit quantized matvec.
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
