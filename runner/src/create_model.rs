//! `create` from a Modelfile: the model's weights imported from a path (converted or
//! quantized when asked, or when the source is GGUF, FP8 or NVFP4) or taken from a stored
//! model, completed with the Modelfile's settings, checked, and written.
//!
//! It all happens under the store's writer lock, and the manifest is written once, complete,
//! after every check has passed: a failed create leaves the store's models exactly as they
//! were (blobs it added that nothing names are collected), a crash leaves the old manifest or
//! the new one, and a `rm` of the base model waits until the new model names its blobs.

use std::time::SystemTime;

use serde_json::Value;

use crate::create::Quantization;
use crate::fault::{self, Point};
use crate::model_name::ModelName;
use crate::model_source::ModelSource;
use crate::modelfile::Modelfile;
use crate::pull::PullProgress;
use crate::store::{Manifest, Store, StoreError, StoreWriter};
use crate::timestamp::rfc3339;

/// Why a create failed.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The Modelfile, its sources or its draft cannot make a model: the caller's to fix.
    #[error("{0}")]
    Refused(String),
    /// The store failed (or the base model is missing).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<crate::model_name::InvalidName> for CreateError {
    fn from(e: crate::model_name::InvalidName) -> CreateError {
        CreateError::Refused(e.to_string())
    }
}

/// Creates `name` from `spec`. A `DRAFT` path, or any draft with `quantization.draft`, is
/// stored beside it as `<name>-draft`. When anything fails, the store's models stay as they
/// were.
pub fn create_model(
    store: &Store,
    name: &ModelName,
    spec: &Modelfile,
    quantization: Quantization,
    progress: &mut dyn FnMut(PullProgress),
) -> Result<(), CreateError> {
    let writer = store.lock(&mut || {
        progress(PullProgress::Status(
            "waiting for another change to the store to finish".into(),
        ))
    })?;
    let mut added: Vec<Manifest> = Vec::new();
    let result = create_locked(&writer, name, spec, quantization, progress, &mut added);
    if result.is_err() {
        // Blobs this create added that no manifest names (the others stay).
        let _ = writer.collect(
            added
                .iter()
                .flat_map(|m| m.layers.iter().map(|l| l.digest.clone())),
        );
    }
    result
}

fn create_locked(
    writer: &StoreWriter<'_>,
    name: &ModelName,
    spec: &Modelfile,
    quantization: Quantization,
    progress: &mut dyn FnMut(PullProgress),
    added: &mut Vec<Manifest>,
) -> Result<(), CreateError> {
    // Cheap checks first, before any weights are read.
    if let Some(template) = &spec.template {
        tokenizer::ChatTemplate::check(template)
            .map_err(|e| CreateError::Refused(format!("TEMPLATE: {e}")))?;
    }
    let from = ModelSource::resolve(&spec.from, "FROM")
        .map_err(|e| CreateError::Refused(e.to_string()))?;
    let draft_source = spec
        .draft
        .as_deref()
        .map(|d| ModelSource::resolve(d, "DRAFT").map_err(|e| CreateError::Refused(e.to_string())))
        .transpose()?;
    let mut manifest = weights(
        writer,
        &from,
        &spec.from,
        quantization.model,
        progress,
        added,
    )?;
    if let Some(template) = &spec.template {
        manifest.template = Some(template.clone());
    }
    if spec.system.is_some() {
        manifest.system = spec.system.clone();
    }
    manifest.parameters.extend(spec.parameters.clone());
    // A draft stored beside the model: written just before it, once everything is checked.
    let mut beside: Option<(ModelName, Manifest)> = None;
    if let (Some(draft), Some(source)) = (&spec.draft, &draft_source) {
        let stored_beside = source.path().is_some() || quantization.draft.is_some();
        manifest.draft = Some(if stored_beside {
            let draft_name = ModelName {
                name: format!("{}-draft", name.name),
                tag: name.tag.clone(),
            };
            progress(PullProgress::Status(format!(
                "storing draft {draft} as {draft_name}"
            )));
            let draft_manifest =
                weights(writer, source, draft, quantization.draft, progress, added)?;
            beside = Some((draft_name.clone(), draft_manifest));
            draft_name.to_string()
        } else {
            draft.clone()
        });
    }
    // Draft models are checked now, not when the first request loads them.
    let parameter_draft = manifest
        .parameters
        .get("draft")
        .and_then(Value::as_str)
        .filter(|d| *d != "none" && crate::engine::DrafterKind::parse(d).is_none());
    for draft in manifest
        .draft
        .iter()
        .map(String::as_str)
        .chain(parameter_draft)
    {
        progress(PullProgress::Status(format!(
            "checking draft model {draft}"
        )));
        check_draft(writer, name, &manifest, draft, beside.as_ref())?;
    }
    manifest.created_at = rfc3339(SystemTime::now());
    fault::reached(Point::CreateCommit);
    progress(PullProgress::Status("writing manifest".into()));
    if let Some((draft_name, draft_manifest)) = &beside {
        writer.put_manifest(draft_name, draft_manifest)?;
    }
    writer.put_manifest(name, &manifest)?;
    progress(PullProgress::Status("success".into()));
    Ok(())
}

/// The weights from `from`: imported as they are, converted into MLX's layouts (a GGUF
/// file), quantized to `quantize` or to the source's own default (FP8 and NVFP4 sources), or a
/// stored model's. Returns the manifest, not yet written; a manifest whose blobs this call
/// added is also pushed to `added`.
fn weights(
    writer: &StoreWriter<'_>,
    from: &ModelSource,
    from_text: &str,
    quantize: Option<quant::create::Target>,
    progress: &mut dyn FnMut(PullProgress),
    added: &mut Vec<Manifest>,
) -> Result<Manifest, CreateError> {
    let refuse = |message: String| CreateError::Refused(from.redact(&message, from_text));
    let quantize = quantize.or_else(|| crate::create::default_target(from));
    let manifest = match (from, quantize) {
        (ModelSource::Stored(base), None) => {
            let mut manifest = writer.get(base)?.manifest;
            manifest.source = base.to_string();
            return Ok(manifest);
        }
        (ModelSource::Safetensors(path), None) => {
            progress(PullProgress::Status(format!("importing {from_text}")));
            crate::import::import_manifest(
                writer,
                path,
                from_text,
                None,
                &mut |what, done, total| {
                    progress(PullProgress::Bytes {
                        what: what.to_string(),
                        done,
                        total,
                    })
                },
            )
            .map_err(|e| refuse(e.to_string()))?
        }
        // A GGUF file is converted once, here, rather than at every load; anything quantized
        // is rewritten.
        _ => crate::create::convert(writer, from, from_text, quantize, progress)
            .map_err(|e| refuse(e.to_string()))?,
    };
    added.push(manifest.clone());
    Ok(manifest)
}

/// Whether the model `draft` (stored, or `beside`, about to be) can draft for `name` (with
/// `manifest`): it exists and its vocabulary is the target's, id for id.
fn check_draft(
    writer: &StoreWriter<'_>,
    name: &ModelName,
    manifest: &Manifest,
    draft: &str,
    beside: Option<&(ModelName, Manifest)>,
) -> Result<(), CreateError> {
    let refuse = |reason: String| CreateError::Refused(format!("draft model `{draft}`: {reason}"));
    let draft_name = ModelName::parse(draft)?;
    let draft_manifest = match beside {
        Some((beside_name, beside_manifest)) if *beside_name == draft_name => {
            beside_manifest.clone()
        }
        _ => {
            writer
                .get(&draft_name)
                .map_err(|e| refuse(e.to_string()))?
                .manifest
        }
    };
    let source = crate::engine::DraftSource {
        name: draft_name,
        dir: writer
            .materialize(&draft_manifest)
            .map_err(|e| refuse(e.to_string()))?,
        manifest: draft_manifest,
        required: true,
        by_default: true,
    };
    let target_dir = writer.materialize(manifest)?;
    crate::engine::from_store::check_draft_vocabulary(name, manifest, &target_dir, &source)
        .map_err(|e| CreateError::Refused(e.to_string()))
}
