//! `mlxkit bench`: greedy runs timed from the client's side (prefill, decode, time to first
//! token, peak memory), one stream or many at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::model_name::ModelName;
use crate::server::AppState;
use crate::server::generation::Output;
use crate::server::options::GenerationOptions;
use crate::server::request::{self, GenerationRequest, PromptSource};
use crate::server::requested_shape::Requested;

/// What `bench` prompts with.
pub(super) enum BenchPrompt {
    /// Synthetic text cut to this many tokens.
    Synthetic(usize),
    /// Exactly these token ids.
    Ids(Vec<u32>),
}

/// How much `bench` generates per run, and how.
#[derive(Clone)]
pub(super) struct BenchLength {
    /// Tokens per run (fewer when the model ends first, unless `ignore_eos`).
    pub(super) tokens: usize,
    /// Generate through end-of-sequence tokens.
    pub(super) ignore_eos: bool,
    /// Speculative decoding or not.
    pub(super) speculation: crate::engine::Speculation,
    /// The draft model loaded beside the model, when it drafts with one.
    pub(super) draft_model: Option<ModelName>,
}

/// Reads a JSON array of token ids (`bench --prompt-ids`).
pub(super) fn read_prompt_ids(path: &std::path::Path) -> Result<Vec<u32>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let ids: Vec<u32> = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a JSON array of token ids", path.display()))?;
    if ids.len() < 2 {
        bail!(
            "{} holds {} token ids; bench needs at least 2",
            path.display(),
            ids.len()
        );
    }
    Ok(ids)
}

/// How many streams `bench` runs at once.
pub(super) struct BenchStreams {
    /// Streams per run.
    pub(super) concurrency: usize,
    /// Each stream with its own prompt.
    pub(super) distinct: bool,
    /// One more stream with a short prompt, sent once the others decode.
    pub(super) late_short: Option<usize>,
}

/// What one stream of a `bench` run measured.
struct StreamResult {
    stats: crate::engine::Stats,
    /// From the run's start to the stream's first token.
    first_token: Duration,
    /// From the run's start to the stream's end.
    end: Duration,
    /// From the stream's own start to its first token.
    ttft: Duration,
}

/// Runs one greedy generation of `prompt` and times it against `run_start`; counts itself in
/// `decoding` at its first token.
async fn bench_stream(
    state: AppState,
    name: ModelName,
    prompt: Vec<u32>,
    length: BenchLength,
    load: Duration,
    run_start: Instant,
    decoding: Arc<AtomicUsize>,
) -> Result<StreamResult> {
    let lease = state
        .keeper
        .acquire_drafted(&name, length.draft_model.as_ref(), None)
        .await?;
    let options = GenerationOptions {
        sampling: sampler::Options::greedy(),
        num_predict: Some(length.tokens),
        ignore_eos: length.ignore_eos,
        speculation: length.speculation,
        ..GenerationOptions::default()
    };
    let begin = Instant::now();
    let mut outputs = request::start(
        lease,
        GenerationRequest {
            source: PromptSource::Tokens(prompt),
            media: Vec::new(),
            requested: Requested::none(),
            options,
            logprobs: None,
            started: begin,
            load,
        },
    )
    .await?
    .outputs;
    let mut first_token = None;
    let mut summary = None;
    while let Some(output) = outputs.recv().await {
        match output {
            Output::Content(..) if first_token.is_none() => {
                first_token = Some(Instant::now());
                decoding.fetch_add(1, Ordering::SeqCst);
            }
            Output::Done(s) => summary = Some(s),
            Output::Error(e) => bail!(e),
            _ => {}
        }
    }
    let end = Instant::now();
    let summary = summary.context("the run ended without a result")?;
    let first = first_token.unwrap_or(end);
    Ok(StreamResult {
        stats: summary.stats,
        first_token: first - run_start,
        end: end - run_start,
        ttft: first - begin,
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Prints `report` as JSON, or as a table whose columns depend on whether streams ran at once.
fn print_report(
    name: &ModelName,
    load: Duration,
    report: &serde_json::Value,
    concurrency: usize,
    as_json: bool,
) -> Result<()> {
    if as_json {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    println!("{name}: loaded in {:.2}s", load.as_secs_f64());
    if let Some(ranks) = report["ranks"].as_array() {
        let peaks: Vec<String> = ranks
            .iter()
            .map(|r| {
                let mb = r["peak_memory_bytes"].as_f64().unwrap_or(0.0) / 1e6;
                format!("rank {} {mb:.1} MB", r["rank"])
            })
            .collect();
        println!(
            "split by {} parallelism over {} ranks; peak memory: {}",
            report["parallel"].as_str().unwrap_or("?"),
            ranks.len(),
            peaks.join(", ")
        );
    }
    if concurrency == 1 {
        println!(
            "{:>4} {:>8} {:>12} {:>8} {:>12} {:>10} {:>10}",
            "run", "prompt", "prefill t/s", "gen", "decode t/s", "ttft ms", "peak MB"
        );
    } else {
        println!(
            "{:>4} {:>8} {:>8} {:>14} {:>16} {:>10} {:>10} {:>10}",
            "run",
            "streams",
            "gen",
            "decode t/s/str",
            "aggregate t/s",
            "ttft p50",
            "ttft p95",
            "late ttft"
        );
    }
    for r in report["runs"].as_array().into_iter().flatten() {
        let f = |key: &str| r[key].as_f64().unwrap_or(0.0);
        if concurrency == 1 {
            println!(
                "{:>4} {:>8} {:>12.1} {:>8} {:>12.1} {:>10.1} {:>10.1}",
                r["run"],
                r["prompt_eval_tokens"],
                f("prefill_tok_s"),
                r["generated_tokens"],
                f("decode_tok_s"),
                f("ttft_ms"),
                f("peak_memory_bytes") / 1e6,
            );
        } else {
            let per_stream: Vec<f64> = r["per_stream"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| s["decode_tok_s"].as_f64().unwrap_or(0.0))
                .collect();
            let mean = per_stream.iter().sum::<f64>() / per_stream.len().max(1) as f64;
            println!(
                "{:>4} {:>8} {:>8} {:>14.1} {:>16.1} {:>10.1} {:>10.1} {:>10}",
                r["run"],
                r["streams"],
                r["generated_tokens"],
                mean,
                f("aggregate_decode_tok_s"),
                f("ttft_p50_ms"),
                f("ttft_p95_ms"),
                r["late_short_ttft_ms"]
                    .as_f64()
                    .map_or("-".to_string(), |t| format!("{t:.1}")),
            );
        }
    }
    Ok(())
}

/// `bench`: greedy runs over a synthetic prompt or given ids, one or several streams at once,
/// reported per run.
pub(super) async fn bench(
    state: AppState,
    name: ModelName,
    prompt: BenchPrompt,
    length: BenchLength,
    streams: BenchStreams,
    runs: usize,
    as_json: bool,
) -> Result<()> {
    let started = Instant::now();
    let lease = state
        .keeper
        .acquire_drafted(&name, length.draft_model.as_ref(), None)
        .await?;
    let load = started.elapsed();
    let info = lease.info.clone();
    drop(lease);
    let vocab_size = info.tokenizer.vocab_size() as u32;
    // A prompt of distinct-enough text, cut to the requested token count.
    let synthetic = |count: usize| -> Result<Vec<u32>> {
        let seed_text = "The quick brown fox jumps over the lazy dog while counting stars and telling stories. ";
        let mut tokens = info
            .tokenizer
            .encode(&seed_text.repeat(count / 8 + 8), true)?;
        tokens.truncate(count.max(2));
        Ok(tokens)
    };
    let tokens = match prompt {
        BenchPrompt::Synthetic(prompt_tokens) => synthetic(prompt_tokens)?,
        BenchPrompt::Ids(ids) => {
            if let Some(&id) = ids.iter().find(|&&id| id >= vocab_size) {
                bail!("prompt token id {id} is outside the vocabulary of {vocab_size}");
            }
            ids
        }
    };
    let concurrency = streams.concurrency;
    let mut results = Vec::new();
    for run in 0..runs {
        // Each run changes the second token by a different amount so the prefix cache cannot
        // serve it from an earlier run; the last run changes it by 0, so given ids are
        // measured exactly as given (earlier runs are the warm-up). Distinct streams change
        // the third token by their index too.
        let shift = ((runs - 1 - run) * (concurrency + 1)) as u32;
        let run_start = Instant::now();
        let decoding = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::with_capacity(concurrency);
        for stream in 0..concurrency {
            let mut prompt = tokens.clone();
            if let Some(second) = prompt.get_mut(1) {
                *second = (*second + shift) % vocab_size;
            }
            if streams.distinct
                && let Some(third) = prompt.get_mut(2)
            {
                *third = (*third + stream as u32) % vocab_size;
            }
            tasks.push(tokio::spawn(bench_stream(
                state.clone(),
                name.clone(),
                prompt,
                length.clone(),
                load,
                run_start,
                Arc::clone(&decoding),
            )));
        }
        let late = match streams.late_short {
            Some(short) => {
                // Sent once every long stream has its first token. (The engine's status is as
                // of its last step, which at a run's start can still be the previous run's.)
                // A stream that ended without one (an error) ends the wait too.
                while decoding.load(Ordering::SeqCst) < concurrency
                    && !tasks.iter().any(|task| task.is_finished())
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let mut prompt = synthetic(short)?;
                if let Some(second) = prompt.get_mut(1) {
                    *second = (*second + shift + 7) % vocab_size;
                }
                Some(
                    bench_stream(
                        state.clone(),
                        name.clone(),
                        prompt,
                        BenchLength {
                            tokens: 8,
                            ignore_eos: true,
                            ..length.clone()
                        },
                        load,
                        run_start,
                        Arc::new(AtomicUsize::new(0)),
                    )
                    .await?,
                )
            }
            None => None,
        };
        let mut done = Vec::with_capacity(concurrency);
        for task in tasks {
            done.push(task.await.context("a bench stream panicked")??);
        }
        let per_stream: Vec<serde_json::Value> = done
            .iter()
            .map(|r| {
                let s = &r.stats;
                json!({
                    "prompt_eval_tokens": s.prompt_eval_count(),
                    "prefill_tok_s": s.prompt_eval_count() as f64 / s.prompt_eval.as_secs_f64().max(1e-9),
                    "generated_tokens": s.generated_tokens,
                    "decode_tok_s": s.generated_tokens.saturating_sub(1) as f64 / s.eval.as_secs_f64().max(1e-9),
                    "ttft_ms": r.ttft.as_secs_f64() * 1e3,
                    "speculation": s.speculation.as_ref().map(|spec| crate::server::generation::speculation_json(spec, info.draft.as_ref())),
                })
            })
            .collect();
        let mut ttfts: Vec<f64> = done.iter().map(|r| r.ttft.as_secs_f64() * 1e3).collect();
        ttfts.sort_by(f64::total_cmp);
        // Aggregate decode: every token after each stream's first, over the span from the
        // first stream's first token to the last stream's end.
        let decoded: usize = done
            .iter()
            .map(|r| r.stats.generated_tokens.saturating_sub(1))
            .sum();
        let span = done.iter().map(|r| r.end).max().unwrap_or_default()
            - done.iter().map(|r| r.first_token).min().unwrap_or_default();
        let first = &done[0];
        let s = first.stats;
        results.push(json!({
            "run": run,
            "streams": concurrency,
            "prompt_tokens": s.prompt_tokens,
            "prompt_eval_tokens": s.prompt_eval_count(),
            "prefill_tok_s": per_stream[0]["prefill_tok_s"],
            "generated_tokens": s.generated_tokens,
            "decode_tok_s": per_stream[0]["decode_tok_s"],
            "aggregate_decode_tok_s": decoded as f64 / span.as_secs_f64().max(1e-9),
            "ttft_ms": first.ttft.as_secs_f64() * 1e3,
            "ttft_p50_ms": percentile(&ttfts, 0.5),
            "ttft_p95_ms": percentile(&ttfts, 0.95),
            "late_short_ttft_ms": late.map(|r| r.ttft.as_secs_f64() * 1e3),
            "peak_memory_bytes": done.iter().map(|r| r.stats.peak_memory).max(),
            "per_stream": per_stream,
        }));
    }
    let mut report = json!({
        "model": name.to_string(),
        "load_s": load.as_secs_f64(),
        "runs": results,
    });
    if let Some(group) = state.keeper.engine().group() {
        // Rank 0's own peak is its engine's; each worker reports its own.
        let own = results
            .iter()
            .filter_map(|r| r["peak_memory_bytes"].as_u64())
            .max()
            .unwrap_or(0);
        let workers = group
            .formation()
            .and_then(|formation| formation.links.peak_memory(Duration::from_secs(30)))
            .map_err(anyhow::Error::msg)?;
        report["ranks"] = json!(
            std::iter::once(own)
                .chain(workers)
                .enumerate()
                .map(|(rank, peak)| json!({ "rank": rank, "peak_memory_bytes": peak }))
                .collect::<Vec<_>>()
        );
        report["parallel"] = json!(group.parallel.name());
    }
    print_report(&name, load, &report, concurrency, as_json)
}
