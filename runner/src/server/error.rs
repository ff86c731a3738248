//! API errors: a status and a message, rendered the way each API family expects.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Which API shape an error is rendered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `{"error": "message"}`.
    Ollama,
    /// `{"error": {"message": …, "type": …, "code": …}}`.
    OpenAi,
    /// `{"type": "error", "error": {"type": …, "message": …}}`.
    Anthropic,
}

/// An error answered before a response starts streaming.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for the client.
    pub message: String,
    /// The shape to render.
    pub dialect: Dialect,
}

impl ApiError {
    /// A 400 naming the problem with the request.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// A 404 (unknown model or route).
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    /// A 500 for failures that are not the client's doing.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// A 500 for a blocking task that panicked: the panic's message, which may quote
    /// internals (a `Debug` dump, a source path), goes to the log, not to the client.
    pub fn task_failed(what: &str, e: &tokio::task::JoinError) -> ApiError {
        tracing::error!("{what}: {e}");
        ApiError::internal(format!("{what} failed unexpectedly"))
    }

    /// An error with any status.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            dialect: Dialect::Ollama,
        }
    }

    /// The same error in OpenAI's shape.
    pub fn openai(mut self) -> ApiError {
        self.dialect = Dialect::OpenAi;
        self
    }

    /// The same error in Anthropic's shape.
    pub fn anthropic(mut self) -> ApiError {
        self.dialect = Dialect::Anthropic;
        self
    }

    /// The same error in the shape of the API `path` belongs to: Anthropic's under
    /// `/v1/messages`, OpenAI's under the rest of `/v1/`, Ollama's elsewhere.
    pub fn in_dialect_of(self, path: &str) -> ApiError {
        if path.starts_with("/v1/messages") {
            self.anthropic()
        } else if path.starts_with("/v1/") {
            self.openai()
        } else {
            self
        }
    }

    /// Anthropic's name for the kind of error a status means.
    pub fn anthropic_type(status: StatusCode) -> &'static str {
        match status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            400..=499 => "invalid_request_error",
            _ => "api_error",
        }
    }
}

/// The message alone, as the client reads it (the CLI prints it the same way).
impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let message = client_text(&self.message);
        let body = match self.dialect {
            Dialect::Ollama => serde_json::json!({ "error": message }),
            Dialect::OpenAi => serde_json::json!({
                "error": {
                    "message": message,
                    "type": if self.status.is_server_error() { "server_error" } else { "invalid_request_error" },
                    "param": null,
                    "code": self.status.as_u16(),
                }
            }),
            Dialect::Anthropic => serde_json::json!({
                "type": "error",
                "error": {
                    "type": ApiError::anthropic_type(self.status),
                    "message": message,
                }
            }),
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            // The queue is full: a client may try again once a running request is done.
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}

/// `message` as a client may read it: with server paths hidden (the log keeps them).
pub fn client_text(message: &str) -> String {
    let hidden = super::server_paths::hide(message);
    if let std::borrow::Cow::Owned(_) = hidden {
        tracing::warn!("answered with server paths hidden: {message}");
    }
    hidden.into_owned()
}

impl From<crate::model_keeper::LeaseError> for ApiError {
    fn from(e: crate::model_keeper::LeaseError) -> ApiError {
        use crate::model_keeper::LeaseError;
        use crate::store::StoreError;
        let status = match &e {
            LeaseError::Busy(_) | LeaseError::GroupLost(_) => StatusCode::SERVICE_UNAVAILABLE,
            LeaseError::Store(StoreError::NotFound(_)) => StatusCode::NOT_FOUND,
            LeaseError::NotGenerative(_) | LeaseError::OnlyDrafts(_) => StatusCode::BAD_REQUEST,
            LeaseError::Store(StoreError::Unusable { .. } | StoreError::Foreign(_)) => {
                StatusCode::BAD_REQUEST
            }
            // The request (or the model's Modelfile) named a draft that cannot draft for it.
            LeaseError::Engine(crate::engine::EngineError::Load(
                crate::engine::LoadError::Draft { .. },
            )) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> ApiError {
        use crate::store::StoreError;
        let status = match &e {
            StoreError::NotFound(_) => StatusCode::NOT_FOUND,
            StoreError::Unusable { .. } | StoreError::Foreign(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

impl From<crate::create_model::CreateError> for ApiError {
    fn from(e: crate::create_model::CreateError) -> ApiError {
        use crate::create_model::CreateError;
        match e {
            CreateError::Refused(message) => ApiError::bad_request(message),
            CreateError::Store(e) => e.into(),
        }
    }
}

impl From<crate::model_name::InvalidName> for ApiError {
    fn from(e: crate::model_name::InvalidName) -> ApiError {
        ApiError::bad_request(e.to_string())
    }
}

/// The statuses a request the builder turned down gets, whichever API it came through.
impl From<crate::server::request_error::RequestError> for ApiError {
    fn from(e: crate::server::request_error::RequestError) -> ApiError {
        use crate::server::request_error::RequestError;
        match e {
            RequestError::Invalid(message) | RequestError::Refused(message) => {
                ApiError::bad_request(message)
            }
            RequestError::Store(e) => ApiError::from(e),
            RequestError::Busy(message) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message),
            RequestError::Internal(message) => ApiError::internal(message),
        }
    }
}
