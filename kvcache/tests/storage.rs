//! A storage form (`--kv-cache f16|q8`): writes arrive in the compute dtype and are stored in
//! the cache's own form, handed back as f16 or, from 8-bit codes, as f32; snapshots restore
//! across forms; the form is fixed before the first write.

mod common;

use common::*;
use kvcache::{KvCache, KvStorage, LayerCache, RotatingConfig, RotatingKvCache};
use mlx::{Array, Dtype};

/// `keys`/`values` are f16 and hold exactly tokens `ids` (the test's values are integers below
/// 2048, exact in f16).
fn assert_holds_f16(keys: &Array, values: &Array, ids: &[u32], what: &str) {
    assert_eq!(keys.dtype(), Dtype::F16, "{what}: keys dtype");
    assert_eq!(values.dtype(), Dtype::F16, "{what}: values dtype");
    assert_holds(
        &keys.astype(Dtype::F32).unwrap(),
        &values.astype(Dtype::F32).unwrap(),
        ids,
        what,
    );
}

#[test]
fn an_f16_cache_stores_and_returns_f16() {
    let ids: Vec<u32> = (1..=200).collect();
    let mut cache = KvCache::new();
    cache.set_storage(Dtype::F16).unwrap();
    let (k, v) = kv(&ids[..150]);
    cache.update(&k, &v).unwrap();
    let (k, v) = kv(&ids[150..]);
    let history = cache.update(&k, &v).unwrap();
    assert_holds_f16(&history.keys, &history.values, &ids, "history");
    for state in cache.state_arrays() {
        assert_eq!(state.dtype(), Dtype::F16, "the buffer itself is f16");
    }
}

#[test]
fn snapshots_restore_across_storage_dtypes() {
    let ids: Vec<u32> = (1..=120).collect();
    // An f32 cache's snapshot restored into an f16 cache, and back.
    let mut wide = KvCache::new();
    let (k, v) = kv(&ids);
    wide.update(&k, &v).unwrap();
    let snapshot = wide.snapshot(0..120).unwrap();

    let mut narrow = KvCache::new();
    narrow.set_storage(Dtype::F16).unwrap();
    narrow.restore(&snapshot).unwrap();
    let view = narrow.view().unwrap().unwrap();
    assert_holds_f16(
        &view.keys,
        &view.values,
        &ids,
        "f32 snapshot in an f16 cache",
    );

    let back = narrow.snapshot(0..120).unwrap();
    let mut again = KvCache::new();
    again.set_storage(Dtype::F32).unwrap();
    again.restore(&back).unwrap();
    let view = again.view().unwrap().unwrap();
    assert_holds(
        &view.keys,
        &view.values,
        &ids,
        "f16 snapshot in an f32 cache",
    );
}

#[test]
fn a_rotating_cache_stores_f16_too() {
    let mut cache = RotatingKvCache::new(RotatingConfig {
        window: 16,
        keep: 0,
        rewind_slack: 4,
    })
    .unwrap();
    cache.set_storage(Dtype::F16).unwrap();
    let ids: Vec<u32> = (1..=40).collect();
    for id in &ids {
        let (k, v) = kv(&[*id]);
        let history = cache.update(&k, &v).unwrap();
        assert_eq!(history.keys.dtype(), Dtype::F16);
        assert_eq!(history.values.dtype(), Dtype::F16);
    }
}

#[test]
fn the_storage_dtype_is_set_before_the_first_write_and_is_a_float() {
    let mut cache = KvCache::new();
    let err = cache.set_storage(Dtype::I32).unwrap_err().to_string();
    assert!(err.contains("f32, f16, bf16 or q8"), "{err}");
    let (k, v) = kv(&[1, 2, 3]);
    cache.update(&k, &v).unwrap();
    let err = cache.set_storage(Dtype::F16).unwrap_err().to_string();
    assert!(err.contains("before its first write"), "{err}");

    // Through the layer enum; a recurrent layer keeps its own precision.
    let mut layer = LayerCache::Kv(KvCache::new());
    layer.set_kv_storage(Dtype::F16).unwrap();
    let history = layer.update(&k, &v).unwrap();
    assert_eq!(history.keys.dtype(), Dtype::F16);
}

/// Head dimension of the 8-bit tests: two groups of 32.
const Q8_DIM: i32 = 64;

/// Keys and values `[1, HEADS, len, Q8_DIM]` for tokens `ids`: smooth, signed, different in
/// every token, head and element, and not representable by 8-bit codes.
fn q8_kv(ids: &[u32]) -> (Array, Array) {
    let mut keys = Vec::new();
    for h in 0..HEADS {
        for &id in ids {
            for d in 0..Q8_DIM {
                let x = id as f32 * 0.37 + h as f32 * 1.9 + d as f32 * 0.11;
                keys.push(x.sin() * (1.0 + (d % 7) as f32));
            }
        }
    }
    let values: Vec<f32> = keys.iter().map(|k| 0.5 - k * 0.25).collect();
    let shape = [1, HEADS as i32, ids.len() as i32, Q8_DIM];
    (
        Array::from_slice(&keys, &shape).unwrap(),
        Array::from_slice(&values, &shape).unwrap(),
    )
}

/// Asserts `got` is `exact` to within 8-bit rounding: one code step of each group of 32, the
/// step being the group's range over 255, plus f32 arithmetic (1% of a step). Not half a step:
/// MLX's affine quantization puts the group's largest-magnitude element exactly on a code (so
/// zero stays exact), which shifts the grid and can leave the far end up to a step outside.
fn assert_within_a_code(got: &Array, exact: &Array, what: &str) {
    assert_eq!(got.dtype(), Dtype::F32, "{what}: handed back as f32");
    assert_eq!(got.shape(), exact.shape(), "{what}: shape");
    let (got, exact) = (got.to_vec::<f32>().unwrap(), exact.to_vec::<f32>().unwrap());
    for (group, (g, e)) in got.chunks(32).zip(exact.chunks(32)).enumerate() {
        let lo = e.iter().copied().fold(f32::MAX, f32::min);
        let hi = e.iter().copied().fold(f32::MIN, f32::max);
        let bound = (hi - lo) / 255.0 * 1.01 + 1e-6;
        for (a, b) in g.iter().zip(e) {
            assert!(
                (a - b).abs() <= bound,
                "{what}, group {group}: {b} came back {a}"
            );
        }
    }
}

/// The bits of the f32 keys (`0`) or values (`1`) a history stands for.
fn bits(history: &kvcache::KvHistory, which: usize) -> Vec<u32> {
    let (keys, values) = history.floats().unwrap();
    let array = if which == 0 { keys } else { values };
    array
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

#[test]
fn an_8_bit_cache_stores_codes_and_hands_back_f32_within_a_code() {
    let ids: Vec<u32> = (1..=300).collect();
    let mut cache = KvCache::new();
    cache.set_storage(KvStorage::Q8).unwrap();
    let (k, v) = q8_kv(&ids[..270]);
    cache.update(&k, &v).unwrap();
    let (k, v) = q8_kv(&ids[270..]);
    let history = cache.update(&k, &v).unwrap();
    assert_eq!(
        history.keys.dtype(),
        Dtype::U8,
        "the history is handed over as stored"
    );
    let (k, v) = q8_kv(&ids);
    let (keys, values) = history.floats().unwrap();
    assert_within_a_code(&keys, &k, "keys");
    assert_within_a_code(&values, &v, "values");
    for state in cache.state_arrays() {
        assert_eq!(state.dtype(), Dtype::U8, "the buffer holds bytes");
        assert_eq!(state.shape()[3], Q8_DIM * 5 / 4, "codes, scales and biases");
    }
    // An owned snapshot costs 1.25 bytes an element: 64 codes and 2 x 2 f32 a row.
    let snapshot = cache.snapshot(0..300).unwrap();
    snapshot.materialize().unwrap();
    assert_eq!(snapshot.bytes(), 2 * HEADS * 300 * 80);
}

#[test]
fn an_8_bit_history_is_the_same_however_it_was_written() {
    // Rows are quantized one token at a time, so the history of a logical sequence does not
    // depend on chunking, rewinds or restores: compared bit for bit with one write of it all.
    let ids: Vec<u32> = (1..=100).collect();
    let mut whole = KvCache::new();
    whole.set_storage(KvStorage::Q8).unwrap();
    let (k, v) = q8_kv(&ids);
    let expected = whole.update(&k, &v).unwrap();

    let mut pieces = KvCache::new();
    pieces.set_storage(KvStorage::Q8).unwrap();
    let (k, v) = q8_kv(&ids[..60]);
    pieces.update(&k, &v).unwrap();
    let kept = pieces.snapshot(40..60).unwrap();
    pieces.rewind(40).unwrap();
    let junk: Vec<u32> = (500..530).collect();
    let (k, v) = q8_kv(&junk);
    pieces.update(&k, &v).unwrap();
    assert!(!kept.is_lazy(), "the junk write copied the snapshot out");
    pieces.rewind(40).unwrap();
    pieces.restore(&kept).unwrap();
    let mut history = None;
    for id in &ids[60..] {
        let (k, v) = q8_kv(&[*id]);
        history = Some(pieces.update(&k, &v).unwrap());
    }
    let history = history.unwrap();
    assert_eq!(bits(&history, 0), bits(&expected, 0), "keys");
    assert_eq!(bits(&history, 1), bits(&expected, 1), "values");

    // The snapshot's bytes restore into another 8-bit cache unchanged, and into an f32 cache
    // as the floats they stand for.
    let all = pieces.snapshot(0..100).unwrap();
    let mut other = KvCache::new();
    other.set_storage(KvStorage::Q8).unwrap();
    other.restore(&all).unwrap();
    let view = other.view().unwrap().unwrap();
    assert_eq!(bits(&view, 0), bits(&expected, 0), "into an 8-bit cache");
    let mut wide = KvCache::new();
    wide.restore(&all).unwrap();
    let view = wide.view().unwrap().unwrap();
    assert_eq!(bits(&view, 1), bits(&expected, 1), "into an f32 cache");
}

#[test]
fn an_8_bit_rotating_cache_matches_a_float_one_within_a_code() {
    let config = RotatingConfig {
        window: 16,
        keep: 2,
        rewind_slack: 4,
    };
    let mut narrow = RotatingKvCache::new(config).unwrap();
    narrow.set_storage(KvStorage::Q8).unwrap();
    let mut wide = RotatingKvCache::new(config).unwrap();
    // A prefill chunk, then decode steps past the wrap, then a rewind and a second chunk.
    let steps: Vec<Vec<u32>> = std::iter::once((1..=10).collect())
        .chain((11..=40).map(|id| vec![id]))
        .chain(std::iter::once((38..=45).collect()))
        .collect();
    for (i, ids) in steps.iter().enumerate() {
        if i == steps.len() - 1 {
            narrow.rewind(37).unwrap();
            wide.rewind(37).unwrap();
        }
        let (k, v) = q8_kv(ids);
        let got = narrow.update(&k, &v).unwrap();
        let exact = wide.update(&k, &v).unwrap();
        let (keys, values) = got.floats().unwrap();
        assert_within_a_code(&keys, &exact.keys, &format!("step {i} keys"));
        assert_within_a_code(&values, &exact.values, &format!("step {i} values"));
    }
    for state in narrow.state_arrays() {
        assert_eq!(state.dtype(), Dtype::U8);
    }
}
