//! A storage dtype (`--kv-cache f16`): writes arrive in the compute dtype and are stored, and
//! handed back, in the cache's own; snapshots restore across the two; the dtype is fixed before
//! the first write.

mod common;

use common::*;
use kvcache::{KvCache, LayerCache, RotatingConfig, RotatingKvCache};
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
    assert!(err.contains("f32, f16 or bf16"), "{err}");
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
