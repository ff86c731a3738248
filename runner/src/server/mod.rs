//! The HTTP server: Ollama's, OpenAI's and Anthropic's APIs over the model keeper.
//!
//! - `ollama`: `/api/generate`, `/api/chat`; `models`: the management endpoints.
//! - `openai`: `/v1/chat/completions`, `/v1/completions`, `/v1/models`; `choices`: their
//!   `n` choices streamed as one.
//! - `embeddings`: `/api/embed`, `/api/embeddings`, `/v1/embeddings`.
//! - `anthropic`: `/v1/messages`, `/v1/messages/count_tokens`.
//! - `responses`: `/v1/responses`, with the store `previous_response_id` reads;
//!   `responses_tools`: its tools (namespaces, custom and built-in tools) as a model takes them.
//! - `transcriptions`: `/v1/audio/transcriptions`, speech to text with a Whisper checkpoint.
//! - `chat`: rendering, constraining and starting a conversation, for every chat-shaped API.
//! - `generation`: the token stream → text pipeline every endpoint shares.
//! - `operations`: `/health`, `/tokenize`, `/detokenize`; `metrics`: `/metrics` and what
//!   it counts.
//! - `sse`: server-sent event streams (OpenAI's `data:` lines, Anthropic's named events).
//! - `prompt`: requests → prompt tokens (templates, media checks, context); `prompt_tokens`:
//!   prompt text tokenized within the context; `images`: a
//!   prompt's `[img-N]` tags laid out as the model takes images (or audio), and the media
//!   prepared; `audio`: a clip cut into segments, their features and token layout.
//! - `options`: request options, validated; `output_limit`: the server's default output
//!   limit (`MLXKIT_MAX_OUTPUT_TOKENS`); `default_model`: the model serving requests that
//!   name a hosted model (`claude-…`, `gpt-…`) no stored model is called.
//! - `requested_shape`: what a request asks of its output (format, tools, `tool_choice`);
//!   `structured`: that compiled as one grammar (formats, schemas, pinned tool calls);
//!   `loosened`: the header reporting where a schema was loosened to compile;
//!   `generic_grammar`: the reply object of the generic tool format, for templates without a
//!   tool section; `tool_format`: which of the two a model uses, as `/api/show` reports it.
//! - `listen`: accepting connections and serving them within `limits` (header, idle and body
//!   timeouts, a connection cap), `connections` tracking what each open one is doing, and
//!   `body_deadline` bounding a request body's arrival.
//! - `access`: who may call, as the operator set it; `guard`: the Host, Origin and
//!   Content-Type rules that keep web pages from driving the server (`hosts`, `origins`);
//!   `cors`: which pages may read answers; `api_key`: the optional key.
//! - `stopping`: the process-wide stop that ends generations still running after the drain.
//! - `warnings`: what a request asked that is not done here (hosted tools), logged and
//!   reported in the response instead of refused.
//! - `error`: errors before a stream starts (JSON with a status); after it starts, errors are
//!   sent inside the stream; `server_paths`: the server's own paths hidden from both.

pub mod access;
pub mod anthropic;
pub mod api_key;
pub mod audio;
pub mod body_deadline;
pub mod choices;
pub mod connections;
pub mod cors;
pub mod default_model;
pub mod embedding_request;
pub mod embeddings;
pub mod error;
pub mod generation;
pub mod generic_grammar;
pub mod guard;
pub mod hosts;
pub mod images;
pub mod limits;
pub mod listen;
pub mod loosened;
pub mod metrics;
pub mod models;
pub mod ollama;
pub mod openai;
pub mod operations;
pub mod options;
pub mod origins;
pub mod output_limit;
pub mod prompt;
pub mod prompt_tokens;
pub mod request;
pub mod request_error;
pub mod request_log;
pub mod requested_shape;
pub mod responses;
pub mod responses_tools;
pub mod server_paths;
pub mod sse;
pub mod stopping;
pub mod structured;
pub mod tool_format;
pub mod transcriptions;
pub mod warnings;

use std::sync::Arc;
use std::time::SystemTime;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::routing::{delete, get, post};

use crate::model_keeper::ModelKeeper;
use crate::model_name;
use crate::store::Store;
use error::ApiError;

pub use crate::timestamp::rfc3339;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The model store.
    pub store: Store,
    /// The loaded model and the request queue.
    pub keeper: Arc<ModelKeeper>,
    /// Recent Responses-API conversations, for `previous_response_id`.
    pub responses: Arc<responses::ResponseStore>,
    /// The Whisper model transcriptions last used, its files prepared.
    pub transcription_models: Arc<transcriptions::PreparedModels>,
    /// The most tokens a request generates when neither it nor its model's Modelfile names a
    /// limit (`MLXKIT_MAX_OUTPUT_TOKENS`); `None`: until the context's end.
    pub max_output_tokens: Option<usize>,
    /// What serves requests naming a hosted model that is not stored (see
    /// [`default_model`]).
    pub default_model: Option<model_name::ModelName>,
}

impl AppState {
    /// The state of a server over `store` and `keeper`.
    pub fn new(store: Store, keeper: Arc<ModelKeeper>) -> AppState {
        AppState {
            store,
            keeper,
            responses: Arc::default(),
            transcription_models: Arc::default(),
            max_output_tokens: None,
            default_model: None,
        }
    }

    /// This state, serving requests that name a hosted model no stored model is called
    /// with `model`.
    pub fn with_default_model(mut self, model: Option<model_name::ModelName>) -> AppState {
        self.default_model = model;
        self
    }

    /// The same state with `limit` as its default output limit (see [`output_limit`]).
    pub fn with_max_output_tokens(mut self, limit: Option<usize>) -> AppState {
        self.max_output_tokens = limit;
        self
    }

    /// The options `name` was stored with (its Modelfile's `PARAMETER`s), with the server's
    /// default output limit as `num_predict` when they name none. Fails as the store does for
    /// a model it does not hold.
    pub fn model_defaults(
        &self,
        name: &model_name::ModelName,
    ) -> Result<serde_json::Map<String, serde_json::Value>, crate::store::StoreError> {
        let mut defaults = self
            .store
            .get(name)?
            .manifest
            .parameters
            .into_iter()
            .collect();
        output_limit::apply_default(&mut defaults, self.max_output_tokens);
        Ok(defaults)
    }
}

/// The largest request body accepted (images inline as base64 make bodies large).
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// The routes of every API, open to this machine only (no key, no extra origins or hosts).
pub fn router(state: AppState) -> Router {
    router_with(state, access::Access::default())
}

/// The routes of every API, open to whom `access` lets in.
pub fn router_with(state: AppState, access: access::Access) -> Router {
    // Installed before the first request, so every request is counted.
    metrics::handle();
    Router::new()
        .route("/", get(|| async { "mlxkit is running" }))
        .route("/api/version", get(models::version))
        .route("/health", get(operations::health))
        .route("/metrics", get(metrics::render))
        .route("/tokenize", post(operations::tokenize))
        .route("/detokenize", post(operations::detokenize))
        .route("/api/generate", post(ollama::generate))
        .route("/api/chat", post(ollama::chat))
        .route("/api/tags", get(models::tags))
        .route("/api/show", post(models::show))
        .route("/api/ps", get(models::ps))
        .route("/api/pull", post(models::pull))
        .route("/api/create", post(models::create))
        .route("/api/delete", delete(models::delete))
        .route("/api/copy", post(models::copy))
        .route("/api/embed", post(embeddings::ollama_embed))
        .route("/api/embeddings", post(embeddings::ollama_embeddings))
        .route("/v1/embeddings", post(embeddings::openai_embeddings))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route(
            "/v1/audio/transcriptions",
            post(transcriptions::create).layer(transcriptions::body_limit()),
        )
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{*model}", get(openai::model))
        .route("/v1/responses", post(responses::create))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .fallback(|request: Request| async move {
            ApiError::not_found(format!(
                "no endpoint {} {}",
                request.method(),
                request.uri().path()
            ))
        })
        .method_not_allowed_fallback(|request: Request| async move {
            ApiError::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                format!(
                    "{} is not allowed on {}",
                    request.method(),
                    request.uri().path()
                ),
            )
        })
        .layer(axum::middleware::from_fn(loosened::report))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        // Inside CORS: a page allowed to call may read why its key was refused, and
        // preflights (which carry no key) are answered before they get here.
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(access.api_key.clone()),
            api_key::require,
        ))
        .layer(cors::layer(access.origins.clone()))
        // Outside CORS: a page that may not call gets a 403, its preflight included.
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(access),
            guard::check,
        ))
        .layer(axum::middleware::from_fn(metrics::count_requests))
        .layer(axum::middleware::from_fn(request_log::log_requests))
        .with_state(state)
}

/// A JSON body whose rejection (malformed JSON, a missing field) is a 400 with a JSON error
/// naming the problem, like every other error. The content type is checked before routing
/// (`guard`): clients that are not browsers may label JSON as a form, as `curl -d` does in
/// Ollama's own examples.
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let path = req.uri().path().to_string();
        let dialect = |e: ApiError| e.in_dialect_of(&path);
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            dialect(ApiError::new(rejection.status(), rejection.body_text()))
        })?;
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| {
            let message = match e.classify() {
                serde_json::error::Category::Data => format!("invalid request: {e}"),
                _ => format!("invalid JSON: {e}"),
            };
            dialect(ApiError::bad_request(message))
        })
    }
}

/// A unique id for a response or tool call: `prefix`, a process-wide counter and the clock's
/// nanoseconds, in hex.
pub fn request_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{:x}{:08x}", n, nanos)
}

/// An id in the `prefix_…` form OpenAI's Responses and Anthropic's Messages use (`msg_…`,
/// `toolu_…`).
pub fn item_id(prefix: &str) -> String {
    request_id(prefix).replacen('-', "_", 1)
}

/// `model`'s name and the default options it was stored with (see
/// [`AppState::model_defaults`]); an unknown model is a 404, unless it looks hosted and the
/// server has a default model ([`default_model`]), which then serves it. Errors are in
/// Ollama's shape: callers put them in their API's.
pub fn stored_model(
    state: &AppState,
    model: &str,
) -> Result<
    (
        model_name::ModelName,
        serde_json::Map<String, serde_json::Value>,
    ),
    ApiError,
> {
    if model.is_empty() {
        return Err(ApiError::bad_request("`model` is required"));
    }
    let name = default_model::resolve(
        model_name::ModelName::parse(model)?,
        model,
        |name| state.store.get(name).is_ok(),
        state.default_model.as_ref(),
    );
    let defaults = state.model_defaults(&name)?;
    Ok((name, defaults))
}

/// Appends `text` to the string `value` holds in place (amortized O(1) per piece; rebuilding
/// the string per streamed piece would be quadratic in the answer's length).
pub fn push_str(value: &mut serde_json::Value, text: &str) {
    match value {
        serde_json::Value::String(s) => s.push_str(text),
        other => *other = serde_json::Value::String(text.to_string()),
    }
}
