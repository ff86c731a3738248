//! Embeddings: Ollama's `/api/embed` (unit vectors, batched inputs, `truncate`, `dimensions`)
//! and legacy `/api/embeddings` (one raw vector), and OpenAI's `/v1/embeddings`. An input
//! longer than the context is cut to it on Ollama's routes unless `truncate: false` asks for a
//! refusal, as Ollama does, and refused on OpenAI's, as OpenAI does (issue 48).
//!
//! A decoder model's embedding of a text is its last token's final hidden state (see
//! [`crate::engine::embedding`]); the checkpoints served here declare no pooling of their own.

use std::time::Instant;

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::model_keeper::Lease;
use crate::model_name::ModelName;
use crate::server::embedding_request::{Input, Overlong, embed, inputs, unit_vectors};
use crate::server::error::ApiError;
use crate::server::openai::OpenAiError;
use crate::server::{AppState, JsonBody};

/// `/api/embed`'s and `/api/embeddings`' body.
#[derive(Debug, Deserialize)]
pub struct EmbedRequest {
    model: String,
    /// `/api/embed`: a string or a list of strings.
    #[serde(default)]
    input: Option<Value>,
    /// `/api/embeddings`: one string.
    #[serde(default)]
    prompt: Option<String>,
    /// Cut inputs longer than the context to fit (the default), else refuse them.
    #[serde(default)]
    truncate: Option<bool>,
    /// Keep only the first this many dimensions (then scale to unit length again).
    #[serde(default)]
    dimensions: Option<usize>,
}

/// `/v1/embeddings`' body.
#[derive(Debug, Deserialize)]
pub struct OpenAiEmbeddingRequest {
    model: String,
    input: Value,
    #[serde(default)]
    dimensions: Option<usize>,
    #[serde(default)]
    encoding_format: Option<String>,
}

async fn lease(state: &AppState, model: &str) -> Result<Lease, ApiError> {
    if model.is_empty() {
        return Err(ApiError::bad_request("`model` is required"));
    }
    Ok(state
        .keeper
        .acquire(&ModelName::parse(model)?, None)
        .await?)
}

/// `POST /api/embed`.
pub async fn ollama_embed(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<EmbedRequest>,
) -> Result<Json<Value>, ApiError> {
    let started = Instant::now();
    let input = req
        .input
        .as_ref()
        .or(req.prompt.as_ref().map(|_| &Value::Null))
        .ok_or_else(|| ApiError::bad_request("`input` is required"))?;
    let list = match (input, &req.prompt) {
        (Value::Null, Some(prompt)) => vec![Input::Text(prompt.clone())],
        _ => inputs(input)?,
    };
    let lease = lease(&state, &req.model).await?;
    let load = started.elapsed();
    let (vectors, evaluated) = embed(&lease, list, Overlong::ollama(req.truncate)).await?;
    let vectors = unit_vectors(vectors, req.dimensions)?;
    Ok(Json(json!({
        "model": lease.info.name.to_string(),
        "embeddings": vectors,
        "total_duration": started.elapsed().as_nanos() as u64,
        "load_duration": load.as_nanos() as u64,
        "prompt_eval_count": evaluated,
    })))
}

/// `POST /api/embeddings`, the older form: one `prompt`, one vector, not normalized.
pub async fn ollama_embeddings(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<EmbedRequest>,
) -> Result<Json<Value>, ApiError> {
    let prompt = req
        .prompt
        .clone()
        .or_else(|| {
            req.input
                .as_ref()
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .ok_or_else(|| ApiError::bad_request("`prompt` is required"))?;
    let lease = lease(&state, &req.model).await?;
    let (mut vectors, _) = embed(
        &lease,
        vec![Input::Text(prompt)],
        Overlong::ollama(req.truncate),
    )
    .await?;
    Ok(Json(
        json!({ "embedding": vectors.pop().unwrap_or_default() }),
    ))
}

/// `POST /v1/embeddings`.
pub async fn openai_embeddings(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<OpenAiEmbeddingRequest>,
) -> Result<Json<Value>, OpenAiError> {
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "`encoding_format` {other:?}: expected \"float\" or \"base64\""
            ))
            .into());
        }
    };
    let list = inputs(&req.input)?;
    let lease = lease(&state, &req.model).await?;
    let (vectors, evaluated) = embed(&lease, list, Overlong::OPENAI).await?;
    let vectors = unit_vectors(vectors, req.dimensions)?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = if base64 {
                use base64::Engine as _;
                let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(vector)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": lease.info.name.to_string(),
        "usage": {"prompt_tokens": evaluated, "total_tokens": evaluated},
    })))
}
