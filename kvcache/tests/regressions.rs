//! Named scenarios for the bugs upstream shipped in this code, and shrunk property-test
//! counterexamples.

mod common;

use common::*;
use kvcache::{KvCache, LayerCache, RecurrentCache, RotatingConfig, RotatingKvCache};

/// Upstream checked lazy snapshots only on the first append after a rewind, against that
/// append's range. A request reusing a short prefix of a longer cached conversation then
/// prefilled over a snapshot further ahead, and restoring it served the new request's KV.
#[test]
fn lazy_snapshot_ahead_of_a_rewind_survives_later_appends() {
    let old: Vec<u32> = (1..=600).collect();
    let mut cache = KvCache::new();
    let (k, v) = kv(&old);
    cache.update(&k, &v).unwrap();
    let head = cache.snapshot(0..300).unwrap();
    let tail = cache.snapshot(300..600).unwrap();

    // The new request shares 100 tokens, then prefills 400 new ones in chunks: the first chunk
    // after the rewind overlaps only `head`; a later one reaches `tail`.
    cache.rewind(100).unwrap();
    for chunk in 0..4u32 {
        let ids: Vec<u32> = (1000 + chunk * 100..1100 + chunk * 100).collect();
        let (k, v) = kv(&ids);
        cache.update(&k, &v).unwrap();
    }
    assert!(!head.is_lazy() && !tail.is_lazy());
    let (hk, hv) = head.arrays().unwrap();
    assert_holds(&hk, &hv, &old[..300], "head");
    let (tk, tv) = tail.arrays().unwrap();
    assert_holds(&tk, &tv, &old[300..], "tail");

    // Restoring the old conversation reproduces it exactly.
    cache.rewind(0).unwrap();
    cache.restore(&head).unwrap();
    cache.restore(&tail).unwrap();
    let view = cache.view().unwrap().unwrap();
    assert_holds(&view.keys, &view.values, &old, "restored conversation");
}

/// A lazy snapshot whose slots lie above the offset after a rewind is still restored by an
/// offset move when nothing wrote over it.
#[test]
fn untouched_lazy_snapshot_restores_in_place() {
    let ids: Vec<u32> = (1..=40).collect();
    let mut cache = KvCache::new();
    let (k, v) = kv(&ids);
    cache.update(&k, &v).unwrap();
    let ahead = cache.snapshot(20..40).unwrap();
    cache.rewind(20).unwrap();
    cache.restore(&ahead).unwrap();
    assert!(ahead.is_lazy());
    let view = cache.view().unwrap().unwrap();
    assert_holds(&view.keys, &view.values, &ids, "restored");
}

/// Speculative rollback on a rotating cache past its window: per-token captures restore the
/// exact state at each accepted length.
#[test]
fn rotating_speculative_round_rolls_back_through_captures() {
    let config = RotatingConfig {
        window: 4,
        keep: 0,
        rewind_slack: 0,
    };
    let mut cache = RotatingKvCache::new(config).unwrap();
    let prompt: Vec<u32> = (1..=10).collect();
    let (k, v) = kv(&prompt);
    cache.update(&k, &v).unwrap();
    cache.schedule_captures(&[11, 12, 13]).unwrap();
    let round: Vec<u32> = vec![50, 51, 52, 53];
    let (k, v) = kv(&round);
    cache.update(&k, &v).unwrap();
    assert!(
        cache.rewind(12).is_err(),
        "the window has moved past offset 12"
    );
    let captures = cache.take_captures();
    let (at, snapshot) = &captures[1];
    assert_eq!(*at, 12);
    cache.restore(snapshot).unwrap();
    let (hk, hv) = cache.contents().unwrap().unwrap();
    assert_holds(
        &hk,
        &hv,
        &[9, 10, 50, 51],
        "window after accepting one draft",
    );
}

/// A recurrent forward that steps over a scheduled capture is refused, changing nothing.
#[test]
fn recurrent_advance_over_a_capture_is_refused() {
    let mut cache = RecurrentCache::new(RECURRENT).unwrap();
    cache.schedule_captures(&[3]).unwrap();
    assert!(cache.advance(5).is_err());
    assert_eq!(cache.offset(), 0);
    recurrent_forward(&mut cache, &[1, 2, 3, 4, 5]).unwrap();
    let captures = cache.take_captures();
    assert_eq!(captures.len(), 1);
    let oracle = recurrent_oracle(&[1, 2, 3]);
    let (_, snapshot) = &captures[0];
    assert_same_recurrent(
        snapshot.conv_state(),
        snapshot.recurrent_state(),
        &oracle,
        "capture at 3",
    );
}

/// The layer contract refuses snapshots of the wrong kind instead of misreading them.
#[test]
fn restoring_a_snapshot_of_another_kind_fails() {
    let mut kv_layer = LayerCache::Kv(KvCache::new());
    let rec = LayerCache::Recurrent(RecurrentCache::new(RECURRENT).unwrap());
    let snapshot = rec.snapshot(0..0).unwrap();
    assert!(kv_layer.restore(&snapshot).is_err());
}
