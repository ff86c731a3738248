//! Endpoints for operators and tooling: `GET /health`, and `POST /tokenize` /
//! `POST /detokenize` with a model's own vocabulary (`/metrics` is `metrics`').

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::model_name::ModelName;
use crate::server::error::ApiError;
use crate::server::{AppState, JsonBody, prompt, prompt_tokens};

/// `GET /health`: the server answers, and which models are resident, the most recently used
/// first (`model`: that one, as when one model was resident at a time).
pub async fn health(State(state): State<AppState>) -> Json<Value> {
    let resident: Vec<String> = state
        .keeper
        .running()
        .await
        .iter()
        .map(|running| running.info.name.to_string())
        .collect();
    let mut health = json!({ "status": "ok", "model": resident.first(), "models": resident });
    if let Some(group) = state.keeper.engine().group() {
        if group.lost().is_some() {
            health["status"] = json!("degraded");
        }
        health["group"] = group.state_json();
    }
    Json(health)
}

/// `/tokenize`'s body (llama.cpp's server's fields, with the model to use).
#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    model: String,
    content: String,
    /// Add the model's BOS as its plain encoding does (default false: the text as it is).
    #[serde(default)]
    add_special: bool,
}

/// `/detokenize`'s body.
#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    model: String,
    tokens: Vec<u32>,
}

/// `POST /tokenize`: `{"tokens": [...]}`.
pub async fn tokenize(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<TokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    let lease = state
        .keeper
        .acquire(&ModelName::parse(&req.model)?, None)
        .await?;
    let info = lease.info.clone();
    let rendered =
        prompt::off_runtime(move || prompt_tokens::encode(&info, &req.content, req.add_special))
            .await?;
    Ok(Json(json!({ "tokens": rendered })))
}

/// `POST /detokenize`: `{"content": "..."}`; special tokens are kept as text.
pub async fn detokenize(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<DetokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    let lease = state
        .keeper
        .acquire(&ModelName::parse(&req.model)?, None)
        .await?;
    let vocab = lease.info.tokenizer.vocab_size();
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad_request(format!(
            "token {bad} is outside the vocabulary of {vocab}"
        )));
    }
    let content = lease
        .info
        .tokenizer
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::bad_request(format!("decoding: {e}")))?;
    Ok(Json(json!({ "content": content })))
}
