//! Ollama's model-management endpoints: tags, show, ps, pull, create, delete, copy, version,
//! and embeddings (refused clearly: no embedding model exists yet).

use std::convert::Infallible;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::model_name::ModelName;
use crate::modelfile::Modelfile;
use crate::pull::PullProgress;
use crate::server::error::ApiError;
use crate::server::{AppState, JsonBody, rfc3339};
use crate::store::{Entry, Manifest};

fn details_json(manifest: &Manifest) -> Value {
    let d = &manifest.details;
    json!({
        "parent_model": "",
        "format": match manifest.format { crate::store::Format::Gguf => "gguf", crate::store::Format::Safetensors => "safetensors" },
        "family": d.family,
        "families": [d.family],
        "parameter_size": d.parameter_size,
        "quantization_level": d.quantization_level,
    })
}

fn tag_json(entry: &Entry) -> Value {
    let name = entry.name.to_string();
    let mut tag = json!({
        "name": name,
        "model": name,
        "modified_at": rfc3339(entry.modified),
        "size": entry.manifest.size(),
        "digest": entry.manifest.digest().trim_start_matches("sha256:"),
        "details": details_json(&entry.manifest),
    });
    // Not in Ollama's API: where a model is read from, and why one cannot be served.
    if entry.from_ollama {
        tag["store"] = json!("ollama");
    }
    if let Some(reason) = &entry.unusable {
        tag["unusable"] = json!(reason);
    }
    tag
}

/// `GET /api/tags`.
pub async fn tags(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let entries = state.store.list()?;
    Ok(Json(
        json!({ "models": entries.iter().map(tag_json).collect::<Vec<_>>() }),
    ))
}

/// A body naming one model (`model`, or the older `name`).
#[derive(Debug, Deserialize)]
pub struct ModelRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

impl ModelRequest {
    fn name(&self) -> Result<ModelName, ApiError> {
        let text = self
            .model
            .as_deref()
            .or(self.name.as_deref())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ApiError::bad_request("`model` is required"))?;
        Ok(ModelName::parse(text)?)
    }
}

/// `POST /api/show`.
pub async fn show(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ModelRequest>,
) -> Result<Json<Value>, ApiError> {
    let name = req.name()?;
    let entry = state.store.get(&name)?;
    let m = &entry.manifest;
    let parameters = m
        .parameters
        .iter()
        .flat_map(|(k, v)| match v {
            Value::Array(items) => items
                .iter()
                .map(|i| format!("{k} {}", plain(i)))
                .collect::<Vec<_>>(),
            other => vec![format!("{k} {}", plain(other))],
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut modelfile = format!("FROM {}\n", m.source);
    if let Some(system) = &m.system {
        modelfile.push_str(&format!("SYSTEM \"\"\"{system}\"\"\"\n"));
    }
    if let Some(draft) = &m.draft {
        modelfile.push_str(&format!("DRAFT {draft}\n"));
    }
    for line in parameters.lines() {
        modelfile.push_str(&format!("PARAMETER {line}\n"));
    }
    let loaded = state
        .scheduler
        .running()
        .await
        .filter(|(info, _)| info.name == name);
    let template = m
        .template
        .clone()
        .or_else(|| {
            loaded
                .as_ref()
                .and_then(|(info, _)| info.tokenizer.chat_template().map(str::to_string))
        })
        .unwrap_or_default();
    let model_info = loaded
        .as_ref()
        .map(|(info, _)| info.config.clone())
        .unwrap_or_else(|| {
            json!({
                "general.architecture": m.details.family,
                "context_length": m.details.context_length,
            })
        });
    // An overridden template decides; else what was recorded at import; else the loaded
    // tokenizer's template (manifests written before capabilities were recorded). Images and
    // audio come from the checkpoint, as recorded at import.
    let inputs = crate::capabilities::Inputs::of_capabilities(&m.details.capabilities);
    let capabilities = match (&m.template, m.details.capabilities.is_empty()) {
        (Some(own), _) => crate::capabilities::of_model(Some(own), inputs),
        (None, false) => m.details.capabilities.clone(),
        (None, true) => {
            crate::capabilities::of_template(Some(template.as_str()).filter(|t| !t.is_empty()))
        }
    };
    Ok(Json(json!({
        "modelfile": modelfile,
        "parameters": parameters,
        "template": template,
        "system": m.system.clone().unwrap_or_default(),
        "details": details_json(m),
        "model_info": model_info,
        "capabilities": capabilities,
        "modified_at": rfc3339(entry.modified),
    })))
}

fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        other => other.to_string(),
    }
}

/// `GET /api/ps`.
pub async fn ps(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let Some((info, expires)) = state.scheduler.running().await else {
        return Ok(Json(json!({ "models": [] })));
    };
    let (active, _) = state
        .scheduler
        .engine()
        .memory()
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let expires_at = match expires {
        Some(at) => {
            let from_now = at.saturating_duration_since(Instant::now());
            rfc3339(SystemTime::now() + from_now)
        }
        None => "forever".to_string(),
    };
    let name = info.name.to_string();
    let engine = state.scheduler.engine().status();
    let mut response = json!({
        "models": [{
            "running_sequences": engine.running,
            "prefilling_sequences": engine.prefilling,
            "prefilled_tokens": engine.prefilled_tokens,
            "queued_requests": engine.queued,
            "prefix_cache_bytes": engine.cache_bytes,
            "prefix_cache_budget": engine.cache_budget,
            "prefix_cache_nodes": engine.cache_nodes,
            "draft_depth": engine.draft_depth.map(|depth| json!({ "ngram": depth })),
            "name": name,
            "model": name,
            "size": active,
            "digest": info.manifest.digest().trim_start_matches("sha256:"),
            "details": details_json(&info.manifest),
            "expires_at": expires_at,
            "size_vram": if mlx::gpu_available().unwrap_or(false) { active } else { 0 },
            "context_length": info.context_length,
        }]
    });
    // Not in Ollama's API: the draft model loaded beside it, and its own prefix cache.
    if let (Some(draft), Some(model)) = (&info.draft, response["models"][0].as_object_mut()) {
        model.insert("draft_model".into(), json!(draft.to_string()));
        if let Some(depth) = engine.draft_model_depth {
            let depths = model.entry("draft_depth").or_insert(Value::Null);
            if !depths.is_object() {
                *depths = json!({});
            }
            if let Some(depths) = depths.as_object_mut() {
                depths.insert(draft.to_string(), json!(depth));
            }
        }
        model.insert(
            "draft_prefix_cache_bytes".into(),
            json!(engine.draft_cache_bytes),
        );
    }
    Ok(Json(response))
}

/// `DELETE /api/delete`.
pub async fn delete(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ModelRequest>,
) -> Result<Response, ApiError> {
    let name = req.name()?;
    state.store.get(&name)?;
    state.scheduler.unload(&name).await?;
    state.store.remove(&name)?;
    Ok(StatusCode::OK.into_response())
}

/// `/api/copy`'s body.
#[derive(Debug, Deserialize)]
pub struct CopyRequest {
    source: String,
    destination: String,
}

/// `POST /api/copy`.
pub async fn copy(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<CopyRequest>,
) -> Result<Response, ApiError> {
    let from = ModelName::parse(&req.source)?;
    let to = ModelName::parse(&req.destination)?;
    state.store.copy(&from, &to)?;
    Ok(StatusCode::OK.into_response())
}

/// `GET /api/version`.
pub async fn version() -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}

/// `/api/pull`'s body.
#[derive(Debug, Deserialize)]
pub struct PullRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
}

/// `POST /api/pull`.
pub async fn pull(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<PullRequest>,
) -> Result<Response, ApiError> {
    let name = ModelRequest {
        model: req.model,
        name: req.name,
    }
    .name()?;
    let store = state.store.clone();
    let job = move |progress: &mut dyn FnMut(PullProgress)| {
        crate::pull::pull(&store, &name, progress)
            .map(|_| ())
            .map_err(|e| {
                let status = match e {
                    crate::pull::PullError::Unknown(..) => StatusCode::NOT_FOUND,
                    _ => StatusCode::INTERNAL_SERVER_ERROR,
                };
                ApiError::new(status, e.to_string())
            })
    };
    Ok(progress_response(req.stream.unwrap_or(true), job).await)
}

/// `/api/create`'s body: the current shape (`from`, `template`, …) or the older `modelfile`.
#[derive(Debug, Deserialize)]
pub struct CreateRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    modelfile: Option<String>,
    #[serde(default)]
    template: Option<String>,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    parameters: Option<serde_json::Map<String, Value>>,
    /// A draft model, as a Modelfile's `DRAFT` names it.
    #[serde(default)]
    draft: Option<String>,
    /// Quantize the weights (`int4`, `int8`, `mxfp4`, `mxfp8`, `nvfp4`).
    #[serde(default)]
    quantize: Option<String>,
    /// Quantize the draft model the same way (stored beside the model).
    #[serde(default)]
    quantize_draft: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
}

/// `POST /api/create`.
pub async fn create(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<CreateRequest>,
) -> Result<Response, ApiError> {
    let name = ModelRequest {
        model: req.model.clone(),
        name: req.name.clone(),
    }
    .name()?;
    let mut spec = match &req.modelfile {
        Some(text) => Modelfile::parse(text).map_err(|e| ApiError::bad_request(e.to_string()))?,
        None => Modelfile {
            from: req
                .from
                .clone()
                .ok_or_else(|| ApiError::bad_request("`from` (or a `modelfile`) is required"))?,
            ..Modelfile::default()
        },
    };
    if let Some(t) = req.template.clone() {
        spec.template = Some(t);
    }
    if let Some(s) = req.system.clone() {
        spec.system = Some(s);
    }
    if let Some(p) = req.parameters.clone() {
        spec.parameters.extend(p);
    }
    if let Some(draft) = &req.draft {
        spec.draft = Some(ModelName::parse(draft)?.to_string());
    }
    // Options are checked now, not at the first request that uses them.
    let mut check = crate::server::options::GenerationOptions::default();
    check.apply(&spec.parameters.clone().into_iter().collect())?;
    let quantize = req
        .quantize
        .as_deref()
        .map(str::parse::<quant::create::Target>)
        .transpose()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let quantize_draft = req
        .quantize_draft
        .as_deref()
        .map(str::parse::<quant::create::Target>)
        .transpose()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let quantization = crate::create::Quantization {
        model: quantize,
        draft: quantize_draft,
    };
    let store = state.store.clone();
    let job = move |progress: &mut dyn FnMut(PullProgress)| {
        create_model(&store, &name, &spec, quantization, progress)
    };
    Ok(progress_response(req.stream.unwrap_or(true), job).await)
}

/// Creates `name` from a Modelfile: imports a local path (quantized when asked, or when the
/// source is FP8 or NVFP4), or bases it on a stored model. A `DRAFT` path, or any draft with
/// `quantization.draft`, is stored beside it as `<name>-draft`. When anything fails, nothing
/// this call stored stays in the store.
pub fn create_model(
    store: &crate::store::Store,
    name: &ModelName,
    spec: &Modelfile,
    quantization: crate::create::Quantization,
    progress: &mut dyn FnMut(PullProgress),
) -> Result<(), ApiError> {
    let existed = store.get(name).is_ok();
    let mut stored: Vec<ModelName> = Vec::new();
    let result = create_stored(store, name, spec, quantization, progress, &mut stored);
    if result.is_err() {
        for model in stored.iter().filter(|m| *m != name || !existed) {
            let _ = store.remove(model);
        }
    }
    result
}

fn create_stored(
    store: &crate::store::Store,
    name: &ModelName,
    spec: &Modelfile,
    quantization: crate::create::Quantization,
    progress: &mut dyn FnMut(PullProgress),
    stored: &mut Vec<ModelName>,
) -> Result<(), ApiError> {
    let mut manifest = store_weights(
        store,
        name,
        &spec.from,
        quantization.model,
        progress,
        stored,
    )?;
    if let Some(template) = &spec.template {
        tokenizer::ChatTemplate::check(template)
            .map_err(|e| ApiError::bad_request(format!("TEMPLATE: {e}")))?;
        manifest.template = Some(template.clone());
    }
    if spec.system.is_some() {
        manifest.system = spec.system.clone();
    }
    manifest.parameters.extend(spec.parameters.clone());
    if let Some(draft) = &spec.draft {
        let draft_path = expand_home(draft);
        manifest.draft = Some(if draft_path.exists() || quantization.draft.is_some() {
            // Stored beside the model, quantized the same way as a model would be.
            let draft_name = ModelName {
                name: format!("{}-draft", name.name),
                tag: name.tag.clone(),
            };
            progress(PullProgress::Status(format!(
                "storing draft {draft} as {draft_name}"
            )));
            store_weights(
                store,
                &draft_name,
                draft,
                quantization.draft,
                progress,
                stored,
            )?;
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
        check_draft(store, name, &manifest, draft)?;
    }
    manifest.created_at = rfc3339(SystemTime::now());
    progress(PullProgress::Status("writing manifest".into()));
    store.put_manifest(name, &manifest)?;
    stored.push(name.clone());
    progress(PullProgress::Status("success".into()));
    Ok(())
}

/// The weights of `name` from `from` (a path, or a stored model): imported as they are,
/// converted into MLX's layouts (a GGUF file), quantized to `quantize`, or to the source's own
/// default (FP8 and NVFP4 sources). Returns
/// the manifest, stored already when it was imported (and then listed in `stored`).
fn store_weights(
    store: &crate::store::Store,
    name: &ModelName,
    from: &str,
    quantize: Option<quant::create::Target>,
    progress: &mut dyn FnMut(PullProgress),
    stored: &mut Vec<ModelName>,
) -> Result<crate::store::Manifest, ApiError> {
    let path = expand_home(from);
    let quantize = quantize.or_else(|| {
        path.exists()
            .then(|| crate::create::default_target(&path))
            .flatten()
    });
    // A GGUF file is converted once, here, rather than at every load.
    if quantize.is_some() || crate::create::is_gguf_file(&path) {
        let manifest =
            crate::create::convert_into_store(store, name, &path, from, quantize, progress)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
        stored.push(name.clone());
        Ok(manifest)
    } else if path.exists() {
        progress(PullProgress::Status(format!(
            "importing {}",
            path.display()
        )));
        let manifest =
            crate::import::import_path(store, name, &path, from, &mut |what, done, total| {
                progress(PullProgress::Bytes {
                    what: what.to_string(),
                    done,
                    total,
                })
            })
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        stored.push(name.clone());
        Ok(manifest)
    } else {
        let base = ModelName::parse(from).map_err(|_| {
            ApiError::bad_request(format!(
                "FROM `{from}` is neither a file, a folder nor a model name"
            ))
        })?;
        let mut manifest = store.get(&base)?.manifest;
        manifest.source = base.to_string();
        Ok(manifest)
    }
}

/// Whether the stored model `draft` can draft for `name` (with `manifest`): it exists and its
/// vocabulary is the target's, id for id.
fn check_draft(
    store: &crate::store::Store,
    name: &ModelName,
    manifest: &crate::store::Manifest,
    draft: &str,
) -> Result<(), ApiError> {
    let refuse = |reason: String| ApiError::bad_request(format!("draft model `{draft}`: {reason}"));
    let draft_name = ModelName::parse(draft)?;
    let entry = store.get(&draft_name).map_err(|e| refuse(e.to_string()))?;
    let source = crate::engine::DraftSource {
        name: draft_name,
        dir: store
            .materialize(&entry.manifest)
            .map_err(|e| refuse(e.to_string()))?,
        manifest: entry.manifest,
        required: true,
        by_default: true,
    };
    let target_dir = store.materialize(manifest)?;
    crate::engine::loader::check_draft_vocabulary(name, manifest, &target_dir, &source)
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(path),
    }
}

/// Runs a blocking job that reports progress, streaming Ollama-style progress objects as
/// NDJSON (or answering once at the end when `stream` is false).
async fn progress_response<F>(stream: bool, job: F) -> Response
where
    F: FnOnce(&mut dyn FnMut(PullProgress)) -> Result<(), ApiError> + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<Value>();
    let task = tokio::task::spawn_blocking(move || {
        let mut last_report = Instant::now() - Duration::from_secs(1);
        let mut report = |event: PullProgress| {
            let value = match event {
                PullProgress::Status(status) => json!({ "status": status }),
                PullProgress::Count { what, done, total } => {
                    if done < total && last_report.elapsed() < Duration::from_millis(100) {
                        return;
                    }
                    last_report = Instant::now();
                    json!({ "status": what, "total": total, "completed": done })
                }
                PullProgress::Bytes { what, done, total } => {
                    // At most ten byte updates a second, and always the last one.
                    if done < total && last_report.elapsed() < Duration::from_millis(100) {
                        return;
                    }
                    last_report = Instant::now();
                    json!({ "status": format!("pulling {what}"), "digest": what, "total": total, "completed": done })
                }
            };
            let _ = tx.send(value);
        };
        job(&mut report)
    });
    if !stream {
        let result = task.await;
        while rx.try_recv().is_ok() {}
        return match result {
            Ok(Ok(())) => Json(json!({ "status": "success" })).into_response(),
            Ok(Err(e)) => e.into_response(),
            Err(e) => ApiError::internal(e.to_string()).into_response(),
        };
    }
    let lines = async_stream(rx, task);
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(lines))
        .unwrap_or_else(|_| ApiError::internal("building the response").into_response())
}

type Task = tokio::task::JoinHandle<Result<(), ApiError>>;

/// Progress lines, then an error line if the job failed.
fn async_stream(
    rx: mpsc::UnboundedReceiver<Value>,
    task: Task,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> {
    futures_util::stream::unfold((rx, Some(task)), |(mut rx, task)| async move {
        let line = |v: &Value| {
            let mut bytes = serde_json::to_vec(v).unwrap_or_default();
            bytes.push(b'\n');
            Bytes::from(bytes)
        };
        if let Some(value) = rx.recv().await {
            return Some((Ok(line(&value)), (rx, task)));
        }
        // The job dropped its sender: it has finished.
        let task = task?;
        let value = match task.await {
            Ok(Ok(())) => return None,
            Ok(Err(e)) => json!({ "error": e.message }),
            Err(e) => json!({ "error": e.to_string() }),
        };
        Some((Ok(line(&value)), (rx, None)))
    })
}
