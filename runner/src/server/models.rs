//! Ollama's model-management endpoints: tags, show, ps, pull, create, delete, copy, version,
//! and embeddings (refused clearly: no embedding model exists yet).

use std::convert::Infallible;
use std::time::{Duration, Instant, SystemTime};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::model_keeper::RunningModel;
use crate::model_name::ModelName;
use crate::modelfile::Modelfile;
use crate::pull::PullProgress;
use crate::server::error::{ApiError, client_text};
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
        .keeper
        .running()
        .await
        .into_iter()
        .find(|running| running.info.name == name)
        .map(|running| running.info);
    let template = m
        .template
        .clone()
        .or_else(|| {
            loaded
                .as_ref()
                .and_then(|info| info.tokenizer.chat_template().map(str::to_string))
        })
        .unwrap_or_default();
    let model_info = model_info(m, loaded.as_ref().map(|info| &info.config));
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
    let tool_format = super::tool_format::for_show(loaded.as_deref(), &capabilities);
    let capabilities = crate::capabilities::shown(capabilities);
    Ok(Json(json!({
        "modelfile": modelfile,
        "parameters": parameters,
        "template": template,
        "system": m.system.clone().unwrap_or_default(),
        "details": details_json(m),
        "model_info": model_info,
        "capabilities": capabilities,
        "tool_format": tool_format,
        "modified_at": rfc3339(entry.modified),
    })))
}

/// `show`'s `model_info`: what was recorded at import; for a manifest written before it was,
/// the loaded model's config mapped the same way, else the architecture and context length.
fn model_info(manifest: &Manifest, loaded_config: Option<&Value>) -> Value {
    let details = &manifest.details;
    let info = if !details.model_info.is_empty() {
        details.model_info.clone()
    } else if let Some(config) = loaded_config {
        crate::model_info::of_config(config, None, details.context_length)
    } else {
        let arch = crate::model_info::gguf_architecture(&details.family);
        [
            ("general.architecture".to_string(), json!(arch)),
            (
                format!("{arch}.context_length"),
                json!(details.context_length),
            ),
        ]
        .into_iter()
        .collect()
    };
    Value::Object(info.into_iter().collect())
}

fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        other => other.to_string(),
    }
}

/// `GET /api/ps`: every resident model, the most recently used first.
pub async fn ps(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let running = state.keeper.running().await;
    let models: Vec<Value> = running
        .iter()
        .map(|model| ps_entry(&state, model))
        .collect();
    Ok(Json(json!({ "models": models })))
}

/// One resident model's entry of `ps`. `size` is what it holds now: its weights, the KV its
/// running requests reserved and its prefix cache.
fn ps_entry(state: &AppState, model: &RunningModel) -> Value {
    let info = &model.info;
    let expires_at = match model.expires {
        Some(at) => {
            let from_now = at.saturating_duration_since(Instant::now());
            rfc3339(SystemTime::now() + from_now)
        }
        None => "forever".to_string(),
    };
    let name = info.name.to_string();
    let engine = state.keeper.engine().status(model.slot);
    let size = model
        .weights_bytes
        .saturating_add(engine.kv_reserved)
        .saturating_add(engine.cache_bytes)
        .saturating_add(engine.draft_cache_bytes);
    let mut entry = json!({
        "running_sequences": engine.running,
        "prefilling_sequences": engine.prefilling,
        "prefilled_tokens": engine.prefilled_tokens,
        "queued_requests": engine.queued,
        "weights_bytes": model.weights_bytes,
        "kv_bytes": engine.kv_reserved,
        "prefix_cache_bytes": engine.cache_bytes,
        "prefix_cache_budget": engine.cache_budget,
        "prefix_cache_nodes": engine.cache_nodes,
        "draft_depth": engine.draft_depth.map(|depth| json!({ "ngram": depth })),
        "name": name,
        "model": name,
        "size": size,
        "digest": info.manifest.digest().trim_start_matches("sha256:"),
        "details": details_json(&info.manifest),
        "expires_at": expires_at,
        "size_vram": if mlx::gpu_available().unwrap_or(false) { size } else { 0 },
        "context_length": info.context_length,
    });
    // Not in Ollama's API: the group of processes it is split across.
    if let (Some(group), Some(fields)) = (state.keeper.engine().group(), entry.as_object_mut()) {
        fields.insert("group".into(), group.state_json());
    }
    // Not in Ollama's API: the draft model loaded beside it, and its own prefix cache.
    if let (Some(draft), Some(fields)) = (&info.draft, entry.as_object_mut()) {
        fields.insert("draft_model".into(), json!(draft.to_string()));
        if let Some(depth) = engine.draft_model_depth {
            let depths = fields.entry("draft_depth").or_insert(Value::Null);
            if !depths.is_object() {
                *depths = json!({});
            }
            if let Some(depths) = depths.as_object_mut() {
                depths.insert(draft.to_string(), json!(depth));
            }
        }
        fields.insert(
            "draft_prefix_cache_bytes".into(),
            json!(engine.draft_cache_bytes),
        );
    }
    entry
}

/// `DELETE /api/delete`.
pub async fn delete(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ModelRequest>,
) -> Result<Response, ApiError> {
    let name = req.name()?;
    state.store.get(&name)?;
    state.keeper.unload(&name).await?;
    let store = state.store.clone();
    // Off the runtime: it waits for the store's writer lock.
    tokio::task::spawn_blocking(move || store.lock(&mut || {})?.remove(&name))
        .await
        .map_err(|e| ApiError::task_failed("removing the model", &e))??;
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
    let store = state.store.clone();
    // Off the runtime: it waits for the store's writer lock.
    tokio::task::spawn_blocking(move || store.lock(&mut || {})?.copy(&from, &to))
        .await
        .map_err(|e| ApiError::task_failed("copying the model", &e))??;
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
        crate::create_model::create_model(&store, &name, &spec, quantization, progress)
            .map_err(ApiError::from)
    };
    Ok(progress_response(req.stream.unwrap_or(true), job).await)
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
            Err(e) => ApiError::task_failed("the job", &e).into_response(),
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
            Ok(Err(e)) => json!({ "error": client_text(&e.message) }),
            Err(e) => json!({ "error": ApiError::task_failed("the job", &e).message }),
        };
        Some((Ok(line(&value)), (rx, None)))
    })
}
