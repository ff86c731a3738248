//! Cost of one decode step's cache work: append one token and attend over the history, at 1k,
//! 8k and 32k cached tokens (batch 1, 8 KV heads, 32 query heads, head dim 128, f32).
//! Every iteration evaluates the attention output, then rewinds so the context stays put.

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
