//! The step-loop harness the engine tests share: tiny models (`nn/tests/fixtures`) served
//! by a [`LoadedModel`] driven step by step, and the cold recompute answers are compared with.

#![allow(dead_code)] // Each test binary uses its own subset.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use runner::engine::memory::MemoryBudget;
use runner::engine::{
    DoneReason, Event, Job, LoadedModel, LoopConfig, PromptMedia, Speculation, Stats,
};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

pub const CONTEXT: usize = 256;

pub fn model(name: &str) -> Box<dyn nn::Model> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nn/tests/fixtures")
        .join(name);
    nn::load::load(&dir, Some(mlx::Dtype::F32)).unwrap().model
}

pub fn config(cache_bytes: usize) -> LoopConfig {
    LoopConfig {
        prefill_chunk: 16,
        prefill_budget_while_decoding: 8,
        prefill_budget_idle: 32,
        // Chunks of the sizes above, however fast this machine runs: the tests count them.
        prefill_step_target: None,
        max_sequences: 8,
        capture_interval: 32,
        memory: MemoryBudget {
            cache_bytes: Some(cache_bytes),
            kv_bytes: 1 << 30,
        },
        draft: None,
        kv_storage: None,
    }
}

pub fn engine(name: &str, cache_bytes: usize) -> LoadedModel {
    LoadedModel::new(model(name), CONTEXT, config(cache_bytes)).unwrap()
}

/// A submitted job's receiving end.
pub struct Handle {
    events: UnboundedReceiver<Event>,
    pub cancel: Arc<AtomicBool>,
    pub tokens: Vec<u32>,
    pub done: Option<(DoneReason, Stats)>,
    pub failed: Option<String>,
}

impl Handle {
    pub fn poll(&mut self) {
        while let Ok(event) = self.events.try_recv() {
            match event {
                Event::Token { id, .. } => self.tokens.push(id),
                Event::Done { reason, stats } => self.done = Some((reason, stats)),
                Event::Failed(message) => self.failed = Some(message),
            }
        }
    }

    pub fn ended(&mut self) -> bool {
        self.poll();
        self.done.is_some() || self.failed.is_some()
    }

    pub fn stats(&self) -> Stats {
        match (&self.done, &self.failed) {
            (Some((_, stats)), _) => *stats,
            (None, Some(message)) => panic!("the job failed: {message}"),
            (None, None) => panic!("the job has not ended"),
        }
    }
}

pub fn submit(engine: &mut LoadedModel, prompt: &[u32], max_tokens: usize) -> Handle {
    submit_with(
        engine,
        prompt,
        max_tokens,
        sampler::Options::greedy(),
        Speculation::Off,
    )
}

/// Submits a job with these sampling options and this speculation choice.
pub fn submit_with(
    engine: &mut LoadedModel,
    prompt: &[u32],
    max_tokens: usize,
    sampling: sampler::Options,
    speculation: Speculation,
) -> Handle {
    submit_job(
        engine,
        prompt,
        max_tokens,
        sampling,
        Vec::new(),
        Vec::new(),
        speculation,
    )
}

/// Submits a job with every setting the tests vary.
pub fn submit_job(
    engine: &mut LoadedModel,
    prompt: &[u32],
    max_tokens: usize,
    sampling: sampler::Options,
    stop_tokens: Vec<u32>,
    turn_starts: Vec<usize>,
    speculation: Speculation,
) -> Handle {
    let mut job = job(prompt, max_tokens, sampling, speculation);
    job.0.stop_tokens = stop_tokens;
    job.0.turn_starts = turn_starts;
    submit_built(engine, job)
}

/// A job of `prompt` with no stop tokens, turn starts or images, and its receiving end.
fn job(
    prompt: &[u32],
    max_tokens: usize,
    sampling: sampler::Options,
    speculation: Speculation,
) -> (Job, Handle) {
    let (tx, rx) = unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let job = Job {
        prompt: prompt.to_vec(),
        sampling,
        max_tokens,
        stop_tokens: Vec::new(),
        grammar: None,
        turn_starts: Vec::new(),
        images: Vec::new(),
        speculation,
        events: tx,
        cancel: Arc::clone(&cancel),
    };
    let handle = Handle {
        events: rx,
        cancel,
        tokens: Vec::new(),
        done: None,
        failed: None,
    };
    (job, handle)
}

fn submit_built(engine: &mut LoadedModel, (job, handle): (Job, Handle)) -> Handle {
    engine.submit(job);
    handle
}

/// Submits a greedy job whose prompt holds `images`.
pub fn submit_media(
    engine: &mut LoadedModel,
    prompt: &[u32],
    max_tokens: usize,
    images: Vec<PromptMedia>,
) -> Handle {
    let mut job = job(
        prompt,
        max_tokens,
        sampler::Options::greedy(),
        Speculation::Off,
    );
    job.0.images = images;
    submit_built(engine, job)
}

pub fn run_to_idle(engine: &mut LoadedModel) {
    for _ in 0..100_000 {
        if engine.is_idle() {
            return;
        }
        engine.step();
    }
    panic!("the engine did not become idle");
}

/// One request with these sampling options and this speculation choice, run until the engine
/// is idle; it has ended.
pub fn run_with(
    engine: &mut LoadedModel,
    prompt: &[u32],
    max_tokens: usize,
    sampling: sampler::Options,
    speculation: Speculation,
) -> Handle {
    let mut handle = submit_with(engine, prompt, max_tokens, sampling, speculation);
    run_to_idle(engine);
    assert!(handle.ended());
    handle
}

/// Steps `steps` times, cancels `handle`'s job and runs until the engine is idle: the job has
/// ended as cancelled.
pub fn cancel_after(engine: &mut LoadedModel, handle: &mut Handle, steps: usize) {
    for _ in 0..steps {
        engine.step();
    }
    handle
        .cancel
        .store(true, std::sync::atomic::Ordering::Relaxed);
    run_to_idle(engine);
    assert!(handle.ended());
    assert_eq!(
        handle.done.as_ref().map(|d| d.0),
        Some(DoneReason::Cancelled)
    );
}

/// One greedy request alone, to completion, whose last message begins at `turn_start` (as the
/// server tells the engine from the chat template).
pub fn run_turn(
    engine: &mut LoadedModel,
    prompt: &[u32],
    max_tokens: usize,
    turn_start: usize,
) -> Handle {
    let mut handle = submit_job(
        engine,
        prompt,
        max_tokens,
        sampler::Options::greedy(),
        Vec::new(),
        vec![turn_start],
        Speculation::Off,
    );
    run_to_idle(engine);
    assert!(handle.ended());
    handle
}

/// One request alone, to completion.
pub fn run(engine: &mut LoadedModel, prompt: &[u32], max_tokens: usize) -> Handle {
    let mut handle = submit(engine, prompt, max_tokens);
    run_to_idle(engine);
    assert!(handle.ended());
    handle
}

/// Greedy continuation of `prompt` by `model` from fresh caches, token by token.
pub fn cold(model: &dyn nn::Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut caches = model.new_caches().unwrap();
    let mut out = Vec::new();
    let mut feed = prompt.to_vec();
    let mut position = 0;
    for _ in 0..n {
        let forward = model
            .forward(&nn::Batch::single(&feed, position).unwrap(), &mut caches)
            .unwrap();
        position += feed.len();
        let hidden = forward.hidden;
        let last = hidden.slice_axis(1, -1, hidden.dim(1).unwrap()).unwrap();
        let logits = model
            .unembed(&last)
            .unwrap()
            .astype(mlx::Dtype::F32)
            .unwrap();
        let values = logits.to_vec::<f32>().unwrap();
        let best = (0..values.len())
            .max_by(|&a, &b| values[a].total_cmp(&values[b]))
            .unwrap() as u32;
        out.push(best);
        feed = vec![best];
    }
    out
}

pub fn ids(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 31 + seed * 17 + 3) % 500)
        .collect()
}

pub fn check_trie(engine: &LoadedModel) {
    engine.prefix_cache().trie().check_invariants().unwrap();
}

/// A depth controller that has measured only plain decoding: it picks depth 0, and probes
/// depth 1 at its 8th decision.
pub fn controller_of_plain_decoding(max_depth: usize) -> speculate::DepthController {
    let mut learnt = speculate::DepthController::new(max_depth);
    for _ in 0..2 {
        learnt.observe(1, 0, 0, std::time::Duration::from_millis(1));
    }
    assert_eq!(learnt.best(1), 0);
    learnt
}

/// A depth controller that has measured, at every batch size, drafting `max_depth` tokens as
/// cheap and always accepted and plain decoding as dear: it drafts, whatever its drafts' fate,
/// for far longer than a test's requests. (A cold controller measures plain decoding in each
/// batch bucket once it has measured a depth there, and stops drafting for a drafter that
/// never pays, which a test of drafting itself must avoid.)
pub fn controller_of_drafting(max_depth: usize) -> speculate::DepthController {
    let mut learnt = speculate::DepthController::new(max_depth);
    for batch in [1, 2, 4, 8, 16, 32] {
        for _ in 0..2 {
            learnt.observe(batch, 0, 0, std::time::Duration::from_millis(500));
            for depth in 1..=max_depth {
                learnt.observe(batch, depth, depth, std::time::Duration::from_millis(1));
            }
        }
        assert_eq!(learnt.best(batch), max_depth);
    }
    learnt
}

/// Sends `draws` requests of `prompt` for 4 tokens each, 16 at a time, first without
/// speculation, then with `speculation`, request `i` sampling with `options(i)`; asserts that
/// each answer is whole and that the second token, the third and the first three are
/// distributed alike both ways (chi-square at the 0.9999 quantile). Returns the drafts the
/// speculating requests had accepted, and proposed.
pub fn assert_first_tokens_alike(
    engine: &mut LoadedModel,
    prompt: &[u32],
    draws: u64,
    options: impl Fn(u64) -> sampler::Options,
    speculation: Speculation,
) -> (usize, usize) {
    let mut samples: Vec<HashMap<Vec<u32>, usize>> = Vec::new();
    let (mut accepted, mut drafted) = (0, 0);
    for speculation in [Speculation::Off, speculation] {
        let mut counts: [HashMap<Vec<u32>, usize>; 3] = Default::default();
        for batch in 0..draws / 16 {
            let mut handles: Vec<Handle> = (0..16)
                .map(|i| submit_with(engine, prompt, 4, options(batch * 16 + i), speculation))
                .collect();
            run_to_idle(engine);
            for handle in &mut handles {
                assert!(handle.ended());
                assert_eq!(handle.failed, None);
                let t = handle.tokens.clone();
                assert_eq!(t.len(), 4);
                *counts[0].entry(vec![t[1]]).or_default() += 1;
                *counts[1].entry(vec![t[2]]).or_default() += 1;
                *counts[2].entry(t[..3].to_vec()).or_default() += 1;
                if let Some(spec) = handle.stats().speculation {
                    accepted += spec.accepted;
                    drafted += spec.drafted;
                }
            }
        }
        samples.extend(counts);
    }
    for (what, i) in [("second token", 0), ("third token", 1), ("all three", 2)] {
        let (stat, quantile) = homogeneity(&samples[i], &samples[i + 3]);
        eprintln!(
            "{what}: chi-square {stat:.1}, 0.9999 quantile {quantile:.1}; {accepted} of {drafted} drafts accepted"
        );
        assert!(stat < quantile, "{what}: {stat} >= {quantile}");
    }
    (accepted, drafted)
}

/// Pearson's chi-square homogeneity test of two samples' counts over the same categories,
/// categories expected fewer than 5 times in either sample pooled; the statistic and its
/// 0.9999 quantile (Wilson–Hilferty).
fn homogeneity(a: &HashMap<Vec<u32>, usize>, b: &HashMap<Vec<u32>, usize>) -> (f64, f64) {
    let (na, nb) = (
        a.values().sum::<usize>() as f64,
        b.values().sum::<usize>() as f64,
    );
    let mut keys: Vec<&Vec<u32>> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut bins: Vec<(f64, f64)> = Vec::new();
    let mut pooled = (0.0, 0.0);
    for key in keys {
        let (ca, cb) = (
            *a.get(key).unwrap_or(&0) as f64,
            *b.get(key).unwrap_or(&0) as f64,
        );
        let expected_smaller = (ca + cb) * na.min(nb) / (na + nb);
        if expected_smaller < 5.0 {
            pooled = (pooled.0 + ca, pooled.1 + cb);
        } else {
            bins.push((ca, cb));
        }
    }
    if pooled.0 + pooled.1 > 0.0 {
        bins.push(pooled);
    }
    let stat: f64 = bins
        .iter()
        .map(|&(ca, cb)| {
            let total = ca + cb;
            let (ea, eb) = (total * na / (na + nb), total * nb / (na + nb));
            (ca - ea).powi(2) / ea + (cb - eb).powi(2) / eb
        })
        .sum();
    let df = (bins.len().max(2) - 1) as f64;
    let h = 2.0 / (9.0 * df);
    (stat, df * (1.0 - h + 3.719 * h.sqrt()).powi(3))
}
