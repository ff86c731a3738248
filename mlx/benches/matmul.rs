//! Matmul throughput on the default device: dense f32, 4-bit quantized matvec, and the shim's
//! packed CPU matvec per instruction set, thread count and activation precision.
//!
//! Run `cargo bench -p mlxkit-mlx`. The dense numbers depend on the BLAS the binary loaded: build once
//! with `MLXKIT_BLAS=reference` (in another target dir) to measure the wheel's reference BLAS.

use mlx::quantized::{Activations, QuantSpec, quantize};
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

/// The packed CPU matvec (`mlx-sys/shim/qmv.cc`) on a `[out, in]` matrix of `bits`-bit groups of
/// 32, for `rows` rows of `x`, with the given kernels, threads and activation precision.
#[allow(clippy::too_many_arguments)]
fn packed_matvec(
    bencher: divan::Bencher,
    shape: (i32, i32, i32),
    rows: i32,
    kernels: mlx::CpuKernels,
    threads: usize,
    activations: Activations,
) {
    packed_matvec_over(bencher, shape, 1, rows, kernels, threads, activations);
}

/// As [`packed_matvec`], each call on the next of `matrices` distinct matrices: with one, the
/// weights stay in cache between calls; with enough, every call reads them from memory.
#[allow(clippy::too_many_arguments)]
fn packed_matvec_over(
    bencher: divan::Bencher,
    (out, inp, bits): (i32, i32, i32),
    matrices: u64,
    rows: i32,
    kernels: mlx::CpuKernels,
    threads: usize,
    activations: Activations,
) {
    let matrices: Vec<_> = (0..matrices)
        .map(|i| {
            let w = random_matrix(out, inp, 5 + 100 * i);
            let q = quantize(&w, QuantSpec::affine(32, bits)).expect("quantize");
            mlx::eval([&q.weights, &q.scales]).expect("eval");
            q
        })
        .collect();
    let x = random_matrix(rows, inp, 6);
    let before = (mlx::cpu_kernels(), mlx::cpu_threads());
    mlx::set_cpu_kernels(kernels);
    mlx::set_cpu_threads(threads);
    let mut next = 0;
    bencher.bench_local(|| {
        let q = &matrices[next % matrices.len()];
        next += 1;
        let y = q.matmul_with(&x, true, activations).expect("qmm");
        y.eval().expect("eval");
    });
    mlx::set_cpu_kernels(before.0);
    mlx::set_cpu_threads(before.1);
}

/// SmolLM2's MLP up projection: 0.66 MB with its scales and biases, in L2 between calls.
const MLP: (i32, i32, i32) = (1536, 576, 4);
/// SmolLM2's tied output head, 8-bit: 35 MB with its scales and biases, streamed from memory
/// every call.
const HEAD: (i32, i32, i32) = (49152, 576, 8);

#[divan::bench(args = [1, 8], sample_count = 200)]
fn packed_4bit_576x1536_best_one_thread(bencher: divan::Bencher, rows: i32) {
    packed_matvec(
        bencher,
        MLP,
        rows,
        mlx::CpuKernels::Avx512,
        1,
        Activations::F32,
    );
}

#[divan::bench(args = [1, 8], sample_count = 200)]
fn packed_4bit_576x1536_avx2_one_thread(bencher: divan::Bencher, rows: i32) {
    packed_matvec(
        bencher,
        MLP,
        rows,
        mlx::CpuKernels::Avx2,
        1,
        Activations::F32,
    );
}

#[divan::bench(args = [1, 8], sample_count = 200)]
fn packed_4bit_576x1536_best_all_threads(bencher: divan::Bencher, rows: i32) {
    packed_matvec(
        bencher,
        MLP,
        rows,
        mlx::CpuKernels::Avx512,
        8,
        Activations::F32,
    );
}

#[divan::bench(args = [1, 8], sample_count = 200)]
fn packed_4bit_576x1536_int8_one_thread(bencher: divan::Bencher, rows: i32) {
    packed_matvec(
        bencher,
        MLP,
        rows,
        mlx::CpuKernels::Avx512,
        1,
        Activations::Int8,
    );
}

#[divan::bench(args = [1, 8], sample_count = 200)]
fn packed_4bit_576x1536_int8_all_threads(bencher: divan::Bencher, rows: i32) {
    packed_matvec(
        bencher,
        MLP,
        rows,
        mlx::CpuKernels::Avx512,
        8,
        Activations::Int8,
    );
}

#[divan::bench(args = [1, 8], sample_count = 20)]
fn packed_8bit_head_576x49152_f32_one_thread(bencher: divan::Bencher, rows: i32) {
    packed_matvec(
        bencher,
        HEAD,
        rows,
        mlx::CpuKernels::Avx512,
        1,
        Activations::F32,
    );
}

#[divan::bench(args = [1, 8], sample_count = 20)]
fn packed_8bit_head_576x49152_int8_one_thread(bencher: divan::Bencher, rows: i32) {
    packed_matvec(
        bencher,
        HEAD,
        rows,
        mlx::CpuKernels::Avx512,
        1,
        Activations::Int8,
    );
}

/// The MLP's product over 96 distinct matrices of its shape (64 MB with their scales and
/// biases), each call taking the next: a decode step's products meet weights that come from
/// memory, where the benches above read one matrix that stays in cache.
///
/// 2026-12-04, one thread, AVX-512, fastest/median a call, two runs: 1 row 131-149/169-173 µs,
/// 8 rows 220-240/279-283 µs; the cached matrix in the same runs 44/52-54 µs and
/// 147-149/163-165 µs. One row from memory reads about 4-5 GB/s, and eight rows cost about that
/// plus their compute, not the larger of the two. Other shapes of the kernel did not change
/// that (measured with eight calls a sample):
/// - bands of 8, 16 or 32 weight rows instead of 128, so that both passes of 4 rows find the
///   band in L1;
/// - prefetching the next band into L2;
/// - one pass of 8 rows (8×2 or 8×3 tiles).
///
/// On that VM one core does not overlap streaming from memory with arithmetic even in a loop
/// of nothing else (`scripts/perf/overlap.c`): memory time and multiply-adds add up there too.
#[divan::bench(args = [1, 8], sample_count = 400)]
fn packed_4bit_576x1536_from_memory_one_thread(bencher: divan::Bencher, rows: i32) {
    packed_matvec_over(
        bencher,
        MLP,
        96,
        rows,
        mlx::CpuKernels::Avx512,
        1,
        Activations::F32,
    );
}

/// `count` distinct `[out, in]` matrices whose values are a k-quant's (Q4_K: 4-bit groups of
/// 32; Q6_K: 8-bit groups of 16 holding `q + 32`), in MLX's affine layout as the GGUF loader
/// gives them, and the same matrices in the k-block form.
fn k_quant_matrices(
    kind: mlx::k_blocks::KQuant,
    (out, inp): (i32, i32),
    count: u64,
) -> Vec<(mlx::Quantized, mlx::k_blocks::KBlocks)> {
    use mlx::k_blocks::{KBlocks, KQuant};
    let (group, bits) = match kind {
        KQuant::Q4K => (32, 4),
        KQuant::Q6K => (16, 8),
    };
    let groups = (out * inp / group) as usize;
    (0..count)
        .map(|i| {
            let mut state = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i + 1);
            let mut next = move || {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 33) as u32
            };
            let words: Vec<u32> = (0..out as usize * inp as usize * bits as usize / 32)
                .map(|_| match kind {
                    KQuant::Q4K => next(),
                    // Values 0..63 in each byte.
                    KQuant::Q6K => next() & 0x3f3f_3f3f,
                })
                .collect();
            // One super-scale per matrix is enough for the kernels: they read the scales the
            // same way whatever their values.
            let d = half::f16::from_f32(1e-3).to_f32();
            let (scales, biases): (Vec<f32>, Vec<f32>) = (0..groups)
                .map(|_| {
                    let sc = (next() % 64) as f32;
                    match kind {
                        KQuant::Q4K => (d * sc, -(d * (next() % 64) as f32)),
                        KQuant::Q6K => (d * (sc - 32.0), -32.0 * (d * (sc - 32.0))),
                    }
                })
                .unzip();
            let per_row = inp / group;
            let q = mlx::Quantized {
                weights: Array::from_slice(&words, &[out, inp * bits / 32]).expect("words"),
                scales: Array::from_slice(&scales, &[out, per_row]).expect("scales"),
                biases: Some(Array::from_slice(&biases, &[out, per_row]).expect("biases")),
                spec: QuantSpec::affine(group, bits),
            };
            let blocks = KBlocks::from_affine(&q)
                .expect("repack")
                .expect("a k-quant's values");
            (q, blocks)
        })
        .collect()
}

/// Llama 3.2 1B's fused gate and up projection (Q4_K in a Q4_K_M file) and its down projection
/// (Q6_K in half its layers), each call on the next of 8 distinct matrices (134 and 34 MB in
/// the affine layout), so that every call streams its weights from memory as a decode step
/// does: MLX's affine layout through the packed kernel against the k-block form, all threads,
/// with f32 activations and (`-int8`) activations rounded to bytes.
#[divan::bench(
    args = ["q4k-affine", "q4k-blocks", "q4k-blocks-int8", "q6k-affine", "q6k-blocks", "q6k-blocks-int8"],
    sample_count = 40
)]
fn k_quant_1b_from_memory(bencher: divan::Bencher, form: &str) {
    use mlx::k_blocks::KQuant;
    let (kind, shape) = if form.starts_with("q4k") {
        (KQuant::Q4K, (16384, 2048))
    } else {
        (KQuant::Q6K, (2048, 8192))
    };
    let matrices = k_quant_matrices(kind, shape, 8);
    let x = random_matrix(1, shape.1, 7);
    let blocks = form.contains("blocks");
    let activations = if form.ends_with("int8") {
        Activations::Int8
    } else {
        Activations::F32
    };
    let mut next = 0;
    bencher.bench_local(|| {
        let (q, k) = &matrices[next % matrices.len()];
        next += 1;
        let y = if blocks {
            k.matmul_with(&x, activations).expect("k-blocks")
        } else {
            q.matmul_with(&x, true, Activations::F32).expect("packed")
        };
        y.eval().expect("eval");
    });
}
