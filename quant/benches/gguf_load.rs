//! How fast GGUF tensors become MLX tensors: repacking into MLX's affine layout versus
//! dequantizing in Rust, on tensors the size of SmolLM2's and Gemma 3's, and (when the model
//! is in the cache) opening SmolLM2 and loading every tensor.
//!
//! Run: `cargo bench -p mlxkit-quant --bench gguf_load`. MLX work is evaluated inside the timed
//! region, so lazy graphs cannot hide the cost.

use divan::Bencher;
use quant::{Checkpoint, GgmlType, Tensor};

fn main() {
    divan::main();
}

/// Deterministic block bytes with small finite f16 scales at the given offsets.
fn blocks(block_bytes: usize, count: usize, f16_offsets: &[usize]) -> Vec<u8> {
    let mut state = 0x1234_5678_9abc_def0u64;
    let mut out = Vec::with_capacity(block_bytes * count);
    for _ in 0..count {
        let start = out.len();
        for _ in 0..block_bytes {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            out.push(state as u8);
        }
        for &at in f16_offsets {
            // 0x2000 ≈ 0.0078: a typical weight scale.
            out[start + at..start + at + 2].copy_from_slice(&0x2000u16.to_le_bytes());
        }
    }
    out
}

fn evaluate(tensor: &Tensor) {
    match tensor {
        Tensor::Dense(a) => a.eval().unwrap(),
        Tensor::Quantized(q) => mlx::eval([&q.weights, &q.scales]).unwrap(),
        Tensor::KBlocks(k) => k.array().eval().unwrap(),
    }
}

/// SmolLM2's MLP matrices: [1536, 576] in Q4_1.
#[divan::bench]
fn repack_q4_1_1536x576(bencher: Bencher) {
    let data = blocks(20, 1536 * 576 / 32, &[0, 2]);
    bencher.bench(|| {
        let t = quant::gguf_tensor("w", GgmlType::Q4_1, &[1536, 576], &data).unwrap();
        evaluate(&t);
    });
}

/// SmolLM2's embedding: [49152, 576] in Q8_0.
#[divan::bench(sample_count = 10)]
fn repack_q8_0_49152x576(bencher: Bencher) {
    let data = blocks(34, 49152 * 576 / 32, &[0]);
    bencher.bench(|| {
        let t = quant::gguf_tensor("w", GgmlType::Q8_0, &[49152, 576], &data).unwrap();
        evaluate(&t);
    });
}

/// Gemma 3's down projections: [640, 2048] in Q4_K (repacked) and Q6_K (dequantized).
#[divan::bench(args = ["Q4_K", "Q6_K"])]
fn k_quant_640x2048(bencher: Bencher, ty: &str) {
    let (ggml_type, data) = match ty {
        "Q4_K" => (GgmlType::Q4K, blocks(144, 640 * 2048 / 256, &[0, 2])),
        _ => (GgmlType::Q6K, blocks(210, 640 * 2048 / 256, &[208])),
    };
    bencher.bench(|| {
        let t = quant::gguf_tensor("w", ggml_type, &[640, 2048], &data).unwrap();
        evaluate(&t);
    });
}

/// Opening the real SmolLM2 GGUF and loading every tensor, if a test has fetched it.
#[divan::bench(sample_count = 5)]
fn smollm2_open_and_load_all(bencher: Bencher) {
    let Some(path) = quant::package::default_cache_dir().and_then(|dir| {
        let entry = quant::package::find("smollm2:135m")?;
        let path = quant::package::cached_path(entry, &dir);
        path.is_file().then_some(path)
    }) else {
        eprintln!("smollm2 is not in the cache; run the real_models test first");
        return;
    };
    bencher.bench(|| {
        let checkpoint = Checkpoint::open(&path).unwrap();
        for name in checkpoint.names() {
            evaluate(&checkpoint.tensor(&name).unwrap());
        }
    });
}

/// The Rust reference dequantization of SmolLM2's embedding, for comparison with repacking.
#[divan::bench(sample_count = 10)]
fn dequantize_q8_0_49152x576(bencher: Bencher) {
    let data = blocks(34, 49152 * 576 / 32, &[0]);
    bencher.bench(|| quant::dequantize("w", GgmlType::Q8_0, &data).unwrap());
}

/// Copying SmolLM2's embedding-sized buffer of u32 words into MLX, the floor for repacking.
#[divan::bench(sample_count = 10)]
fn mlx_copy_in_28m_u8(bencher: Bencher) {
    let words = vec![7u32; 49152 * 576 / 4];
    bencher.bench(|| {
        let a = mlx::Array::from_slice(&words, &[49152, 144]).unwrap();
        a.eval().unwrap();
    });
}
