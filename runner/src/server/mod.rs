//! The HTTP server: Ollama's and OpenAI's APIs over the scheduler.
//!
//! - `ollama`: `/api/generate`, `/api/chat`; `models`: the management endpoints.
//! - `openai`: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.
//! - `generation`: the token stream → text pipeline every endpoint shares.
//! - `prompt`: requests → prompt tokens (templates, media checks, context).
//! - `options`: request options, validated.
//! - `structured`: structured output (formats, schemas, pinned tool calls) per request.
//! - `error`: errors before a stream starts (JSON with a status); after it starts, errors are
//!   sent inside the stream.

pub mod error;
pub mod generation;
pub mod models;
pub mod ollama;
pub mod openai;
pub mod options;
pub mod prompt;
pub mod structured;

use std::sync::Arc;
use std::time::SystemTime;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::routing::{delete, get, post};

use crate::scheduler::Scheduler;
use crate::store::Store;
use error::ApiError;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The model store.
    pub store: Store,
    /// The loaded model and the request queue.
    pub scheduler: Arc<Scheduler>,
}

/// The largest request body accepted (images inline as base64 make bodies large).
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// The routes of both APIs.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(|| async { "mlxkit is running" }))
        .route("/api/version", get(models::version))
        .route("/api/generate", post(ollama::generate))
        .route("/api/chat", post(ollama::chat))
        .route("/api/tags", get(models::tags))
        .route("/api/show", post(models::show))
        .route("/api/ps", get(models::ps))
        .route("/api/pull", post(models::pull))
        .route("/api/create", post(models::create))
        .route("/api/delete", delete(models::delete))
        .route("/api/copy", post(models::copy))
        .route("/api/embed", post(models::embed))
        .route("/api/embeddings", post(models::embed))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/models", get(openai::models))
        .fallback(|request: Request| async move {
            ApiError::not_found(format!(
                "no endpoint {} {}",
                request.method(),
                request.uri().path()
            ))
        })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// A JSON body whose rejection (malformed JSON, a missing field) is a 400 with a JSON error
/// naming the problem, like every other error. The content type is not checked: Ollama's own
/// examples post JSON with `curl -d`, which labels it as a form.
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let openai = req.uri().path().starts_with("/v1/");
        let dialect = |e: ApiError| if openai { e.openai() } else { e };
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

/// RFC 3339 time in UTC with nanoseconds, as Ollama writes it.
pub fn rfc3339(time: SystemTime) -> String {
    let since = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_nanos()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(
            rfc3339(SystemTime::UNIX_EPOCH),
            "1970-01-01T00:00:00.000000000Z"
        );
        let t = SystemTime::UNIX_EPOCH + Duration::new(1_796_000_000, 5);
        assert_eq!(rfc3339(t), "2026-11-30T00:53:20.000000005Z");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000000000Z");
    }
}
