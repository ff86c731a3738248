//! `create --quantize`, and `create` from a GGUF file: a model rewritten through `quant`'s
//! pipeline (read, classify, plan, write) into a scratch folder under the store, given its
//! vocabulary, then its files stored as blobs. No manifest is written here (the caller writes
//! one, complete, once every check has passed), and the scratch folder goes whether or not it
//! succeeds; a crash leaves it to the next start's tidy.

use std::path::{Path, PathBuf};

use quant::create::{Plan, Source, Target, write_folder};

use crate::engine::from_store::weights_path;
use crate::fault::{self, Point};
use crate::model_source::{ModelSource, UnusableSource};
use crate::pull::PullProgress;
use crate::store::{Manifest, Store, StoreWriter};

/// What a create quantizes: the model's weights, and its draft's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quantization {
    /// `--quantize`.
    pub model: Option<Target>,
    /// `--quantize-draft`.
    pub draft: Option<Target>,
}

/// What a quantizing create failed on.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// `FROM` names nothing this server can read.
    #[error(transparent)]
    UnknownSource(#[from] UnusableSource),
    /// The store refused.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The checkpoint could not be read, planned or written.
    #[error("{0}")]
    Quant(#[from] quant::Error),
    /// The vocabulary could not be written beside the weights.
    #[error("{0}")]
    Vocabulary(#[from] crate::export::ExportError),
    /// The scratch folder could not be made.
    #[error("{path}: {source}")]
    Io {
        /// The folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The written folder could not be stored.
    #[error("{0}")]
    Import(#[from] crate::import::ImportError),
}

/// A checkpoint to quantize, opened once, and where its vocabulary is: the GGUF file itself,
/// or the folder holding `tokenizer.json` and its companions.
struct Located {
    checkpoint: quant::Checkpoint,
    vocabulary: PathBuf,
}

/// Opens `from` (a GGUF file, a transformers / mlx-lm folder or one of its safetensors files,
/// or a stored model).
fn locate(store: &Store, from: &ModelSource) -> Result<Located, CreateError> {
    let weights = match from {
        ModelSource::Gguf(path) | ModelSource::Safetensors(path) => path.clone(),
        ModelSource::Stored(name) => {
            let entry = store.get(name)?;
            let view = store.materialize(&entry.manifest)?;
            weights_path(&view, &entry.manifest).ok_or_else(|| UnusableSource {
                keyword: "FROM",
                text: name.to_string(),
            })?
        }
    };
    let checkpoint = quant::Checkpoint::open(&weights)?;
    let vocabulary = match checkpoint.format() {
        quant::Format::Safetensors if !weights.is_dir() => weights
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        _ => weights,
    };
    Ok(Located {
        checkpoint,
        vocabulary,
    })
}

/// The quantization a create without `--quantize` still applies to the checkpoint `from`
/// (FP8 sources become mxfp8, NVFP4 ones nvfp4); `None` for every other source (stored models
/// included), and for sources that cannot be read, which the import then refuses with its own
/// message.
pub fn default_target(from: &ModelSource) -> Option<Target> {
    let checkpoint = quant::Checkpoint::open(from.path()?).ok()?;
    Source::read(&checkpoint).ok()?.default_target()
}

/// The plan for quantizing `from` to `target`, or for writing it as it loads (`None`), without
/// writing anything (`--dry-run`).
pub fn plan(
    store: &Store,
    from: &ModelSource,
    target: Option<Target>,
) -> Result<Plan, CreateError> {
    let located = locate(store, from)?;
    let source = Source::read(&located.checkpoint)?;
    Ok(match target {
        Some(target) => Plan::new(&source, target),
        None => Plan::as_loaded(&source),
    })
}

/// Rewrites `from` into MLX's layouts, quantized to `target` or (`None`, for a GGUF file) as
/// it loads, and stores its files as blobs; returns the manifest, not yet written (the caller
/// completes it with the Modelfile's settings and writes it). `from_text` is recorded as its
/// source.
pub fn convert(
    writer: &StoreWriter<'_>,
    from: &ModelSource,
    from_text: &str,
    target: Option<Target>,
    progress: &mut dyn FnMut(PullProgress),
) -> Result<Manifest, CreateError> {
    let Located {
        checkpoint,
        vocabulary,
    } = locate(writer, from)?;
    let source = Source::read(&checkpoint)?;
    let (plan, verb) = match target {
        Some(target) => (Plan::new(&source, target), "quantizing"),
        None => (Plan::as_loaded(&source), "converting"),
    };
    progress(PullProgress::Status(format!(
        "{verb} {} to {}: about {:.0} MB",
        plan.architecture,
        target.map_or("MLX layouts", Target::name),
        plan.written_bytes() as f64 / 1e6
    )));
    let scratch = scratch(writer)?;
    // The vocabulary first: a GGUF file without one fails before its weights are written.
    match checkpoint.format() {
        quant::Format::Gguf => {
            crate::export::write_gguf_vocabulary(&vocabulary, scratch.path(), checkpoint.config())?
        }
        quant::Format::Safetensors => crate::export::copy_vocabulary(&vocabulary, scratch.path())?,
    }
    let written = write_folder(&checkpoint, &plan, scratch.path(), &mut |done, total, _| {
        progress(PullProgress::Count {
            what: format!("{verb} tensors"),
            done: done as u64,
            total: total as u64,
        })
    })?;
    fault::reached(Point::Scratch);
    tracing::info!(
        from = from_text,
        tensors = written.tensors,
        quantized = written.quantized,
        bytes = written.bytes,
        "{verb}"
    );
    let mut manifest = crate::import::import_manifest(
        writer,
        scratch.path(),
        from_text,
        None,
        &mut |what, done, total| {
            progress(PullProgress::Bytes {
                what: what.to_string(),
                done,
                total,
            })
        },
    )?;
    // A converted GGUF holds the same values it did: it is still, say, Q4_K_M.
    manifest.details.quantization_level = match target {
        Some(target) => target.name().to_string(),
        None => crate::checkpoint_details::quantization_level(&checkpoint),
    };
    Ok(manifest)
}

/// A folder under the store's `tmp/` (on the same file system as its blobs), removed with
/// everything in it when dropped. Made under the writer lock, so a tidy at start-up (which
/// takes the lock) never removes one in use.
fn scratch(store: &StoreWriter<'_>) -> Result<tempfile::TempDir, CreateError> {
    let parent = store.root().join("tmp");
    std::fs::create_dir_all(&parent)
        .and_then(|()| {
            tempfile::Builder::new()
                .prefix("create-")
                .tempdir_in(&parent)
        })
        .map_err(|source| CreateError::Io {
            path: parent,
            source,
        })
}
