//! The prefix cache with real caches and a tiny model: a second request sharing a prefix
//! restores the cached state from the trie, prefills only the new suffix, and produces exactly
//! the logits of a cold run that split its prefill the same way (and agrees with a one-shot run
//! to the parity tolerance).

use std::path::Path;

use kvcache::{LayerCache, LayerSnapshot};
use mlx::{Array, Dtype};
use nn::{Batch, Model, Weights, build_model};
use prefix_trie::{Capture, Config, LayerRestore, Lookahead, PrefixTrie, Prompt, SchedulePolicy};
use quant::{SafetensorsFile, Tensor};

fn load(name: &str) -> (Box<dyn Model>, Vec<u32>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let golden: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("golden.json")).unwrap()).unwrap();
    let prompt = golden["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let file = SafetensorsFile::open(&dir.join("model.safetensors")).unwrap();
    let tensors = file
        .entries()
        .keys()
        .map(|n| (n.clone(), Tensor::Dense(file.load(n).unwrap())))
        .collect::<Vec<_>>();
    let mut weights = Weights::new(tensors, Dtype::F32);
    let model = build_model(&config, &mut weights).unwrap();
    (model, prompt)
}

type Caches = Vec<Option<LayerCache>>;

fn caches(model: &dyn Model) -> Caches {
    model.new_caches().unwrap()
}

/// Runs `ids` from `position`; returns the last position's logits.
fn prefill(model: &dyn Model, caches: &mut Caches, ids: &[u32], position: usize) -> Vec<f32> {
    let out = model
        .forward(&Batch::single(ids, position).unwrap(), caches)
        .unwrap();
    let last = out.hidden.slice_axis(1, -1, ids.len() as i32).unwrap();
    let logits: Array = model.unembed(&last).unwrap();
    let mut arrays = vec![logits.clone()];
    arrays.extend(caches.iter().flatten().flat_map(LayerCache::state_arrays));
    mlx::eval(&arrays).unwrap();
    logits.to_vec::<f32>().unwrap()
}

/// One request through the trie; returns (restored offset, tokens prefilled, last logits).
fn request(
    model: &dyn Model,
    trie: &mut PrefixTrie<LayerSnapshot>,
    live: &mut Caches,
    ids: &[u32],
) -> (usize, usize, Vec<f32>) {
    let prompt = Prompt::new(ids, &[], Lookahead::None).unwrap();
    let begin = trie.begin(&prompt, &[]).unwrap();
    for (layer, plan) in trie
        .restore_plan(begin.session)
        .unwrap()
        .into_iter()
        .enumerate()
    {
        let Some(cache) = live[layer].as_mut() else {
            continue;
        };
        match plan {
            LayerRestore::Stateless => {}
            LayerRestore::Empty => *cache = caches(model).swap_remove(layer).unwrap(),
            LayerRestore::Range(snapshots) => {
                cache.rewind(0).unwrap();
                for s in snapshots {
                    cache.restore(s).unwrap();
                }
            }
            LayerRestore::Point(s) => cache.restore(s).unwrap(),
        }
    }
    let restored = begin.restore_at;
    for cache in live.iter_mut().flatten() {
        cache.schedule_captures(&begin.capture_at).unwrap();
    }
    let logits = prefill(model, live, &ids[restored..], restored);
    let mut captures = Vec::new();
    for (layer, cache) in live.iter_mut().enumerate() {
        let Some(cache) = cache.as_mut() else {
            continue;
        };
        for (_, snapshot) in cache.take_captures() {
            captures.push(Capture { layer, snapshot });
        }
    }
    let live_ref = &*live;
    trie.close(
        begin.session,
        prompt.keys(),
        ids.len(),
        captures,
        |layer, coverage| {
            live_ref[layer]
                .as_ref()
                .expect("only stateful layers are paged out")
                .snapshot_coverage(&coverage)
        },
    )
    .unwrap();
    (restored, ids.len() - restored, logits)
}

fn check(name: &str) {
    let (model, prompt) = load(name);
    let model = model.as_ref();
    let first = &prompt[..14];
    let config = Config {
        layers: caches(model)
            .iter()
            .map(|c| {
                c.as_ref()
                    .map_or(prefix_trie::LayerKind::Stateless, LayerCache::layer_kind)
            })
            .collect(),
        lookahead: Lookahead::None,
        schedule: SchedulePolicy::default(),
    };
    let mut trie = PrefixTrie::<LayerSnapshot>::new(config).unwrap();
    let mut live = caches(model);
    let (restored, prefilled, _) = request(model, &mut trie, &mut live, first);
    assert_eq!(
        (restored, prefilled),
        (0, first.len()),
        "{name}: the first request starts cold"
    );

    // Another request continues the first: only the suffix is prefilled.
    let (restored, prefilled, warm) = request(model, &mut trie, &mut live, &prompt);
    assert_eq!(
        restored,
        first.len(),
        "{name}: resumes where the first request ended"
    );
    assert_eq!(
        prefilled,
        prompt.len() - first.len(),
        "{name}: prefills only the suffix"
    );

    // A cold run split the same way computes exactly the same numbers.
    let mut cold = caches(model);
    prefill(model, &mut cold, first, 0);
    let expected = prefill(model, &mut cold, &prompt[first.len()..], first.len());
    assert_eq!(
        warm, expected,
        "{name}: restored state differs from a cold run"
    );

    // And a one-shot cold run agrees to the parity tolerance (different summation order).
    let one_shot = prefill(model, &mut caches(model), &prompt, 0);
    let worst = warm
        .iter()
        .zip(&one_shot)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst <= 1e-4, "{name}: {worst:e} from a one-shot run");
}

#[test]
fn llama_resumes_from_the_trie() {
    check("llama");
}

#[test]
fn gemma3_resumes_from_the_trie_with_sliding_windows() {
    check("gemma3");
}
