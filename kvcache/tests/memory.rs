//! `bytes()` agrees with MLX's active memory, and dropping snapshots returns it to baseline.
//! One test in this binary: active memory is process-wide.

mod common;

use kvcache::{KvCache, RecurrentCache, RotatingConfig, RotatingKvCache};
use mlx::{Array, Dtype, memory};

fn active() -> usize {
    memory::active_memory().unwrap()
}

fn filled(tokens: i32, value: f32) -> Array {
    Array::full(&[1, 8, tokens, 64], value, Dtype::F32).unwrap()
}

/// Appends and evaluates, dropping the history so only the cache's buffer stays. Keys and
/// values differ: MLX lets a slice update covering a whole buffer share the update's buffer.
fn append(cache: &mut KvCache, tokens: i32, value: f32) {
    let keys = filled(tokens, value);
    let values = filled(tokens, -value);
    let history = cache.update(&keys, &values).unwrap();
    mlx::eval([&history.keys, &history.values]).unwrap();
}

#[test]
fn snapshot_bytes_match_active_memory() {
    // Warm MLX's lazily created state so the baseline is stable.
    {
        let mut warm = KvCache::new();
        append(&mut warm, 4, 1.0);
        let s = warm.snapshot(0..2).unwrap();
        warm.rewind(0).unwrap();
        append(&mut warm, 4, 2.0);
        drop(s);
    }
    memory::clear_cache().unwrap();
    let baseline = active();
    let per_token = 2 * 8 * 64 * 4; // keys and values, f32

    // A lazy snapshot owns nothing.
    let mut cache = KvCache::new();
    append(&mut cache, 500, 1.0);
    let with_cache = active();
    assert_eq!(
        with_cache - baseline,
        512 * per_token,
        "the buffer is 512 slots"
    );
    let lazy = cache.snapshot(0..500).unwrap();
    let ahead = cache.snapshot(300..400).unwrap();
    assert_eq!((lazy.bytes(), ahead.bytes()), (0, 0));
    assert_eq!(active(), with_cache);

    // A write over them copies them out: the delta is exactly what they now report.
    cache.rewind(0).unwrap();
    append(&mut cache, 100, 2.0);
    assert!(
        !lazy.is_lazy() && ahead.is_lazy(),
        "only the overlapped snapshot is copied"
    );
    assert_eq!(lazy.bytes(), 500 * per_token);
    assert_eq!(active() - with_cache, lazy.bytes());

    // Split and merge of owned snapshots own exactly their parts.
    let (head, tail) = lazy.split(200).unwrap();
    assert_eq!(head.bytes() + tail.bytes(), 500 * per_token);
    assert_eq!(active() - with_cache, head.bytes() + tail.bytes());
    let merged = head.merge(tail).unwrap();
    assert_eq!(active() - with_cache, merged.bytes());
    drop(merged);
    assert_eq!(active(), with_cache);

    // Dropping the cache copies out what is still lazy.
    drop(cache);
    assert_eq!(ahead.bytes(), 100 * per_token);
    assert_eq!(active() - baseline, ahead.bytes());
    drop(ahead);
    assert_eq!(active(), baseline);

    // Rotating snapshots are copies of the held window.
    let config = RotatingConfig {
        window: 64,
        keep: 4,
        rewind_slack: 0,
    };
    let mut rotating = RotatingKvCache::new(config).unwrap();
    let (k, v) = (filled(100, 3.0), filled(100, -3.0));
    drop(rotating.update(&k, &v).unwrap());
    // A prefill's history is the gathered window, not the ring: evaluate the cache's own state.
    mlx::eval(&rotating.state_arrays()).unwrap();
    drop((k, v));
    let with_rotating = active();
    let window = rotating.snapshot(100..100).unwrap();
    mlx::eval([&window.arrays().unwrap().0, &window.arrays().unwrap().1]).unwrap();
    assert_eq!(window.bytes(), 68 * per_token);
    assert_eq!(active() - with_rotating, window.bytes());
    drop(window);
    assert_eq!(active(), with_rotating);
    drop(rotating);
    assert_eq!(active(), baseline);

    // A recurrent capture owns its compacted conv tail, not the forward-sized window it was
    // cut from.
    let mut recurrent = RecurrentCache::new(common::RECURRENT).unwrap();
    recurrent.schedule_captures(&[1000]).unwrap();
    let big = Array::full(&[1, 1000 + 3, 2], 1.0, Dtype::F32).unwrap();
    big.eval().unwrap();
    let tail = big.slice_axis(1, 1000, 1003).unwrap();
    let state = Array::full(&[1, 2, 2, 3], 1.0, Dtype::F32).unwrap();
    state.eval().unwrap();
    recurrent.set_conv_state(&tail).unwrap();
    recurrent.set_recurrent_state(&state).unwrap();
    recurrent.advance(1000).unwrap();
    let (_, capture) = recurrent.take_captures().pop().unwrap();
    mlx::eval([capture.conv_state().unwrap()]).unwrap();
    drop((big, tail, state, recurrent));
    assert_eq!(capture.bytes(), (3 * 2 + 2 * 2 * 3) * 4);
    assert_eq!(active() - baseline, capture.bytes());
    drop(capture);
    assert_eq!(active(), baseline);
}
