//! Attention through the caches equals attention computed directly: for sliding windows
//! smaller than, equal to and larger than the prefill chunk, over prefill chunks, decode steps
//! and multi-token (speculative) rounds.

use kvcache::{KvCache, LogicalMask, RotatingConfig, RotatingKvCache};
use mlx::fast::{AttentionMask, scaled_dot_product_attention};
use mlx::{Array, Dtype, concatenate, random};

const KV_HEADS: i32 = 2;
const Q_HEADS: i32 = 4;
const DIM: i32 = 8;
const CHUNK: usize = 8;

fn normal(shape: &[i32], seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::uniform(shape, Dtype::F32, &key)
        .unwrap()
        .subtract(0.5)
        .unwrap()
}

/// Direct attention of `n` queries (the last `n` of `total` positions) over every position,
/// masked to `p <= q` and, when given, `p < keep || p > q - window`.
fn direct(q: &Array, k: &Array, v: &Array, window: Option<(usize, usize)>) -> Vec<f32> {
    let n = q.dim(2).unwrap() as usize;
    let total = k.dim(2).unwrap() as usize;
    let mut mask = Vec::with_capacity(n * total);
    for i in 0..n {
        let qp = total - n + i;
        for p in 0..total {
            let in_window = window.is_none_or(|(w, keep)| p < keep || p + w > qp);
            mask.push(p <= qp && in_window);
        }
    }
    let mask = Array::from_bools(&mask, &[n as i32, total as i32]).unwrap();
    scaled_dot_product_attention(q, k, v, 0.5, AttentionMask::Array(&mask))
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
}

fn assert_close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() < 1e-5, "{what}: element {i}: {x} vs {y}");
    }
}

/// Steps of new tokens: two prefill chunks, decode steps, a speculative round, more decode.
const STEPS: [usize; 9] = [CHUNK, CHUNK, 1, 1, 1, 4, 1, 3, 1];

fn check_rotating(config: RotatingConfig) {
    let mut cache = RotatingKvCache::new(config).unwrap();
    let mut all_k: Option<Array> = None;
    let mut all_v: Option<Array> = None;
    for (step, &n) in STEPS.iter().enumerate() {
        let seed = step as u64 * 3;
        let k = normal(&[1, KV_HEADS, n as i32, DIM], seed);
        let v = normal(&[1, KV_HEADS, n as i32, DIM], seed + 1);
        let q = normal(&[1, Q_HEADS, n as i32, DIM], seed + 2);
        all_k = Some(match all_k {
            Some(a) => concatenate(&[a, k.clone()], 2).unwrap(),
            None => k.clone(),
        });
        all_v = Some(match all_v {
            Some(a) => concatenate(&[a, v.clone()], 2).unwrap(),
            None => v.clone(),
        });
        let history = cache.update(&k, &v).unwrap();
        let mask = history.mask.attention_mask(n, LogicalMask::Causal).unwrap();
        let got =
            scaled_dot_product_attention(&q, &history.keys, &history.values, 0.5, mask.as_mask())
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
        let want = direct(
            &q,
            all_k.as_ref().unwrap(),
            all_v.as_ref().unwrap(),
            Some((config.window, config.keep)),
        );
        assert_close(&got, &want, &format!("{config:?} step {step} ({n} tokens)"));
    }
}

#[test]
fn window_smaller_than_the_chunk() {
    check_rotating(RotatingConfig {
        window: 3,
        keep: 0,
        rewind_slack: 0,
    });
    check_rotating(RotatingConfig {
        window: 5,
        keep: 2,
        rewind_slack: 0,
    });
    check_rotating(RotatingConfig {
        window: 3,
        keep: 0,
        rewind_slack: 2,
    });
}

#[test]
fn window_equal_to_the_chunk() {
    check_rotating(RotatingConfig {
        window: CHUNK,
        keep: 0,
        rewind_slack: 0,
    });
    check_rotating(RotatingConfig {
        window: CHUNK,
        keep: 1,
        rewind_slack: 3,
    });
}

#[test]
fn window_larger_than_the_chunk() {
    check_rotating(RotatingConfig {
        window: 13,
        keep: 0,
        rewind_slack: 0,
    });
    check_rotating(RotatingConfig {
        window: 40,
        keep: 0,
        rewind_slack: 0,
    });
    check_rotating(RotatingConfig {
        window: 13,
        keep: 3,
        rewind_slack: 1,
    });
}

/// A local layer over a full cache (Gemma 3 style) masks like the rotating cache.
#[test]
fn logical_window_over_a_full_cache() {
    for window in [3, CHUNK, 13] {
        let mut cache = KvCache::new();
        let mut all: Vec<(Array, Array)> = Vec::new();
        for (step, &n) in STEPS.iter().enumerate() {
            let seed = 100 + step as u64 * 3;
            let k = normal(&[1, KV_HEADS, n as i32, DIM], seed);
            let v = normal(&[1, KV_HEADS, n as i32, DIM], seed + 1);
            let q = normal(&[1, Q_HEADS, n as i32, DIM], seed + 2);
            all.push((k.clone(), v.clone()));
            let history = cache.update(&k, &v).unwrap();
            let mask = history
                .mask
                .attention_mask(n, LogicalMask::SlidingWindow(window))
                .unwrap();
            let got = scaled_dot_product_attention(
                &q,
                &history.keys,
                &history.values,
                0.5,
                mask.as_mask(),
            )
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
            let ks: Vec<Array> = all.iter().map(|(k, _)| k.clone()).collect();
            let vs: Vec<Array> = all.iter().map(|(_, v)| v.clone()).collect();
            let want = direct(
                &q,
                &concatenate(&ks, 2).unwrap(),
                &concatenate(&vs, 2).unwrap(),
                Some((window, 0)),
            );
            assert_close(&got, &want, &format!("window {window} step {step}"));
        }
    }
}

/// A full cache under a causal mask: the fast paths give what direct attention gives.
#[test]
fn full_cache_causal_matches_direct() {
    let mut cache = KvCache::new();
    let mut ks = Vec::new();
    let mut vs = Vec::new();
    for (step, &n) in STEPS.iter().enumerate() {
        let seed = 200 + step as u64 * 3;
        let k = normal(&[1, KV_HEADS, n as i32, DIM], seed);
        let v = normal(&[1, KV_HEADS, n as i32, DIM], seed + 1);
        let q = normal(&[1, Q_HEADS, n as i32, DIM], seed + 2);
        ks.push(k.clone());
        vs.push(v.clone());
        let history = cache.update(&k, &v).unwrap();
        let mask = history.mask.attention_mask(n, LogicalMask::Causal).unwrap();
        assert!(
            !matches!(mask, kvcache::AttentionMaskOwned::Array(_)),
            "fast path expected"
        );
        let got =
            scaled_dot_product_attention(&q, &history.keys, &history.values, 0.5, mask.as_mask())
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
        let want = direct(
            &q,
            &concatenate(&ks, 2).unwrap(),
            &concatenate(&vs, 2).unwrap(),
            None,
        );
        assert_close(&got, &want, &format!("step {step}"));
    }
}
