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

use crate::engine::embedding::normalize;
use crate::model_keeper::Lease;
use crate::model_name::ModelName;
use crate::server::error::ApiError;
use crate::server::openai::OpenAiError;
use crate::server::request_error::RequestError;
use crate::server::{AppState, JsonBody, prompt, prompt_tokens};

/// The most inputs one request may embed.
pub const MAX_INPUTS: usize = 2048;

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

/// What becomes of an input longer than the model's context.
#[derive(Debug, Clone, Copy)]
enum Overlong {
    /// Its first tokens are embedded (Ollama's `truncate`, on unless a request turns it off).
    Truncate,
    /// It is refused, the message ending with `hint`: how to get it embedded.
    Refuse {
        /// What the client can do instead.
        hint: &'static str,
    },
}

impl Overlong {
    /// Ollama's `truncate` option: cut unless it is `false`.
    fn ollama(truncate: Option<bool>) -> Overlong {
        match truncate {
            Some(false) => Overlong::Refuse {
                hint: "set `truncate` to cut it",
            },
            _ => Overlong::Truncate,
        }
    }

    /// OpenAI's embeddings have no truncation option and refuse an input past the context.
    const OPENAI: Overlong = Overlong::Refuse {
        hint: "shorten or split it (OpenAI's embeddings API does not truncate)",
    };
}

/// An input: text, or (OpenAI) token ids.
enum Input {
    Text(String),
    Tokens(Vec<u32>),
}

fn inputs(value: &Value) -> Result<Vec<Input>, ApiError> {
    let one = |v: &Value| -> Result<Input, ApiError> {
        match v {
            Value::String(s) => Ok(Input::Text(s.clone())),
            Value::Array(ids) => ids
                .iter()
                .map(|id| {
                    id.as_u64()
                        .and_then(|id| u32::try_from(id).ok())
                        .ok_or_else(|| ApiError::bad_request("token ids must be integers"))
                })
                .collect::<Result<_, _>>()
                .map(Input::Tokens),
            other => Err(ApiError::bad_request(format!(
                "an input must be a string or a list of token ids, got {other}"
            ))),
        }
    };
    let list = match value {
        Value::String(_) => vec![one(value)?],
        // A list of numbers is one tokenized input; a list of lists or strings is several.
        Value::Array(items) if items.iter().all(Value::is_number) && !items.is_empty() => {
            vec![one(value)?]
        }
        Value::Array(items) => items.iter().map(one).collect::<Result<_, _>>()?,
        other => {
            return Err(ApiError::bad_request(format!(
                "`input` must be a string or a list, got {other}"
            )));
        }
    };
    if list.is_empty() {
        return Err(ApiError::bad_request("`input` is empty"));
    }
    if list.len() > MAX_INPUTS {
        return Err(ApiError::bad_request(format!(
            "{} inputs; at most {MAX_INPUTS} per request",
            list.len()
        )));
    }
    Ok(list)
}

/// Embeds `inputs` with the leased model: tokenized off the runtime, each longer than the
/// context cut to it or refused (`overlong`), then evaluated on the worker. Returns the raw
/// vectors and the tokens evaluated.
async fn embed(
    lease: &Lease,
    inputs: Vec<Input>,
    overlong: Overlong,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let info = lease.info.clone();
    let tokenized = prompt::off_runtime(move || {
        let vocab = info.tokenizer.vocab_size();
        inputs
            .into_iter()
            .enumerate()
            .map(|(i, input)| {
                let mut tokens = match input {
                    Input::Text(text) if text.is_empty() => {
                        return Err(RequestError::invalid(format!("input {i} is empty")));
                    }
                    Input::Text(text) => prompt_tokens::encode(&info, &text, true)?,
                    Input::Tokens(ids) => ids,
                };
                if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
                    return Err(RequestError::invalid(format!(
                        "input {i}: token {bad} is outside the vocabulary of {vocab}"
                    )));
                }
                if tokens.len() > info.context_length {
                    if let Overlong::Refuse { hint } = overlong {
                        return Err(RequestError::invalid(format!(
                            "input {i} is {} tokens, more than the model's context of {}; {hint}",
                            tokens.len(),
                            info.context_length
                        )));
                    }
                    tokens.truncate(info.context_length);
                }
                if tokens.is_empty() {
                    return Err(RequestError::invalid(format!("input {i} has no tokens")));
                }
                Ok(tokens)
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await?;
    let evaluated = tokenized.iter().map(Vec::len).sum();
    let vectors = lease
        .engine
        .embed(lease.slot, tokenized)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok((vectors, evaluated))
}

/// Unit vectors, cut to `dimensions` first when asked.
fn unit_vectors(
    mut vectors: Vec<Vec<f32>>,
    dimensions: Option<usize>,
) -> Result<Vec<Vec<f32>>, ApiError> {
    for vector in &mut vectors {
        if let Some(d) = dimensions {
            if d == 0 || d > vector.len() {
                return Err(ApiError::bad_request(format!(
                    "`dimensions` must be between 1 and {}",
                    vector.len()
                )));
            }
            vector.truncate(d);
        }
        normalize(vector);
    }
    Ok(vectors)
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
