//! The caches under the real prefix trie: random requests sharing prefixes go through begin,
//! restore, prefill with scheduled captures, close with page-out, and eviction. After every
//! restore each layer holds exactly what a fresh cache fed the restored prefix holds.

mod common;

use common::*;
use kvcache::{
    KvCache, LayerCache, LayerSnapshot, RecurrentCache, RotatingConfig, RotatingKvCache,
};
use prefix_trie::{Capture, Config, LayerRestore, Lookahead, PrefixTrie, Prompt, SchedulePolicy};
use proptest::prelude::*;

const WINDOW: RotatingConfig = RotatingConfig {
    window: 4,
    keep: 1,
    rewind_slack: 0,
};

fn new_caches() -> Vec<LayerCache> {
    vec![
        LayerCache::Kv(KvCache::new()),
        LayerCache::Rotating(RotatingKvCache::new(WINDOW).unwrap()),
        LayerCache::Recurrent(RecurrentCache::new(RECURRENT).unwrap()),
    ]
}

fn feed(cache: &mut LayerCache, ids: &[u32]) {
    match cache {
        LayerCache::Recurrent(c) => recurrent_forward(c, ids).unwrap(),
        cache => {
            let (k, v) = kv(ids);
            cache.update(&k, &v).unwrap();
        }
    }
}

/// Each layer equals a fresh one fed `history`.
fn assert_matches(caches: &[LayerCache], history: &[u32], what: &str) {
    for cache in caches {
        assert_eq!(
            cache.offset(),
            history.len(),
            "{what}: offset of {:?}",
            cache.kind()
        );
        match cache {
            LayerCache::Kv(c) => {
                if let Some(h) = c.view().unwrap() {
                    assert_holds(&h.keys, &h.values, history, what);
                }
            }
            LayerCache::Rotating(c) => {
                if let Some((k, v)) = c.contents().unwrap() {
                    let keep = WINDOW.keep.min(history.len());
                    let start = keep.max(history.len().saturating_sub(WINDOW.window));
                    assert_holds(
                        &k,
                        &v,
                        &[&history[..keep], &history[start..]].concat(),
                        what,
                    );
                }
            }
            LayerCache::Recurrent(c) => {
                let oracle = recurrent_oracle(history);
                assert_same_recurrent(c.conv_state(), c.recurrent_state(), &oracle, what);
            }
        }
    }
}

fn run_request(
    trie: &mut PrefixTrie<LayerSnapshot>,
    caches: &mut Vec<LayerCache>,
    prompt_ids: &[u32],
    generated: &[u32],
    budget: usize,
) {
    let prompt = Prompt::new(prompt_ids, &[], Lookahead::None).unwrap();
    let begin = trie.begin(&prompt, &[]).unwrap();
    let restore_at = begin.restore_at;
    for (layer, plan) in trie
        .restore_plan(begin.session)
        .unwrap()
        .into_iter()
        .enumerate()
    {
        let cache = &mut caches[layer];
        match plan {
            LayerRestore::Stateless => unreachable!("no stateless layers here"),
            LayerRestore::Empty => *cache = new_caches().swap_remove(layer),
            LayerRestore::Range(snapshots) => {
                cache.rewind(0).unwrap();
                for s in snapshots {
                    cache.restore(s).unwrap();
                }
            }
            LayerRestore::Point(s) => cache.restore(s).unwrap(),
        }
    }
    assert_matches(caches, &prompt_ids[..restore_at], "after restore");

    for cache in caches.iter_mut() {
        cache.schedule_captures(&begin.capture_at).unwrap();
    }
    let rest = &prompt_ids[restore_at..];
    for chunk in rest.chunks(5) {
        for cache in caches.iter_mut() {
            feed(cache, chunk);
        }
    }
    let mut captures = Vec::new();
    for (layer, cache) in caches.iter_mut().enumerate() {
        for (_, snapshot) in cache.take_captures() {
            captures.push(Capture { layer, snapshot });
        }
    }
    for &id in generated {
        for cache in caches.iter_mut() {
            feed(cache, &[id]);
        }
    }
    let all: Vec<u32> = [prompt_ids, generated].concat();
    assert_matches(caches, &all, "after generation");
    let recorded = Prompt::new(&all, &[], Lookahead::None).unwrap();
    let caches_ref = &*caches;
    trie.close(
        begin.session,
        recorded.keys(),
        all.len(),
        captures,
        |layer, coverage| caches_ref[layer].snapshot_coverage(&coverage),
    )
    .unwrap();
    trie.evict(budget).unwrap();
}

/// A request: continue conversation `base` (one recorded before) after `cut` of its tokens with
/// `suffix`, then generate `generated`.
type Request = (usize, usize, Vec<u32>, Vec<u32>);

fn request() -> impl Strategy<Value = Request> {
    (
        any::<usize>(),
        any::<usize>(),
        prop::collection::vec(1u32..50, 1..12),
        prop::collection::vec(1u32..50, 0..4),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn requests_through_the_trie_restore_exact_states(
        requests in prop::collection::vec(request(), 1..10),
        budget in prop_oneof![3 => Just(usize::MAX), 1 => 0usize..20_000],
    ) {
        let config = Config {
            layers: new_caches().iter().map(LayerCache::layer_kind).collect(),
            lookahead: Lookahead::None,
            schedule: SchedulePolicy { interval: 7, before_end: 2 },
        };
        let mut trie = PrefixTrie::<LayerSnapshot>::new(config).unwrap();
        let mut caches = new_caches();
        let mut conversations: Vec<Vec<u32>> = Vec::new();
        for (base, cut, suffix, generated) in &requests {
            let prefix: &[u32] = match conversations.len() {
                0 => &[],
                n => {
                    let previous = &conversations[base % n];
                    &previous[..cut % (previous.len() + 1)]
                }
            };
            let prompt = [prefix, suffix].concat();
            run_request(&mut trie, &mut caches, &prompt, generated, budget);
            conversations.push([prompt, generated.clone()].concat());
        }
    }
}
