//! The commands and flags `mlxkit` takes, and the parsers of flag values that need more than
//! clap's own.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::model_name::ModelName;

/// The model `run` uses when none is named.
pub const DEFAULT_MODEL: &str = "smollm2:135m";

/// Where `serve` listens and the other commands find it.
const DEFAULT_HOST: &str = "127.0.0.1:11434";

#[derive(Parser)]
#[command(
    name = "mlxkit",
    version,
    about = "Run large language models on MLX, with Ollama's and OpenAI's APIs"
)]
pub(super) struct Cli {
    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Subcommand)]
pub(super) enum Command {
    /// Serve Ollama's and OpenAI's HTTP APIs.
    Serve(ServeArgs),
    /// Hold a part of the models a group's rank 0 serves (`serve --hostfile`), on this
    /// process: it runs every forward rank 0 tells it until rank 0 closes the group.
    Worker(WorkerArgs),
    /// Chat with a model (pulled first if needed): one prompt, or an interactive session.
    Run(RunArgs),
    /// Download a model from the catalog.
    Pull {
        /// The model.
        model: String,
    },
    /// Create a model from a Modelfile (FROM a GGUF file, converted into MLX's layouts once, a
    /// transformers folder or a model).
    Create(CreateArgs),
    /// Write a stored model out as a transformers / mlx-lm folder (config.json,
    /// model.safetensors, tokenizer.json).
    Export(ExportArgs),
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
    Bench(BenchArgs),
    /// Report the MLX version, the device, each CPU primitive's path and a matmul timing.
    Info {
        /// Leave out the matmul timing (seconds of work natively, minutes under emulation).
        #[arg(long)]
        no_timing: bool,
    },
}

// `serve`: where to listen and how the engine runs.
#[derive(clap::Args)]
pub(super) struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "MLXKIT_HOST", default_value = DEFAULT_HOST)]
    pub(super) host: String,
    /// Bytes each model's prefix cache keeps between requests (`4G`, `512M`; default: 32,768
    /// tokens of the model's keys and values, at most a quarter of the device's memory and
    /// 8 GiB).
    #[arg(long, env = "MLXKIT_CACHE_BYTES")]
    pub(super) cache_bytes: Option<String>,
    /// Models resident at once (default 3); a model that does not fit beside them unloads
    /// the least recently used idle one.
    #[arg(long, env = "MLXKIT_MAX_LOADED_MODELS")]
    pub(super) max_loaded_models: Option<usize>,
    /// Requests decoded at once; more wait in the queue.
    #[arg(long, env = "MLXKIT_MAX_SEQUENCES")]
    pub(super) max_sequences: Option<usize>,
    /// Decode speculatively with this drafter unless a request says otherwise (`ngram`:
    /// prompt lookup; `mtp`: the head the model's checkpoint ships; `none`: plain decoding).
    #[arg(long, env = "MLXKIT_DRAFT", value_parser = parse_draft)]
    pub(super) draft: Option<DraftArg>,
    /// How KV caches store keys and values: `f32`, `f16` (half the memory and the
    /// attention reads, at a rounding of about 3 significant digits), `q8` (8-bit codes
    /// per group of 32: under a third of f32's memory, dequantized for each step's
    /// attention), or `auto` (the dtype the model computes in).
    #[arg(long, env = "MLXKIT_KV_CACHE", value_parser = parse_kv_cache)]
    pub(super) kv_cache: Option<KvCacheArg>,
    /// Serve requests that name a hosted model no stored model is called (`claude-…`,
    /// `gpt-…`, as Claude Code and Codex send by default) with this model (pulled first if
    /// needed).
    #[arg(long, env = "MLXKIT_DEFAULT_MODEL")]
    pub(super) default_model: Option<String>,
    #[command(flatten)]
    pub(super) group: GroupArgs,
    /// How a model is split across the hostfile's processes: `tensor` (each holds a slice of
    /// every layer) or `pipeline` (each holds a range of layers).
    #[arg(long, default_value = "tensor", value_parser = parse_parallel)]
    pub(super) parallel: crate::group::Parallel,
}

/// Where a process stands in a group of processes serving one model.
#[derive(clap::Args)]
pub(super) struct GroupArgs {
    /// Split every model across the processes this hostfile names (the JSON `mlx.launch`
    /// reads: `[{"ssh": "mac1", "ips": ["10.0.0.1"]}, ...]`, or the ring's
    /// `[["10.0.0.1:32323"], ...]`); this process is rank `--rank`, the others run
    /// `mlxkit worker`.
    #[arg(long, env = "MLX_HOSTFILE")]
    pub(super) hostfile: Option<PathBuf>,
    /// This process's rank in the hostfile (`mlx.launch` sets `MLX_RANK`).
    #[arg(long, env = "MLX_RANK", default_value_t = 0)]
    pub(super) rank: usize,
    /// MLX's distributed backend: `ring` (TCP), `mpi`, `nccl` (CUDA) or `jaccl` (RDMA over
    /// Thunderbolt).
    #[arg(long, default_value = "ring", value_parser = parse_backend)]
    pub(super) backend: mlx::distributed::Backend,
    /// Seconds to wait for every process of the group to join.
    #[arg(long, default_value_t = 120)]
    pub(super) join_timeout: u64,
}

// `worker`: where this process stands in the group.
#[derive(clap::Args)]
pub(super) struct WorkerArgs {
    #[command(flatten)]
    pub(super) group: GroupArgs,
}

// `run`: the model, the prompt and how to sample.
#[derive(clap::Args)]
pub(super) struct RunArgs {
    /// The model.
    #[arg(default_value = DEFAULT_MODEL)]
    pub(super) model: String,
    /// A prompt; without one, an interactive chat starts.
    pub(super) prompt: Vec<String>,
    /// Show the model's reasoning, for models that think.
    #[arg(long)]
    pub(super) think: bool,
    /// Print prompt and generation statistics at the end.
    #[arg(long)]
    pub(super) verbose: bool,
    /// Sampling temperature (0 = greedy).
    #[arg(long)]
    pub(super) temperature: Option<f32>,
    /// Random seed.
    #[arg(long)]
    pub(super) seed: Option<u64>,
    /// The most tokens to generate.
    #[arg(long)]
    pub(super) num_predict: Option<usize>,
    /// Constrain answers: `json` for any JSON object, or a JSON Schema as JSON text.
    #[arg(long)]
    pub(super) format: Option<String>,
    /// Decode speculatively with this drafter (`ngram`: prompt lookup; `mtp`: the head the
    /// model's checkpoint ships).
    #[arg(long, value_parser = parse_draft)]
    pub(super) draft: Option<DraftArg>,
    /// How KV caches store keys and values: `f32`, `f16` (half the memory and the
    /// attention reads, at a rounding of about 3 significant digits), `q8` (8-bit codes
    /// per group of 32: under a third of f32's memory, dequantized for each step's
    /// attention), or `auto` (the dtype the model computes in).
    #[arg(long, env = "MLXKIT_KV_CACHE", value_parser = parse_kv_cache)]
    pub(super) kv_cache: Option<KvCacheArg>,
}

// `create`: the new model, its Modelfile and how to quantize.
#[derive(clap::Args)]
pub(super) struct CreateArgs {
    /// The new model's name.
    pub(super) model: String,
    /// The Modelfile.
    #[arg(short = 'f', long = "file", default_value = "Modelfile")]
    pub(super) file: PathBuf,
    /// Quantize the weights: int4, int8, mxfp4, mxfp8 or nvfp4 (embeddings, norms and
    /// encoders stay as they are; the head and, under int4, k/v/down projections get 8 bits).
    #[arg(short = 'q', long, value_name = "TYPE")]
    pub(super) quantize: Option<quant::create::Target>,
    /// Print what create would do to each tensor (quantize it, convert a GGUF block type
    /// into MLX's layout, keep it), and write nothing.
    #[arg(long)]
    pub(super) dry_run: bool,
    /// Quantize the Modelfile's DRAFT model too (stored beside the model as
    /// <model>-draft).
    #[arg(long, value_name = "TYPE")]
    pub(super) quantize_draft: Option<quant::create::Target>,
}

// `export`: the model, the folder and the layout.
#[derive(clap::Args)]
pub(super) struct ExportArgs {
    /// The model.
    pub(super) model: String,
    /// The folder to write (created if missing).
    pub(super) dir: PathBuf,
    /// The dtype of dense weights and of quantization scales.
    #[arg(long, value_enum, default_value_t = ExportDtype::F32)]
    pub(super) dtype: ExportDtype,
    /// Keep quantized matrices quantized, in mlx-lm's layout, instead of dequantizing them.
    #[arg(long)]
    pub(super) quantized: bool,
    /// Keep only the first N decoder layers: a truncated copy with the same vocabulary,
    /// to `create` and use as a draft model.
    #[arg(long, value_name = "N")]
    pub(super) layers: Option<usize>,
}

// `bench`: what to measure, how long and how many at once.
#[derive(clap::Args)]
pub(super) struct BenchArgs {
    /// The model.
    #[arg(default_value = DEFAULT_MODEL)]
    pub(super) model: String,
    /// Prompt tokens.
    #[arg(long, default_value_t = 512)]
    pub(super) prompt_tokens: usize,
    /// A JSON array of prompt token ids to use instead of the synthetic prompt, so that
    /// another engine can be given exactly the same prompt. The last run uses them
    /// unchanged; earlier runs change one token.
    #[arg(long, conflicts_with = "prompt_tokens")]
    pub(super) prompt_ids: Option<PathBuf>,
    /// Generated tokens.
    #[arg(long, default_value_t = 128)]
    pub(super) generate_tokens: usize,
    /// Repetitions (the first is reported separately as cold).
    #[arg(long, default_value_t = 3)]
    pub(super) runs: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(super) json: bool,
    /// Keep generating through end-of-sequence tokens, so every run has the asked length.
    #[arg(long)]
    pub(super) ignore_eos: bool,
    /// Streams at once per run; the report adds aggregate decode tok/s and TTFT p50/p95.
    #[arg(long, default_value_t = 1)]
    pub(super) concurrency: usize,
    /// With `--concurrency`: give each stream its own prompt (one token changed) instead
    /// of the same one.
    #[arg(long)]
    pub(super) distinct: bool,
    /// With `--concurrency`: one more stream, a short prompt of this many tokens sent once
    /// the others decode; its time to first token is reported apart.
    #[arg(long)]
    pub(super) late_short: Option<usize>,
    /// Decode speculatively with this drafter (default: plain decoding).
    #[arg(long, value_parser = parse_draft)]
    pub(super) draft: Option<DraftArg>,
    /// Instead of benchmarking, replay a depth controller's decision log (the server keeps
    /// one per model and drafter: `$MLXKIT_HOME/state/<digest>/ngram.log.json`) and report
    /// its decisions and whether the controller reproduces them.
    #[arg(long, conflicts_with_all = ["draft", "concurrency"])]
    pub(super) replay: Option<PathBuf>,
    /// How KV caches store keys and values: `f32`, `f16` (half the memory and the
    /// attention reads, at a rounding of about 3 significant digits), `q8` (8-bit codes
    /// per group of 32: under a third of f32's memory, dequantized for each step's
    /// attention), or `auto` (the dtype the model computes in).
    #[arg(long, env = "MLXKIT_KV_CACHE", value_parser = parse_kv_cache)]
    pub(super) kv_cache: Option<KvCacheArg>,
    /// Runs the model split across the hostfile's processes, as `serve --hostfile` does, and
    /// reports every rank's peak memory.
    #[command(flatten)]
    pub(super) group: GroupArgs,
    /// How a model is split across the hostfile's processes (`tensor` or `pipeline`).
    #[arg(long, default_value = "tensor", value_parser = parse_parallel)]
    pub(super) parallel: crate::group::Parallel,
}

/// The dtypes `export` writes.
#[derive(Clone, Copy, clap::ValueEnum)]
pub(super) enum ExportDtype {
    F32,
    Bf16,
    F16,
}

impl ExportDtype {
    pub(super) fn dtype(self) -> mlx::Dtype {
        match self {
            ExportDtype::F32 => mlx::Dtype::F32,
            ExportDtype::Bf16 => mlx::Dtype::Bf16,
            ExportDtype::F16 => mlx::Dtype::F16,
        }
    }
}

/// A `--kv-cache` value: how caches store keys and values, `None` for `auto`.
#[derive(Debug, Clone, Copy)]
pub(super) struct KvCacheArg(pub(super) Option<kvcache::KvStorage>);

fn parse_parallel(text: &str) -> std::result::Result<crate::group::Parallel, String> {
    match text {
        "tensor" => Ok(crate::group::Parallel::Tensor),
        "pipeline" => Ok(crate::group::Parallel::Pipeline),
        other => Err(format!("`{other}` is not `tensor` or `pipeline`")),
    }
}

fn parse_backend(text: &str) -> std::result::Result<mlx::distributed::Backend, String> {
    mlx::distributed::Backend::parse(text)
        .ok_or_else(|| format!("`{text}` is not `ring`, `mpi`, `nccl` or `jaccl`"))
}

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
pub(super) struct DraftArg {
    /// The drafter; `None` for `none`.
    pub(super) kind: Option<crate::engine::DrafterKind>,
    /// The draft model, when `kind` is one.
    pub(super) model: Option<ModelName>,
}

impl DraftArg {
    /// The value a request's `draft` option takes for it.
    pub(super) fn option_value(&self) -> String {
        match (&self.model, self.kind) {
            (Some(model), _) => model.to_string(),
            (None, Some(kind)) => kind.name(),
            (None, None) => "none".into(),
        }
    }

    /// How a request decodes with it.
    pub(super) fn speculation(&self) -> crate::engine::Speculation {
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
