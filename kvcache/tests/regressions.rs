//! Named scenarios for the bugs upstream shipped in this code, and shrunk property-test
//! counterexamples.

mod common;

use common::*;
use kvcache::{
    AttentionMaskOwned, KvCache, LayerCache, LogicalMask, RecurrentCache, RotatingConfig,
    RotatingKvCache,
};

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

/// A drafter reading the target's caches (Gemma 4's assistant) sees the last positions it
/// asks for: through a prefill past the window, decode steps and a rewind, a rotating cache
/// shows its window's worth and, from its rewind slack, one position more; a full cache shows
/// all. A position a rewind's writes overwrote is refused, and an empty cache has no view.
#[test]
fn views_show_the_last_positions_asked_for() {
    let window = 4;
    let config = RotatingConfig {
        window,
        keep: 0,
        rewind_slack: 3,
    };
    let mut caches = [
        LayerCache::Rotating(RotatingKvCache::new(config).unwrap()),
        LayerCache::Kv(KvCache::new()),
    ];
    for cache in &mut caches {
        assert!(cache.view(window).unwrap().is_none());
        // Position p holds token p + 1.
        let (k, v) = kv(&(1..=11).collect::<Vec<u32>>());
        cache.update(&k, &v).unwrap();
        for id in [12, 13] {
            let (k, v) = kv(&[id]);
            cache.update(&k, &v).unwrap();
        }
        cache.rewind(12).unwrap();
    }
    let visible = |cache: &LayerCache, window| -> Vec<u32> {
        let view = cache.view(window).unwrap().unwrap();
        let ids: Vec<u32> = view
            .keys
            .to_vec::<f32>()
            .unwrap()
            .chunks(DIM)
            .take(view.keys.dim(2).unwrap() as usize)
            .map(|key| (key[0] as usize / (HEADS * DIM)) as u32)
            .collect();
        let allowed = match view.mask.attention_mask(1, LogicalMask::Causal).unwrap() {
            AttentionMaskOwned::None | AttentionMaskOwned::Causal => vec![true; ids.len()],
            AttentionMaskOwned::Array(mask) => mask.to_bools().unwrap(),
        };
        let mut seen: Vec<u32> = ids
            .into_iter()
            .zip(allowed)
            .filter_map(|(id, allowed)| allowed.then_some(id))
            .collect();
        seen.sort_unstable();
        seen
    };
    assert_eq!(visible(&caches[0], window), vec![9, 10, 11, 12]);
    assert_eq!(visible(&caches[0], window + 1), vec![8, 9, 10, 11, 12]);
    assert_eq!(visible(&caches[1], window), (1..=12).collect::<Vec<u32>>());

    // Three drafts (as many as the slack) written and taken back overwrite the slots of
    // positions 5..=7: the window is still whole, one position more is not. A drafter that
    // reads one past the window needs a slack one deeper than its rounds.
    let rotating = &mut caches[0];
    let (k, v) = kv(&[20, 21, 22]);
    rotating.update(&k, &v).unwrap();
    rotating.rewind(12).unwrap();
    assert_eq!(visible(rotating, window), vec![9, 10, 11, 12]);
    let error = rotating.view(window + 1).unwrap_err().to_string();
    assert!(error.contains("needs 7"), "{error}");

    let recurrent = LayerCache::Recurrent(RecurrentCache::new(RECURRENT).unwrap());
    assert!(recurrent.view(window).is_err());
}
