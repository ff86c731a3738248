//! The `mlxkit` commands.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde_json::json;

use crate::engine::{Engine, LoopConfig};
use crate::model_name::ModelName;
use crate::modelfile::Modelfile;
use crate::pull::PullProgress;
use crate::scheduler::Scheduler;
use crate::server::generation::{self, Output, Prepared};
use crate::server::options::GenerationOptions;
use crate::server::structured::{self, Requested};
use crate::server::{AppState, prompt};
use crate::store::Store;

/// The model `run` uses when none is named.
pub const DEFAULT_MODEL: &str = "smollm2:135m";

/// Where `serve` listens and the other commands find it.
const DEFAULT_HOST: &str = "127.0.0.1:11434";

/// Requests admitted at once (running or queued) before the server answers 503.
const QUEUE_CAPACITY: usize = 64;

#[derive(Parser)]
#[command(
    name = "mlxkit",
    version,
    about = "Run large language models on MLX, with Ollama's and OpenAI's APIs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve Ollama's and OpenAI's HTTP APIs.
    Serve {
        /// Address to listen on.
        #[arg(long, env = "MLXKIT_HOST", default_value = DEFAULT_HOST)]
        host: String,
        /// Bytes the prefix cache keeps between requests (`4G`, `512M`; default: a quarter of
        /// the device's memory, at most 8 GiB).
        #[arg(long, env = "MLXKIT_CACHE_BYTES")]
        cache_bytes: Option<String>,
        /// Requests decoded at once; more wait in the queue.
        #[arg(long, env = "MLXKIT_MAX_SEQUENCES")]
        max_sequences: Option<usize>,
        /// Decode speculatively with this drafter unless a request says otherwise (`ngram`:
        /// prompt lookup; `none`: plain decoding).
        #[arg(long, env = "MLXKIT_DRAFT", value_parser = parse_draft)]
        draft: Option<DraftArg>,
        /// How KV caches store keys and values: `f32`, `f16` (half the memory and the
        /// attention reads, at a rounding of about 3 significant digits), `q8` (8-bit codes
        /// per group of 32: under a third of f32's memory, dequantized for each step's
        /// attention), or `auto` (the dtype the model computes in).
        #[arg(long, env = "MLXKIT_KV_CACHE", value_parser = parse_kv_cache)]
        kv_cache: Option<KvCacheArg>,
    },
    /// Chat with a model (pulled first if needed): one prompt, or an interactive session.
    Run {
        /// The model.
        #[arg(default_value = DEFAULT_MODEL)]
        model: String,
        /// A prompt; without one, an interactive chat starts.
        prompt: Vec<String>,
        /// Show the model's reasoning, for models that think.
        #[arg(long)]
        think: bool,
        /// Print prompt and generation statistics at the end.
        #[arg(long)]
        verbose: bool,
        /// Sampling temperature (0 = greedy).
        #[arg(long)]
        temperature: Option<f32>,
        /// Random seed.
        #[arg(long)]
        seed: Option<u64>,
        /// The most tokens to generate.
        #[arg(long)]
        num_predict: Option<usize>,
        /// Constrain answers: `json` for any JSON object, or a JSON Schema as JSON text.
        #[arg(long)]
        format: Option<String>,
        /// Decode speculatively with this drafter (`ngram`: prompt lookup).
        #[arg(long, value_parser = parse_draft)]
        draft: Option<DraftArg>,
        /// How KV caches store keys and values: `f32`, `f16` (half the memory and the
        /// attention reads, at a rounding of about 3 significant digits), `q8` (8-bit codes
        /// per group of 32: under a third of f32's memory, dequantized for each step's
        /// attention), or `auto` (the dtype the model computes in).
        #[arg(long, env = "MLXKIT_KV_CACHE", value_parser = parse_kv_cache)]
        kv_cache: Option<KvCacheArg>,
    },
    /// Download a model from the catalog.
    Pull {
        /// The model.
        model: String,
    },
    /// Create a model from a Modelfile (FROM a GGUF file, converted into MLX's layouts once, a
    /// transformers folder or a model).
    Create {
        /// The new model's name.
        model: String,
        /// The Modelfile.
        #[arg(short = 'f', long = "file", default_value = "Modelfile")]
        file: PathBuf,
        /// Quantize the weights: int4, int8, mxfp4, mxfp8 or nvfp4 (embeddings, norms and
        /// encoders stay as they are; the head and, under int4, k/v/down projections get 8 bits).
        #[arg(short = 'q', long, value_name = "TYPE")]
        quantize: Option<quant::create::Target>,
        /// Print what create would do to each tensor (quantize it, convert a GGUF block type
        /// into MLX's layout, keep it), and write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Quantize the Modelfile's DRAFT model too (stored beside the model as
        /// <model>-draft).
        #[arg(long, value_name = "TYPE")]
        quantize_draft: Option<quant::create::Target>,
    },
    /// Write a stored model out as a transformers / mlx-lm folder (config.json,
    /// model.safetensors, tokenizer.json).
    Export {
        /// The model.
        model: String,
        /// The folder to write (created if missing).
        dir: PathBuf,
        /// The dtype of dense weights and of quantization scales.
        #[arg(long, value_enum, default_value_t = ExportDtype::F32)]
        dtype: ExportDtype,
        /// Keep quantized matrices quantized, in mlx-lm's layout, instead of dequantizing them.
        #[arg(long)]
        quantized: bool,
        /// Keep only the first N decoder layers: a truncated copy with the same vocabulary,
        /// to `create` and use as a draft model.
        #[arg(long, value_name = "N")]
        layers: Option<usize>,
    },
    /// List stored models.
    #[command(alias = "ls")]
    List,
    /// Show a model's details, parameters and template.
    Show {
        /// The model.
        model: String,
        /// Also list every tensor: its shape and how it is stored (dtype or quantization).
        #[arg(short, long)]
        verbose: bool,
    },
    /// List models loaded in the running server.
    Ps {
        /// The server's address.
        #[arg(long, env = "MLXKIT_HOST", default_value = DEFAULT_HOST)]
        host: String,
    },
    /// Remove a model.
    Rm {
        /// The models.
        #[arg(required = true)]
        models: Vec<String>,
    },
    /// Copy a model under a new name.
    Cp {
        /// The existing model.
        source: String,
        /// The new name.
        destination: String,
    },
    /// Measure prefill and decode speed, time to first token and peak memory.
    Bench {
        /// The model.
        #[arg(default_value = DEFAULT_MODEL)]
        model: String,
        /// Prompt tokens.
        #[arg(long, default_value_t = 512)]
        prompt_tokens: usize,
        /// A JSON array of prompt token ids to use instead of the synthetic prompt, so that
        /// another engine can be given exactly the same prompt. The last run uses them
        /// unchanged; earlier runs change one token.
        #[arg(long, conflicts_with = "prompt_tokens")]
        prompt_ids: Option<PathBuf>,
        /// Generated tokens.
        #[arg(long, default_value_t = 128)]
        generate_tokens: usize,
        /// Repetitions (the first is reported separately as cold).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Keep generating through end-of-sequence tokens, so every run has the asked length.
        #[arg(long)]
        ignore_eos: bool,
        /// Streams at once per run; the report adds aggregate decode tok/s and TTFT p50/p95.
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        /// With `--concurrency`: give each stream its own prompt (one token changed) instead
        /// of the same one.
        #[arg(long)]
        distinct: bool,
        /// With `--concurrency`: one more stream, a short prompt of this many tokens sent once
        /// the others decode; its time to first token is reported apart.
        #[arg(long)]
        late_short: Option<usize>,
        /// Decode speculatively with this drafter (default: plain decoding).
        #[arg(long, value_parser = parse_draft)]
        draft: Option<DraftArg>,
        /// Instead of benchmarking, replay a depth controller's decision log (the server keeps
        /// one per model and drafter: `$MLXKIT_HOME/state/<digest>/ngram.log.json`) and report
        /// its decisions and whether the controller reproduces them.
        #[arg(long, conflicts_with_all = ["draft", "concurrency"])]
        replay: Option<PathBuf>,
        /// How KV caches store keys and values: `f32`, `f16` (half the memory and the
        /// attention reads, at a rounding of about 3 significant digits), `q8` (8-bit codes
        /// per group of 32: under a third of f32's memory, dequantized for each step's
        /// attention), or `auto` (the dtype the model computes in).
        #[arg(long, env = "MLXKIT_KV_CACHE", value_parser = parse_kv_cache)]
        kv_cache: Option<KvCacheArg>,
    },
    /// Report the MLX version, the device, each CPU primitive's path and a matmul timing.
    Info {
        /// Leave out the matmul timing (seconds of work natively, minutes under emulation).
        #[arg(long)]
        no_timing: bool,
    },
}

/// The dtypes `export` writes.
#[derive(Clone, Copy, clap::ValueEnum)]
enum ExportDtype {
    F32,
    Bf16,
    F16,
}

impl ExportDtype {
    fn dtype(self) -> mlx::Dtype {
        match self {
            ExportDtype::F32 => mlx::Dtype::F32,
            ExportDtype::Bf16 => mlx::Dtype::Bf16,
            ExportDtype::F16 => mlx::Dtype::F16,
        }
    }
}

/// Runs the command line; returns the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    crate::logging::init_from_env();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// A `--kv-cache` value: how caches store keys and values, `None` for `auto`.
#[derive(Debug, Clone, Copy)]
struct KvCacheArg(Option<kvcache::KvStorage>);

fn parse_kv_cache(text: &str) -> std::result::Result<KvCacheArg, String> {
    use kvcache::KvStorage;
    match text {
        "auto" => Ok(KvCacheArg(None)),
        "f32" => Ok(KvCacheArg(Some(KvStorage::Float(mlx::Dtype::F32)))),
        "f16" => Ok(KvCacheArg(Some(KvStorage::Float(mlx::Dtype::F16)))),
        "q8" => Ok(KvCacheArg(Some(KvStorage::Q8))),
        other => Err(format!(
            "unknown KV cache form `{other}` (known: auto, f32, f16, q8)"
        )),
    }
}

/// A `--draft` value: a built-in drafter, a draft model's name, or `none`.
#[derive(Debug, Clone, Default)]
struct DraftArg {
    /// The drafter; `None` for `none`.
    kind: Option<crate::engine::DrafterKind>,
    /// The draft model, when `kind` is one.
    model: Option<ModelName>,
}

impl DraftArg {
    /// The value a request's `draft` option takes for it.
    fn option_value(&self) -> String {
        match (&self.model, self.kind) {
            (Some(model), _) => model.to_string(),
            (None, Some(kind)) => kind.name(),
            (None, None) => "none".into(),
        }
    }

    /// How a request decodes with it.
    fn speculation(&self) -> crate::engine::Speculation {
        match self.kind {
            Some(drafter) => crate::engine::Speculation::On {
                drafter,
                max_depth: None,
            },
            None => crate::engine::Speculation::Off,
        }
    }
}

fn parse_draft(text: &str) -> std::result::Result<DraftArg, String> {
    match text {
        "none" | "off" => Ok(DraftArg::default()),
        name => match crate::engine::DrafterKind::parse(name) {
            Some(kind) => Ok(DraftArg {
                kind: Some(kind),
                model: None,
            }),
            None => ModelName::parse(name)
                .map(|model| DraftArg {
                    kind: Some(crate::engine::DrafterKind::Model),
                    model: Some(model),
                })
                .map_err(|_| {
                    format!(
                        "unknown drafter `{name}` (known: ngram, self:<layers>, none, \
                         or a draft model's name)"
                    )
                }),
        },
    }
}

fn run(command: Command) -> Result<()> {
    let store = Store::from_env()?;
    // What a crash left (and a crashed download's work folders); skipped while another
    // process writes the store.
    crate::store::leftovers::remove(&store)?;
    if let Some(cache) = quant::package::default_cache_dir() {
        let (folders, bytes) = quant::package::remove_abandoned(&cache);
        if folders > 0 {
            tracing::warn!(
                folders,
                bytes,
                "removed work folders of interrupted downloads"
            );
        }
    }
    match command {
        Command::Serve {
            host,
            cache_bytes,
            max_sequences,
            draft,
            kv_cache,
        } => {
            let mut config = loop_config(kv_cache);
            let mut default_draft = None;
            if let Some(draft) = draft {
                config.draft = draft.kind;
                if let Some(model) = draft.model {
                    ensure_pulled(&store, &model)?;
                    default_draft = Some(model);
                }
            }
            if let Some(text) = cache_bytes {
                config.memory.cache_bytes = crate::engine::memory::parse_bytes(&text)
                    .with_context(|| format!("--cache-bytes `{text}` is not a byte count"))?;
            }
            if let Some(n) = max_sequences {
                if n == 0 {
                    bail!("--max-sequences must be at least 1");
                }
                config.max_sequences = n;
            }
            runtime()?.block_on(serve(store, host, config, default_draft))
        }
        Command::Run {
            model,
            prompt,
            think,
            verbose,
            temperature,
            seed,
            num_predict,
            format,
            draft,
            kv_cache,
        } => {
            let name = ModelName::parse(&model)?;
            // Checked before the model loads: a typo should not cost a load.
            let format = format
                .map(|text| {
                    let value = match serde_json::from_str::<serde_json::Value>(&text) {
                        Ok(schema @ serde_json::Value::Object(_)) => schema,
                        _ => serde_json::Value::String(text),
                    };
                    structured::ollama_format(Some(&value)).map_err(|e| anyhow::anyhow!(e.message))
                })
                .transpose()?
                .flatten();
            ensure_pulled(&store, &name)?;
            let mut options = serde_json::Map::new();
            if let Some(t) = temperature {
                options.insert("temperature".into(), json!(t));
            }
            if let Some(s) = seed {
                options.insert("seed".into(), json!(s));
            }
            if let Some(n) = num_predict {
                options.insert("num_predict".into(), json!(n));
            }
            if let Some(draft) = draft {
                if let Some(model) = &draft.model {
                    ensure_pulled(&store, model)?;
                }
                options.insert("draft".into(), json!(draft.option_value()));
            }
            let prompt = prompt.join(" ");
            let requested = Requested {
                format,
                ..Requested::none()
            };
            let config = loop_config(kv_cache);
            runtime()?.block_on(async move {
                let state = app_state_with(store, config, None)?;
                chat(state, name, prompt, think, verbose, options, requested).await
            })
        }
        Command::Pull { model } => {
            let name = ModelName::parse(&model)?;
            pull_with_progress(&store, &name)
        }
        Command::Create {
            model,
            file,
            quantize,
            dry_run,
            quantize_draft,
        } => {
            let name = ModelName::parse(&model)?;
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let mut spec = Modelfile::parse(&text)?;
            // A relative FROM path is relative to the Modelfile.
            let base = file.parent().map(PathBuf::from).unwrap_or_default();
            if !spec.from.starts_with('/') && base.join(&spec.from).exists() {
                spec.from = base.join(&spec.from).display().to_string();
            }
            if let Some(draft) = &spec.draft
                && !draft.starts_with('/')
                && base.join(draft).exists()
            {
                spec.draft = Some(base.join(draft).display().to_string());
            }
            if dry_run {
                let from = crate::model_source::ModelSource::resolve(&spec.from, "FROM")?;
                let target = quantize.or_else(|| crate::create::default_target(&from));
                let plan = crate::create::plan(&store, &from, target)?;
                print!("{plan}");
                return Ok(());
            }
            let bar = Bars::new();
            let quantization = crate::create::Quantization {
                model: quantize,
                draft: quantize_draft,
            };
            crate::create_model::create_model(&store, &name, &spec, quantization, &mut |p| {
                bar.update(p)
            })
            .map_err(|e| anyhow::anyhow!(e.message))?;
            bar.finish();
            println!("created {name}");
            Ok(())
        }
        Command::Export {
            model,
            dir,
            dtype,
            quantized,
            layers,
        } => {
            let name = ModelName::parse(&model)?;
            ensure_pulled(&store, &name)?;
            let options = crate::export::ExportOptions {
                dtype: dtype.dtype(),
                quantized,
                layers,
            };
            let summary = crate::export::export(&store, &name, &dir, options)?;
            println!(
                "exported {name} to {}: {} tensors ({} matrices quantized), {}",
                dir.display(),
                summary.tensors,
                summary.quantized,
                human_bytes(summary.bytes)
            );
            Ok(())
        }
        Command::List => {
            println!(
                "{:<32} {:<14} {:>10}  {:<12} QUANT",
                "NAME", "ID", "SIZE", "FAMILY"
            );
            for entry in store.list()? {
                let digest = entry.manifest.digest();
                // Ollama's models are marked; one mlxkit cannot serve says why.
                let note = match (&entry.unusable, entry.from_ollama) {
                    (Some(reason), _) => format!("  (ollama; cannot serve: {reason})"),
                    (None, true) => "  (ollama)".to_string(),
                    (None, false) => String::new(),
                };
                println!(
                    "{:<32} {:<14} {:>10}  {:<12} {}{note}",
                    entry.name.to_string(),
                    digest.trim_start_matches("sha256:").get(..12).unwrap_or(""),
                    human_bytes(entry.manifest.size()),
                    entry.manifest.details.family,
                    entry.manifest.details.quantization_level,
                );
            }
            Ok(())
        }
        Command::Show { model, verbose } => {
            let name = ModelName::parse(&model)?;
            let entry = store.get(&name)?;
            let m = &entry.manifest;
            println!("  Model");
            println!("    architecture        {}", m.details.family);
            println!("    parameters          {}", m.details.parameter_size);
            println!("    context length      {}", m.details.context_length);
            println!("    quantization        {}", m.details.quantization_level);
            println!("    format              {:?}", m.format);
            println!("    size                {}", human_bytes(m.size()));
            println!("    source              {}", m.source);
            if !m.details.capabilities.is_empty() {
                println!(
                    "    capabilities        {}",
                    m.details.capabilities.join(", ")
                );
            }
            if let Some(draft) = &m.draft {
                println!("    draft model         {draft}");
            }
            if !m.parameters.is_empty() {
                println!("\n  Parameters");
                for (k, v) in &m.parameters {
                    println!("    {k:<20}{v}");
                }
            }
            if let Some(system) = &m.system {
                println!("\n  System\n    {system}");
            }
            if verbose {
                let view = store.materialize(m)?;
                let weights = crate::engine::from_store::weights_path(&view, m)
                    .with_context(|| format!("model `{name}` has no weights file"))?;
                let checkpoint = quant::Checkpoint::open(&weights)?;
                let source = quant::create::Source::read(&checkpoint)?;
                println!("\n  Tensors ({})", source.tensors.len());
                let width = source
                    .tensors
                    .iter()
                    .map(|t| t.name.len())
                    .max()
                    .unwrap_or(0);
                for t in &source.tensors {
                    let shape = format!("{:?}", t.shape);
                    println!("    {:width$}  {shape:16}  {}", t.name, t.stored.label());
                }
            }
            Ok(())
        }
        Command::Ps { host } => runtime()?.block_on(ps(host)),
        Command::Rm { models } => {
            let writer =
                store.lock(&mut || eprintln!("waiting for another change to the store"))?;
            for model in models {
                let name = ModelName::parse(&model)?;
                writer.remove(&name)?;
                println!("deleted '{name}'");
            }
            Ok(())
        }
        Command::Cp {
            source,
            destination,
        } => {
            let from = ModelName::parse(&source)?;
            let to = ModelName::parse(&destination)?;
            store
                .lock(&mut || eprintln!("waiting for another change to the store"))?
                .copy(&from, &to)?;
            println!("copied '{from}' to '{to}'");
            Ok(())
        }
        Command::Bench {
            model,
            prompt_tokens,
            prompt_ids,
            generate_tokens,
            runs,
            json,
            ignore_eos,
            concurrency,
            distinct,
            late_short,
            draft,
            replay,
            kv_cache,
        } => {
            if let Some(path) = replay {
                return replay_decisions(&path);
            }
            let name = ModelName::parse(&model)?;
            ensure_pulled(&store, &name)?;
            let draft = draft.unwrap_or_default();
            if let Some(model) = &draft.model {
                ensure_pulled(&store, model)?;
            }
            let prompt = match prompt_ids {
                Some(path) => BenchPrompt::Ids(read_prompt_ids(&path)?),
                None => BenchPrompt::Synthetic(prompt_tokens),
            };
            let config = loop_config(kv_cache);
            runtime()?.block_on(async move {
                let state = app_state_with(store, config, None)?;
                bench(
                    state,
                    name,
                    prompt,
                    BenchLength {
                        tokens: generate_tokens,
                        ignore_eos,
                        speculation: draft.speculation(),
                        draft_model: draft.model,
                    },
                    BenchStreams {
                        concurrency: concurrency.max(1),
                        distinct,
                        late_short,
                    },
                    runs.max(1),
                    json,
                )
                .await
            })
        }
        Command::Info { no_timing } => info(!no_timing),
    }
}

/// Pulls `name` from the catalog when the store lacks it.
fn ensure_pulled(store: &Store, name: &ModelName) -> Result<()> {
    match store.get(name) {
        Ok(_) => Ok(()),
        Err(crate::store::StoreError::NotFound(_)) => pull_with_progress(store, name),
        Err(e) => Err(e.into()),
    }
}

fn pull_with_progress(store: &Store, name: &ModelName) -> Result<()> {
    let bars = Bars::new();
    crate::pull::pull(store, name, &mut |p| bars.update(p))?;
    bars.finish();
    Ok(())
}

/// A status line, a byte bar for pulls, imports and loads, and a count bar (tensors
/// quantized by `create`) once something is counted.
struct Bars {
    bars: MultiProgress,
    bytes: ProgressBar,
    count: std::cell::OnceCell<ProgressBar>,
}

impl Bars {
    fn new() -> Bars {
        let bars = MultiProgress::new();
        let bytes = bars.add(ProgressBar::new(0));
        bytes.set_style(
            ProgressStyle::with_template("{msg:30} {bar:30} {bytes}/{total_bytes} {bytes_per_sec}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Bars {
            bars,
            bytes,
            count: std::cell::OnceCell::new(),
        }
    }

    fn update(&self, progress: PullProgress) {
        match progress {
            PullProgress::Status(status) => {
                // Printed above the bars; a closed terminal is no reason to fail the pull.
                let _ = self.bars.println(status);
            }
            PullProgress::Count { what, done, total } => {
                let bar = self.count.get_or_init(|| {
                    let bar = self
                        .bars
                        .insert_before(&self.bytes, ProgressBar::new(total));
                    bar.set_style(
                        ProgressStyle::with_template("{msg:30} {bar:30} {pos}/{len} eta {eta}")
                            .unwrap_or_else(|_| ProgressStyle::default_bar()),
                    );
                    bar
                });
                bar.set_message(what);
                bar.set_length(total.max(done));
                bar.set_position(done);
            }
            PullProgress::Bytes { what, done, total } => {
                self.bytes.set_message(what);
                self.bytes.set_length(total.max(done));
                self.bytes.set_position(done);
            }
        }
    }

    fn finish(&self) {
        if let Some(count) = self.count.get() {
            count.finish_and_clear();
        }
        self.bytes.finish_and_clear();
    }
}

fn human_bytes(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1} GB", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.0} MB", n / 1e6)
    } else {
        format!("{:.0} KB", n / 1e3)
    }
}

/// The engine's settings from the environment, with the command line's KV cache dtype.
fn loop_config(kv_cache: Option<KvCacheArg>) -> LoopConfig {
    LoopConfig {
        kv_storage: kv_cache.and_then(|arg| arg.0),
        ..LoopConfig::from_env()
    }
}

fn app_state_with(
    store: Store,
    config: LoopConfig,
    default_draft: Option<ModelName>,
) -> Result<AppState> {
    if mlx::blas_is_reference() {
        tracing::warn!(
            "this build found no OpenBLAS: f32 matmuls run on {}. Rebuild with a system \
             libopenblas.so.0 or with PyPI reachable (mlx-sys installs scipy-openblas32)",
            mlx::blas_name()
        );
    }
    let engine = Arc::new(Engine::with_config(config)?);
    let scheduler =
        Scheduler::with_default_draft(engine, store.clone(), QUEUE_CAPACITY, default_draft);
    Ok(AppState::new(store, scheduler))
}

async fn serve(
    store: Store,
    host: String,
    config: LoopConfig,
    default_draft: Option<ModelName>,
) -> Result<()> {
    use crate::server::{access::Access, limits, listen, stopping};
    let limits = limits::ConnectionLimits::from_env()?;
    let mut access = Access::from_env();
    // The name the server was told to bind is one its clients use.
    access.hosts.add(
        host.rsplit_once(':')
            .map_or(host.as_str(), |(name, _)| name),
    );
    let state = app_state_with(store, config, default_draft)?;
    let open_files = limits::raise_open_file_limit();
    let listener = listen::bind(&host)
        .await
        .with_context(|| format!("listening on {host}"))?;
    let address = listener.local_addr()?;
    eprintln!(
        "mlxkit {} listening on {address}",
        env!("CARGO_PKG_VERSION"),
    );
    if !address.ip().is_loopback() && access.api_key.is_none() {
        tracing::warn!(
            "listening on {address}, beyond this machine, with no API key: anyone who can reach \
             it can run and change models (set MLXKIT_API_KEY to require a key)"
        );
        eprintln!(
            "warning: the API on {address} is unauthenticated; set MLXKIT_API_KEY to require a key"
        );
    }
    if let Some(open_files) = open_files
        && (open_files as usize) < limits.max_connections + 64
    {
        tracing::warn!(
            "this process may open {open_files} files, fewer than {} connections need: past \
             that, idle connections are closed to make room",
            limits.max_connections
        );
    }
    // The first SIGINT or SIGTERM drains; a second one ends what is still running at once.
    let signals = stop_signals()?;
    let mut first = signals.clone();
    let mut second = signals;
    let serving = listen::serve_with(
        listener,
        crate::server::router_with(state, access),
        limits,
        async move {
            let _ = first.wait_for(|&n| n >= 1).await;
        },
        stopping::end_generations,
    );
    tokio::select! {
        served = serving => served.context("serving"),
        _ = second.wait_for(|&n| n >= 2) => {
            eprintln!("stopping now");
            stopping::end_generations();
            // A moment for the error events to leave.
            tokio::time::sleep(Duration::from_millis(500)).await;
            Ok(())
        }
    }
}

/// Counts the stop signals received (SIGINT, and SIGTERM where there is one), from now on.
fn stop_signals() -> Result<tokio::sync::watch::Receiver<u32>> {
    let (count, received) = tokio::sync::watch::channel(0u32);
    #[cfg(unix)]
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    tokio::spawn(async move {
        loop {
            #[cfg(unix)]
            let signal = tokio::select! {
                interrupt = tokio::signal::ctrl_c() => interrupt.map(|()| "SIGINT"),
                _ = terminate.recv() => Ok("SIGTERM"),
            };
            #[cfg(not(unix))]
            let signal = tokio::signal::ctrl_c().await.map(|()| "Ctrl-C");
            let Ok(signal) = signal else { return };
            count.send_modify(|n| *n += 1);
            let n = *count.borrow();
            if n == 1 {
                eprintln!("{signal}: finishing requests in progress (again to stop at once)");
            }
        }
    });
    Ok(received)
}

async fn ps(host: String) -> Result<()> {
    let url = format!("http://{host}/api/ps");
    let mut request = reqwest::Client::new().get(&url);
    // The server's key, when it needs one: the same variable serves both sides.
    if let Some(key) = std::env::var(crate::server::api_key::API_KEY_VARIABLE)
        .ok()
        .filter(|key| !key.trim().is_empty())
    {
        request = request.bearer_auth(key.trim());
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("is `mlxkit serve` running at {host}?"))?;
    let status = response.status();
    let body: serde_json::Value = response.json().await?;
    if !status.is_success() {
        bail!(
            "the server at {host} answered {status}: {}",
            body["error"].as_str().unwrap_or("no reason given")
        );
    }
    println!(
        "{:<32} {:>10}  {:<8} {:>7} {:>6} {:>12}  UNTIL",
        "NAME", "SIZE", "CONTEXT", "RUNNING", "QUEUED", "CACHE"
    );
    for m in body["models"].as_array().into_iter().flatten() {
        let count = |key: &str| m[key].as_u64().unwrap_or(0);
        println!(
            "{:<32} {:>10}  {:<8} {:>7} {:>6} {:>12}  {}",
            m["name"].as_str().unwrap_or(""),
            human_bytes(count("size")),
            count("context_length"),
            count("running_sequences"),
            count("queued_requests"),
            human_bytes(count("prefix_cache_bytes")),
            m["expires_at"].as_str().unwrap_or(""),
        );
    }
    Ok(())
}

/// One-shot or interactive chat, streamed to the terminal.
async fn chat(
    state: AppState,
    name: ModelName,
    prompt_text: String,
    think: bool,
    verbose: bool,
    options: serde_json::Map<String, serde_json::Value>,
    requested: Requested,
) -> Result<()> {
    let mut generation = GenerationOptions::default();
    let defaults: serde_json::Map<String, serde_json::Value> = state
        .store
        .get(&name)?
        .manifest
        .parameters
        .into_iter()
        .collect();
    generation
        .apply(&defaults)
        .map_err(|e| anyhow::anyhow!(e.message))?;
    generation
        .apply(&options)
        .map_err(|e| anyhow::anyhow!(e.message))?;
    let draft = generation.draft_model.clone();
    let started = Instant::now();
    let spinner = ProgressBar::new_spinner();
    spinner.set_message(format!("loading {name}"));
    spinner.enable_steady_tick(Duration::from_millis(100));
    let lease = state
        .scheduler
        .acquire_drafted(&name, draft.as_ref(), None)
        .await?;
    spinner.finish_and_clear();
    let load = started.elapsed();
    drop(lease);

    let mut history: Vec<tokenizer::Message> = Vec::new();
    let one_shot = !prompt_text.is_empty();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        let user = if one_shot {
            prompt_text.clone()
        } else {
            print!(">>> ");
            std::io::stdout().flush()?;
            match read_message(&mut lines)? {
                Some(text) if text.trim() == "/bye" => break,
                Some(text) if text.trim().is_empty() => continue,
                Some(text) => text,
                None => break,
            }
        };
        history.push(tokenizer::Message::new("user", user));
        let lease = state
            .scheduler
            .acquire_drafted(&name, draft.as_ref(), None)
            .await?;
        let info = lease.info.clone();
        let rendered = prompt::render_chat(&info, history.clone(), None, Some(think), &[])
            .map_err(|e| anyhow::anyhow!(e.message))?;
        prompt::check_context(&info, &rendered.tokens, generation.num_ctx)
            .map_err(|e| anyhow::anyhow!(e.message))?;
        let grammar = structured::prepare(&info, &requested, rendered.parser.as_ref())
            .await
            .map_err(|e| anyhow::anyhow!(e.message))?;
        let mut outputs = generation::start(
            lease,
            Prepared {
                prompt: rendered.tokens,
                options: generation.clone(),
                logprobs: None,
                parser: rendered.parser,
                grammar,
                turn_starts: rendered.turn_starts,
                images: rendered.images,
                started: Instant::now(),
                load,
            },
        )
        .map_err(|e| anyhow::anyhow!(e.message))?;
        let mut reply = String::new();
        let mut stdout = std::io::stdout();
        while let Some(output) = outputs.recv().await {
            match output {
                Output::Content(text, _) => {
                    reply.push_str(&text);
                    write!(stdout, "{text}")?;
                    stdout.flush()?;
                }
                Output::Thinking(text) => {
                    write!(stdout, "\x1b[2m{text}\x1b[0m")?;
                    stdout.flush()?;
                }
                Output::ToolCall(call) => {
                    writeln!(stdout, "[tool call] {} {}", call.name, call.arguments)?
                }
                Output::Done(summary) => {
                    writeln!(stdout)?;
                    if verbose {
                        let s = summary.stats;
                        eprintln!(
                            "load {:.2}s | prompt {} tokens ({} cached) in {:.2}s | {} tokens in {:.2}s, {:.1} tok/s | peak {}",
                            summary.load.as_secs_f64(),
                            s.prompt_tokens,
                            s.cached_tokens,
                            s.prompt_eval.as_secs_f64(),
                            s.generated_tokens,
                            s.eval.as_secs_f64(),
                            s.generated_tokens as f64 / s.eval.as_secs_f64().max(1e-9),
                            human_bytes(s.peak_memory as u64),
                        );
                        if let Some(spec) = &s.speculation {
                            let drafter = crate::server::generation::drafter_name(
                                spec,
                                summary.draft.as_ref(),
                            );
                            eprintln!(
                                "speculation {drafter}: {} rounds, {} of {} drafts accepted",
                                spec.rounds, spec.accepted, spec.drafted
                            );
                        }
                    }
                }
                Output::Error(message) => bail!(message),
            }
        }
        history.push(tokenizer::Message::new("assistant", reply));
        if one_shot {
            break;
        }
    }
    Ok(())
}

/// Reads one message; a line of `"""` starts and ends a multi-line message.
fn read_message(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
) -> Result<Option<String>> {
    let Some(first) = lines.next().transpose()? else {
        return Ok(None);
    };
    let Some(rest) = first.trim_start().strip_prefix("\"\"\"") else {
        return Ok(Some(first));
    };
    let mut text = rest.to_string();
    if let Some(end) = text.find("\"\"\"") {
        text.truncate(end);
        return Ok(Some(text));
    }
    for line in lines {
        let line = line?;
        if let Some(end) = line.find("\"\"\"") {
            text.push('\n');
            text.push_str(&line[..end]);
            return Ok(Some(text));
        }
        text.push('\n');
        text.push_str(&line);
    }
    Ok(Some(text))
}

/// What `bench` prompts with.
enum BenchPrompt {
    /// Synthetic text cut to this many tokens.
    Synthetic(usize),
    /// Exactly these token ids.
    Ids(Vec<u32>),
}

/// How much `bench` generates per run, and how.
#[derive(Clone)]
struct BenchLength {
    /// Tokens per run (fewer when the model ends first, unless `ignore_eos`).
    tokens: usize,
    /// Generate through end-of-sequence tokens.
    ignore_eos: bool,
    /// Speculative decoding or not.
    speculation: crate::engine::Speculation,
    /// The draft model loaded beside the model, when it drafts with one.
    draft_model: Option<ModelName>,
}

/// `bench --replay`: re-feeds a depth controller's decision log to the state it started from,
/// and prints what it decided, how often, and whether the replay agrees.
fn replay_decisions(path: &std::path::Path) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let log = speculate::DecisionLog::from_json(&text).with_context(|| {
        format!(
            "{} is not a depth controller's decision log",
            path.display()
        )
    })?;
    let mut by_depth = std::collections::BTreeMap::<usize, usize>::new();
    let (mut drafted, mut accepted, mut rounds) = (0, 0, 0);
    for event in log.events() {
        match *event {
            speculate::Event::Depth { depth, .. } => *by_depth.entry(depth).or_default() += 1,
            speculate::Event::Observe {
                depth, accepted: a, ..
            } => {
                rounds += 1;
                drafted += depth;
                accepted += a;
            }
        }
    }
    let replay = log.replay();
    println!(
        "{} events: {} decisions, {rounds} rounds, {accepted} of {drafted} drafts accepted",
        log.len(),
        replay.decisions
    );
    for (depth, count) in &by_depth {
        println!("  depth {depth:>2}: chosen {count} times");
    }
    let best: Vec<String> = [1, 2, 4, 8, 16]
        .iter()
        .map(|&batch| format!("batch {batch}: {}", replay.controller.best(batch)))
        .collect();
    println!("best depth now: {}", best.join(", "));
    println!(
        "expected tokens per round at each depth: {}",
        (0..=replay.controller.max_depth().min(8))
            .map(|d| format!("{d}: {:.2}", replay.controller.expected_tokens(d)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if replay.mismatches.is_empty() {
        println!("the replay reproduces every decision");
        Ok(())
    } else {
        bail!(
            "the replay differs at {} of {} decisions (first: event {:?})",
            replay.mismatches.len(),
            replay.decisions,
            replay.mismatches.first()
        )
    }
}

/// Reads a JSON array of token ids (`bench --prompt-ids`).
fn read_prompt_ids(path: &std::path::Path) -> Result<Vec<u32>> {
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
struct BenchStreams {
    /// Streams per run.
    concurrency: usize,
    /// Each stream with its own prompt.
    distinct: bool,
    /// One more stream with a short prompt, sent once the others decode.
    late_short: Option<usize>,
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
        .scheduler
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
    let mut outputs = generation::start(
        lease,
        Prepared {
            prompt,
            options,
            logprobs: None,
            parser: None,
            grammar: None,
            turn_starts: Vec::new(),
            images: Vec::new(),
            started: begin,
            load,
        },
    )
    .map_err(|e| anyhow::anyhow!(e.message))?;
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

/// `bench`: greedy runs over a synthetic prompt or given ids, one or several streams at once,
/// reported per run.
async fn bench(
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
        .scheduler
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
    let report = json!({
        "model": name.to_string(),
        "load_s": load.as_secs_f64(),
        "runs": results,
    });
    if as_json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("{name}: loaded in {:.2}s", load.as_secs_f64());
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

/// The system report: MLX version, device, the CPU kernel path and a matmul timing.
fn info(timing: bool) -> Result<()> {
    use mlx::{Device, Dtype, random};
    let version = mlx::version()?;
    let device = Device::best_available()?;
    device.set_default()?;
    println!("mlxkit {}", env!("CARGO_PKG_VERSION"));
    println!("MLX {version}");
    println!(
        "device: {device:?} (metal: {}, cuda: {})",
        mlx::metal_available()?,
        mlx::cuda_available()?
    );
    println!(
        "BLAS: {}; single-row f32 matmul via sgemv: {}",
        mlx::blas_name(),
        mlx::blas_gemv_forwarding()
    );
    // Chosen at run time from this CPU's features, capped by MLXKIT_CPU_KERNELS.
    println!(
        "CPU kernels: {:?}, {} threads, packed-matvec activations {:?}",
        mlx::cpu_kernels(),
        mlx::cpu_threads(),
        mlx::quantized::packed_activations()
    );
    // Per primitive: its vector kernel, a compiled loop, or MLX's own op and why (on a GPU, on
    // the GPU's path asked for by MLXKIT_CPU_PRIMITIVES=off, or with no kernel for this CPU).
    println!("CPU primitives ({}):", std::env::consts::ARCH);
    for (name, path) in mlx::cpu_primitive_paths() {
        println!("  {name:<18} {path}");
    }
    if !timing {
        return Ok(());
    }
    let dtype = if device == Device::Gpu {
        Dtype::Bf16
    } else {
        Dtype::F32
    };
    let n = 2048;
    let a = random::uniform(&[n, n], Dtype::F32, &random::key(0)?)?.astype(dtype)?;
    a.eval()?;
    a.matmul(&a)?.eval()?;
    let runs = 5;
    let start = Instant::now();
    for _ in 0..runs {
        a.matmul(&a)?.eval()?;
    }
    let seconds = start.elapsed().as_secs_f64() / f64::from(runs);
    println!(
        "matmul {n}x{n} {dtype:?}: {:.1} ms, {:.1} GFLOP/s",
        seconds * 1e3,
        2.0 * f64::from(n).powi(3) / seconds / 1e9
    );
    Ok(())
}
