//! Cost of one decode step's cache work: append one token and attend over the history, at 1k,
//! 8k and 32k cached tokens (batch 1, 8 KV heads, 32 query heads, head dim 128, f32).
//! Every iteration evaluates the attention output, then rewinds so the context stays put.
//!
//! Medians, 2026-11-29, commit 4f9c19c + this file, MLX 0.32.4 CPU wheel, a shared 2-core
//! Linux VM under load (average 8), f32:
//!
//! | context | kv append only | kv append + attend | attend, no cache (contiguous) | rotating W=4096 |
//! |---|---|---|---|---|
//! | 1k  | 12 µs | 3.9 ms | 2.8 ms | 1.9 ms |
//! | 8k  | 10 µs | 135 ms | 110 ms | 47 ms |
//! | 32k | 21 µs | 691 ms | 744 ms | 29 ms |
//!
//! The append is an in-place slice update (constant in the context); the step is dominated by
//! MLX's CPU attention, which costs about the same over the cache's strided history as over a
//! contiguous copy.

use divan::Bencher;
use kvcache::{KvCache, LogicalMask, RotatingConfig, RotatingKvCache};
use mlx::fast::scaled_dot_product_attention;
use mlx::{Array, Dtype, random};

const KV_HEADS: i32 = 8;
const Q_HEADS: i32 = 32;
const HEAD_DIM: i32 = 128;

fn main() {
    divan::main();
}

fn noise(tokens: i32, heads: i32, seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::uniform(&[1, heads, tokens, HEAD_DIM], Dtype::F32, &key).unwrap()
}

fn filled_kv(context: usize) -> KvCache {
    let mut cache = KvCache::new();
    let mut left = context;
    while left > 0 {
        let n = left.min(2048) as i32;
        let x = noise(n, KV_HEADS, left as u64);
        let h = cache.update(&x, &x).unwrap();
        mlx::eval([&h.keys, &h.values]).unwrap();
        left -= n as usize;
    }
    cache
}

#[divan::bench(args = [1024, 8192, 32768], sample_count = 20, sample_size = 1)]
fn kv_append_and_attend(bencher: Bencher, context: usize) {
    let mut cache = filled_kv(context);
    let k = noise(1, KV_HEADS, 1);
    let q = noise(1, Q_HEADS, 2);
    mlx::eval([&k, &q]).unwrap();
    bencher.bench_local(|| {
        let h = cache.update(&k, &k).unwrap();
        let mask = h.mask.attention_mask(1, LogicalMask::Causal).unwrap();
        let out =
            scaled_dot_product_attention(&q, &h.keys, &h.values, 0.088, mask.as_mask()).unwrap();
        out.eval().unwrap();
        drop((out, h));
        cache.rewind(context).unwrap();
    });
}

/// The append alone: one slice update of the buffer, evaluated.
#[divan::bench(args = [1024, 8192, 32768], sample_count = 20, sample_size = 1)]
fn kv_append_only(bencher: Bencher, context: usize) {
    let mut cache = filled_kv(context);
    let k = noise(1, KV_HEADS, 1);
    k.eval().unwrap();
    bencher.bench_local(|| {
        drop(cache.update(&k, &k).unwrap());
        mlx::eval(&cache.state_arrays()).unwrap();
        cache.rewind(context).unwrap();
    });
}

/// Baseline without a cache: attention of one query over contiguous keys of the same length.
#[divan::bench(args = [1024, 8192, 32768], sample_count = 20, sample_size = 1)]
fn attend_contiguous_baseline(bencher: Bencher, context: usize) {
    let k = noise(context as i32 + 1, KV_HEADS, 3);
    let q = noise(1, Q_HEADS, 2);
    mlx::eval([&k, &q]).unwrap();
    bencher.bench_local(|| {
        let out = scaled_dot_product_attention(&q, &k, &k, 0.088, mlx::fast::AttentionMask::None)
            .unwrap();
        out.eval().unwrap();
    });
}

#[divan::bench(args = [1024, 8192, 32768], sample_count = 20, sample_size = 1)]
fn rotating_4k_window_append_and_attend(bencher: Bencher, context: usize) {
    let config = RotatingConfig {
        window: 4096,
        keep: 0,
        rewind_slack: 0,
    };
    let mut cache = RotatingKvCache::new(config).unwrap();
    let mut left = context;
    while left > 0 {
        let n = left.min(2048) as i32;
        let x = noise(n, KV_HEADS, left as u64);
        let h = cache.update(&x, &x).unwrap();
        mlx::eval([&h.keys, &h.values]).unwrap();
        left -= n as usize;
    }
    let k = noise(1, KV_HEADS, 1);
    let q = noise(1, Q_HEADS, 2);
    mlx::eval([&k, &q]).unwrap();
    // A rotating cache past its window cannot rewind; each iteration writes the next position
    // instead, which is what decode does.
    bencher.bench_local(|| {
        let h = cache.update(&k, &k).unwrap();
        let mask = h.mask.attention_mask(1, LogicalMask::Causal).unwrap();
        let out =
            scaled_dot_product_attention(&q, &h.keys, &h.values, 0.088, mask.as_mask()).unwrap();
        out.eval().unwrap();
    });
}
