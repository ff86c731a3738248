//! From parsed arguments to a finished command: one function per command, each turning flags
//! into the library's types and handing them to the part that does the work.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::cli::app::{app_state_with, loop_config, runtime};
use crate::cli::args::{BenchArgs, Command, CreateArgs, ExportArgs, GroupArgs, RunArgs, ServeArgs};
use crate::cli::bench::{BenchLength, BenchPrompt, BenchStreams, bench, read_prompt_ids};
use crate::cli::progress::Bars;
use crate::cli::{info, listing, repl, replay, serve};
use crate::group::hostfile::Hostfile;
use crate::group::rank_0::GroupLink;
use crate::group::{follower, forming};
use crate::model_keeper::ResidentLimits;
use crate::model_name::ModelName;
use crate::modelfile::Modelfile;
use crate::server::requested_shape::{self, Requested};
use crate::store::Store;

/// Rank 0's group, when `group` names a hostfile: checks it and the backend, points MLX at
/// it, and waits for every worker (see [`GroupLink::form`]). Must run before any thread starts.
/// `draft_model`: the command asked for a draft model, which a group does not serve yet.
fn form_group(
    group: &GroupArgs,
    parallel: crate::group::Parallel,
    draft_model: bool,
) -> Result<Option<std::sync::Arc<GroupLink>>> {
    let Some(path) = &group.hostfile else {
        return Ok(None);
    };
    if draft_model {
        bail!("draft models are not served across processes yet");
    }
    let hostfile = Hostfile::read(path).map_err(anyhow::Error::msg)?;
    forming::check_backend(group.backend).map_err(anyhow::Error::msg)?;
    forming::point_mlx_at(&hostfile, 0).map_err(anyhow::Error::msg)?;
    let timeout = Duration::from_secs(group.join_timeout);
    let link =
        GroupLink::form(&hostfile, group.backend, parallel, timeout).map_err(anyhow::Error::msg)?;
    Ok(Some(link))
}

/// `mlxkit worker`: joins the group of the hostfile as its rank, on an MLX worker thread, and
/// follows rank 0 until it closes the group.
fn worker_command(store: Store, group: GroupArgs) -> Result<()> {
    let Some(path) = &group.hostfile else {
        bail!("a worker needs the group's hostfile (--hostfile, or MLX_HOSTFILE)");
    };
    if group.rank == 0 {
        bail!("rank 0 serves the group (`mlxkit serve --hostfile`); a worker's rank is 1 or more");
    }
    let hostfile = Hostfile::read(path).map_err(anyhow::Error::msg)?;
    forming::check_backend(group.backend).map_err(anyhow::Error::msg)?;
    forming::point_mlx_at(&hostfile, group.rank).map_err(anyhow::Error::msg)?;
    let worker = mlx_thread::Worker::builder()
        .name(format!("mlx-rank-{}", group.rank))
        .spawn()?;
    let timeout = Duration::from_secs(group.join_timeout);
    worker
        .try_run(move || -> Result<(), String> {
            let device = mlx::Device::best_available().map_err(|e| e.to_string())?;
            device.set_default().map_err(|e| e.to_string())?;
            follower::follow(&store, &hostfile, group.rank, group.backend, timeout)
        })?
        .map_err(anyhow::Error::msg)
}

/// Runs `command` against the store `$MLXKIT_HOME` names.
pub(super) fn run(command: Command) -> Result<()> {
    let store = Store::from_env()?;
    remove_leftovers(&store)?;
    match command {
        Command::Serve(args) => serve_command(store, args),
        Command::Worker(args) => worker_command(store, args.group),
        Command::Run(args) => run_command(store, args),
        Command::Pull { model } => pull_with_progress(&store, &ModelName::parse(&model)?),
        Command::Create(args) => create(&store, args),
        Command::Export(args) => export(&store, args),
        Command::List => listing::list(&store),
        Command::Show { model, verbose } => {
            listing::show(&store, &ModelName::parse(&model)?, verbose)
        }
        Command::Ps { host } => runtime()?.block_on(listing::ps(host)),
        Command::Rm { models } => remove(&store, &models),
        Command::Cp {
            source,
            destination,
        } => copy(&store, &source, &destination),
        Command::Bench(args) => bench_command(store, args),
        Command::Info { no_timing } => info::info(!no_timing),
    }
}

/// What a crash left (and a crashed download's work folders); skipped while another process
/// writes the store.
fn remove_leftovers(store: &Store) -> Result<()> {
    crate::store::leftovers::remove(store)?;
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
    Ok(())
}

fn serve_command(store: Store, args: ServeArgs) -> Result<()> {
    if args.group.hostfile.is_some() && args.group.rank != 0 {
        // `mlx.launch` runs the same command on every host: the other ranks serve as workers.
        return worker_command(store, args.group);
    }
    let draft_model = args.draft.as_ref().is_some_and(|d| d.model.is_some());
    let group = form_group(&args.group, args.parallel, draft_model)?;
    let mut config = loop_config(args.kv_cache);
    let mut default_draft = None;
    if let Some(draft) = args.draft {
        config.draft = draft.kind;
        if let Some(model) = draft.model {
            ensure_pulled(&store, &model)?;
            default_draft = Some(model);
        }
    }
    if let Some(text) = args.cache_bytes {
        config.memory.cache_bytes = Some(
            crate::engine::memory::parse_bytes(&text)
                .with_context(|| format!("--cache-bytes `{text}` is not a byte count"))?,
        );
    }
    if let Some(n) = args.max_sequences {
        if n == 0 {
            bail!("--max-sequences must be at least 1");
        }
        config.max_sequences = n;
    }
    let mut limits = ResidentLimits::from_env();
    if let Some(n) = args.max_loaded_models {
        if n == 0 {
            bail!("--max-loaded-models must be at least 1");
        }
        limits.max_models = n;
    }
    if group.is_some() {
        // The workers hold one model's parts at a time.
        limits.max_models = 1;
    }
    let default_model = args
        .default_model
        .as_deref()
        .map(|text| -> Result<ModelName> {
            let name = ModelName::parse(text).context("--default-model")?;
            ensure_pulled(&store, &name)?;
            Ok(name)
        })
        .transpose()?;
    runtime()?.block_on(serve::serve(
        store,
        args.host,
        config,
        limits,
        default_draft,
        default_model,
        group,
    ))
}

fn run_command(store: Store, args: RunArgs) -> Result<()> {
    let name = ModelName::parse(&args.model)?;
    // Checked before the model loads: a typo should not cost a load.
    let format = args
        .format
        .map(|text| {
            let value = match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(schema @ serde_json::Value::Object(_)) => schema,
                _ => serde_json::Value::String(text),
            };
            requested_shape::ollama_format(Some(&value))
        })
        .transpose()?
        .flatten();
    ensure_pulled(&store, &name)?;
    let mut options = serde_json::Map::new();
    if let Some(t) = args.temperature {
        options.insert("temperature".into(), json!(t));
    }
    if let Some(s) = args.seed {
        options.insert("seed".into(), json!(s));
    }
    if let Some(n) = args.num_predict {
        options.insert("num_predict".into(), json!(n));
    }
    if let Some(draft) = args.draft {
        if let Some(model) = &draft.model {
            ensure_pulled(&store, model)?;
        }
        options.insert("draft".into(), json!(draft.option_value()));
    }
    let prompt = args.prompt.join(" ");
    let requested = Requested {
        format,
        ..Requested::none()
    };
    let config = loop_config(args.kv_cache);
    let (think, verbose) = (args.think, args.verbose);
    runtime()?.block_on(async move {
        let state = app_state_with(store, config, ResidentLimits::from_env(), None, None)?;
        repl::chat(state, name, prompt, think, verbose, options, requested).await
    })
}

fn create(store: &Store, args: CreateArgs) -> Result<()> {
    let name = ModelName::parse(&args.model)?;
    let file = &args.file;
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
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
    if args.dry_run {
        let from = crate::model_source::ModelSource::resolve(&spec.from, "FROM")?;
        let target = args
            .quantize
            .or_else(|| crate::create::default_target(&from));
        let plan = crate::create::plan(store, &from, target)?;
        print!("{plan}");
        return Ok(());
    }
    let bar = Bars::new();
    let quantization = crate::create::Quantization {
        model: args.quantize,
        draft: args.quantize_draft,
    };
    crate::create_model::create_model(store, &name, &spec, quantization, &mut |p| bar.update(p))?;
    bar.finish();
    println!("created {name}");
    Ok(())
}

fn export(store: &Store, args: ExportArgs) -> Result<()> {
    let name = ModelName::parse(&args.model)?;
    ensure_pulled(store, &name)?;
    let options = crate::export::ExportOptions {
        dtype: args.dtype.dtype(),
        quantized: args.quantized,
        layers: args.layers,
    };
    let summary = crate::export::export(store, &name, &args.dir, options)?;
    println!(
        "exported {name} to {}: {} tensors ({} matrices quantized), {}",
        args.dir.display(),
        summary.tensors,
        summary.quantized,
        listing::human_bytes(summary.bytes)
    );
    Ok(())
}

fn remove(store: &Store, models: &[String]) -> Result<()> {
    let writer = store.lock(&mut || eprintln!("waiting for another change to the store"))?;
    for model in models {
        let name = ModelName::parse(model)?;
        writer.remove(&name)?;
        println!("deleted '{name}'");
    }
    Ok(())
}

fn copy(store: &Store, source: &str, destination: &str) -> Result<()> {
    let from = ModelName::parse(source)?;
    let to = ModelName::parse(destination)?;
    store
        .lock(&mut || eprintln!("waiting for another change to the store"))?
        .copy(&from, &to)?;
    println!("copied '{from}' to '{to}'");
    Ok(())
}

fn bench_command(store: Store, args: BenchArgs) -> Result<()> {
    if let Some(path) = args.replay {
        return replay::replay_decisions(&path);
    }
    if args.group.hostfile.is_some() && args.group.rank != 0 {
        return worker_command(store, args.group);
    }
    let name = ModelName::parse(&args.model)?;
    ensure_pulled(&store, &name)?;
    let draft = args.draft.unwrap_or_default();
    if let Some(model) = &draft.model {
        ensure_pulled(&store, model)?;
    }
    let prompt = match args.prompt_ids {
        Some(path) => BenchPrompt::Ids(read_prompt_ids(&path)?),
        None => BenchPrompt::Synthetic(args.prompt_tokens),
    };
    let length = BenchLength {
        tokens: args.generate_tokens,
        ignore_eos: args.ignore_eos,
        speculation: draft.speculation(),
        draft_model: draft.model,
    };
    let streams = BenchStreams {
        concurrency: args.concurrency.max(1),
        distinct: args.distinct,
        late_short: args.late_short,
    };
    let (runs, as_json) = (args.runs.max(1), args.json);
    let group = form_group(&args.group, args.parallel, length.draft_model.is_some())?;
    let config = loop_config(args.kv_cache);
    runtime()?.block_on(async move {
        let state = app_state_with(store, config, ResidentLimits::from_env(), None, group)?;
        bench(state, name, prompt, length, streams, runs, as_json).await
    })
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
