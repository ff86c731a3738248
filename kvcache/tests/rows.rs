//! `update_rows` leaves every row's cache as that row's own `update` would: the same history,
//! buffers, growth, scheduled captures and lazy snapshots, in every storage form, and row by
//! row where the caches are of mixed kinds.

mod common;

use common::*;
use kvcache::{
    KvCache, KvHistory, KvStorage, LayerCache, RotatingConfig, RotatingKvCache, update_rows,
};
use mlx::{Array, Dtype, concatenate};

/// Each row's tokens stacked into one batch `[rows, HEADS, tokens, DIM]` (rows of equal length).
fn batch(rows: &[Vec<u32>]) -> (Array, Array) {
    batch_of(kv, rows)
}

fn batch_of(make: KvOf, rows: &[Vec<u32>]) -> (Array, Array) {
    let (keys, values): (Vec<Array>, Vec<Array>) = rows.iter().map(|ids| make(ids)).unzip();
    (
        concatenate(&keys, 0).unwrap(),
        concatenate(&values, 0).unwrap(),
    )
}

/// Keys and values `[1, HEADS, tokens, dim]` for tokens `ids`.
type KvOf = fn(&[u32]) -> (Array, Array);

/// As `kv` with 32 features a head, the width an 8-bit cache quantizes in groups of.
fn wide_kv(ids: &[u32]) -> (Array, Array) {
    let keys: Vec<f32> = (0..HEADS)
        .flat_map(|h| {
            ids.iter().flat_map(move |&id| {
                (0..32).map(move |d| ((id as f32) * 0.37 + (h * 32 + d) as f32 * 0.11).sin())
            })
        })
        .collect();
    let values: Vec<f32> = keys.iter().map(|k| 0.5 - k * 0.25).collect();
    let shape = [1, HEADS as i32, ids.len() as i32, 32];
    (
        Array::from_slice(&keys, &shape).unwrap(),
        Array::from_slice(&values, &shape).unwrap(),
    )
}

fn floats(history: &KvHistory) -> (Vec<u32>, Vec<u32>) {
    let (k, v) = history.floats().unwrap();
    let bits = |a: Array| -> Vec<u32> {
        a.astype(Dtype::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    (bits(k), bits(v))
}

fn kv_cache(storage: Option<KvStorage>) -> LayerCache {
    let mut cache = KvCache::new();
    if let Some(storage) = storage {
        cache.set_storage(storage).unwrap();
    }
    LayerCache::Kv(cache)
}

/// Runs the same writes through `update_rows` and through each row's own `update`, and
/// compares the histories after every write.
fn compare(make: impl Fn(usize) -> LayerCache, make_kv: KvOf, rows: usize, writes: &[usize]) {
    let mut batched: Vec<LayerCache> = (0..rows).map(&make).collect();
    let mut alone: Vec<LayerCache> = (0..rows).map(&make).collect();
    let mut next = vec![1u32; rows];
    for (step, &tokens) in writes.iter().enumerate() {
        let ids: Vec<Vec<u32>> = (0..rows)
            .map(|r| {
                let start = next[r] + 1000 * r as u32;
                (start..start + tokens as u32).collect()
            })
            .collect();
        for n in &mut next {
            *n += tokens as u32;
        }
        let (keys, values) = batch_of(make_kv, &ids);
        let mut refs: Vec<&mut LayerCache> = batched.iter_mut().collect();
        let together = update_rows(&mut refs, &keys, &values).unwrap();
        for (r, cache) in alone.iter_mut().enumerate() {
            let (k, v) = make_kv(&ids[r]);
            let own = cache.update(&k, &v).unwrap();
            assert_eq!(
                floats(&together[r]),
                floats(&own),
                "write {step}, row {r}: history"
            );
            assert_eq!(
                together[r].mask, own.mask,
                "write {step}, row {r}: mask applier"
            );
            assert_eq!(batched[r].offset(), cache.offset(), "write {step}, row {r}");
        }
    }
}

#[test]
fn rows_written_together_equal_rows_written_alone() {
    // Prefill-sized writes, then decode steps across a growth boundary (256 slots).
    let writes = [250, 3, 1, 1, 1, 1, 1, 1];
    compare(|_| kv_cache(None), kv, 3, &writes);
    compare(
        |_| kv_cache(Some(KvStorage::Float(Dtype::F16))),
        kv,
        2,
        &writes,
    );
    compare(|_| kv_cache(Some(KvStorage::Q8)), wide_kv, 2, &[40, 1, 1]);
}

#[test]
fn sliding_windows_written_together_equal_windows_written_alone() {
    // Decode steps (one token, written together) past the window's wrap, between prompt
    // chunks (row by row), with and without kept positions and rewind slack.
    let writes = [5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 1, 1, 1, 1, 1];
    for (window, keep, rewind_slack) in [(8, 0, 0), (6, 2, 0), (5, 0, 3)] {
        let config = RotatingConfig {
            window,
            keep,
            rewind_slack,
        };
        compare(
            |_| LayerCache::Rotating(RotatingKvCache::new(config).unwrap()),
            kv,
            3,
            &writes,
        );
    }
    let config = RotatingConfig {
        window: 8,
        keep: 0,
        rewind_slack: 0,
    };
    compare(
        |_| {
            let mut cache = RotatingKvCache::new(config).unwrap();
            cache.set_storage(KvStorage::Q8).unwrap();
            LayerCache::Rotating(cache)
        },
        wide_kv,
        2,
        &[3, 1, 1, 1, 1, 1, 1, 1, 1],
    );
}

#[test]
fn caches_of_other_kinds_go_row_by_row() {
    let config = RotatingConfig {
        window: 8,
        keep: 0,
        rewind_slack: 0,
    };
    compare(
        |r| {
            if r == 1 {
                LayerCache::Rotating(RotatingKvCache::new(config).unwrap())
            } else {
                kv_cache(None)
            }
        },
        kv,
        3,
        &[5, 1, 1, 4, 1],
    );
    // Storage that differs between rows.
    compare(
        |r| kv_cache((r == 0).then_some(KvStorage::Float(Dtype::F16))),
        kv,
        2,
        &[5, 1],
    );
}

#[test]
fn snapshots_and_captures_survive_a_batched_write() {
    let mut caches = [kv_cache(None), kv_cache(None)];
    let (k, v) = batch(&[(1..=6).collect(), (101..=106).collect()]);
    update_rows(&mut caches.iter_mut().collect::<Vec<_>>(), &k, &v).unwrap();
    // A lazy snapshot of slots 3..6 of row 0, then a rewind to 3 and a batched write over it:
    // the snapshot must be copied out first and keep tokens 4..=6.
    let LayerCache::Kv(row0) = &mut caches[0] else {
        unreachable!()
    };
    let snapshot = row0.snapshot(3..6).unwrap();
    row0.rewind(3).unwrap();
    row0.schedule_captures(&[5]).unwrap();
    let LayerCache::Kv(row1) = &mut caches[1] else {
        unreachable!()
    };
    row1.rewind(3).unwrap();
    let (k, v) = batch(&[(50..=52).collect(), (150..=152).collect()]);
    let histories = update_rows(&mut caches.iter_mut().collect::<Vec<_>>(), &k, &v).unwrap();
    assert!(
        !snapshot.is_lazy(),
        "the write over its slots copied it out"
    );
    let (sk, sv) = snapshot.arrays().unwrap();
    assert_holds(&sk, &sv, &[4, 5, 6], "the snapshot after the write");
    assert_holds(
        &histories[0].keys,
        &histories[0].values,
        &[1, 2, 3, 50, 51, 52],
        "row 0",
    );
    assert_holds(
        &histories[1].keys,
        &histories[1].values,
        &[101, 102, 103, 150, 151, 152],
        "row 1",
    );
    let LayerCache::Kv(row0) = &mut caches[0] else {
        unreachable!()
    };
    let captures = row0.take_captures();
    assert_eq!(captures.len(), 1, "the capture at 5 was crossed");
    let (at, capture) = &captures[0];
    assert_eq!(*at, 5);
    let (ck, cv) = capture.arrays().unwrap();
    assert_holds(&ck, &cv, &[50, 51], "the capture");
}

#[test]
fn a_batch_that_does_not_match_its_caches_is_an_error() {
    let mut caches = [kv_cache(None), kv_cache(None)];
    let (k, v) = kv(&[1, 2]);
    let mut refs: Vec<&mut LayerCache> = caches.iter_mut().collect();
    assert!(
        update_rows(&mut refs, &k, &v).is_err(),
        "one row for two caches"
    );
    let (k, v) = batch(&[vec![1], vec![2]]);
    update_rows(&mut refs, &k, &v).unwrap();
    let wide = Array::zeros(&[2, HEADS as i32, 1, 2 * DIM as i32], Dtype::F32).unwrap();
    assert!(
        update_rows(&mut refs, &wide, &wide).is_err(),
        "a head size the caches do not hold"
    );
    let (k, v) = batch(&[vec![3], vec![4]]);
    let histories = update_rows(&mut refs, &k, &v).unwrap();
    assert_holds(
        &histories[0].keys,
        &histories[0].values,
        &[1, 3],
        "row 0 after the error",
    );
    assert_holds(
        &histories[1].keys,
        &histories[1].values,
        &[2, 4],
        "row 1 after the error",
    );
}
