//! An optional API key (`MLXKIT_API_KEY`). When it is set, every request but `GET /health`
//! (and CORS preflights, which browsers send without credentials and the CORS layer answers
//! first) must carry it, as OpenAI's and Ollama's clients send one (`Authorization: Bearer
//! KEY`) or as Anthropic's do (`x-api-key: KEY`); others get a 401 in their API's error shape.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::server::error::ApiError;

/// The environment variable holding the key.
pub const API_KEY_VARIABLE: &str = "MLXKIT_API_KEY";

/// The route open without the key: a load balancer's health check carries none.
const OPEN_PATH: &str = "/health";

/// The key requests must carry, kept as its SHA-256 digest: comparing digests takes the same
/// time whatever the key presented, its length included.
#[derive(Clone)]
pub struct ApiKey {
    digest: [u8; 32],
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

impl ApiKey {
    /// The key `text`; `None` when it is blank (an unset key, not one nobody can send).
    pub fn new(text: &str) -> Option<ApiKey> {
        let text = text.trim();
        (!text.is_empty()).then(|| ApiKey {
            digest: Sha256::digest(text.as_bytes()).into(),
        })
    }

    /// Whether `headers` carry this key in `Authorization: Bearer` or `x-api-key`.
    pub fn accepts(&self, headers: &HeaderMap) -> bool {
        let bearer = headers
            .get_all(header::AUTHORIZATION)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .filter_map(|value| {
                let (scheme, credentials) = value.trim().split_once(' ')?;
                scheme
                    .eq_ignore_ascii_case("bearer")
                    .then_some(credentials.trim())
            });
        let api_key = headers
            .get_all("x-api-key")
            .iter()
            .filter_map(|value| value.to_str().ok())
            .map(str::trim);
        // Every candidate is compared (no early exit), so the time taken does not depend on
        // which header held the key.
        bearer
            .chain(api_key)
            .fold(false, |found, presented| found | self.matches(presented))
    }

    /// Compares digests without a data-dependent branch or early exit.
    fn matches(&self, presented: &str) -> bool {
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let difference = presented
            .iter()
            .zip(&self.digest)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(difference) == 0
    }
}

/// Middleware: refuses a request without the key with a 401, when a key is set.
pub async fn require(
    State(key): State<Arc<Option<ApiKey>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(key) = key.as_ref() else {
        return next.run(request).await;
    };
    if request.uri().path() == OPEN_PATH || key.accepts(request.headers()) {
        return next.run(request).await;
    }
    let presented = request.headers().contains_key(header::AUTHORIZATION)
        || request.headers().contains_key("x-api-key");
    let message = if presented {
        "the API key is not this server's (MLXKIT_API_KEY)"
    } else {
        "this server needs an API key: send `Authorization: Bearer <key>` or `x-api-key: <key>`"
    };
    let mut response = ApiError::new(StatusCode::UNAUTHORIZED, message)
        .in_dialect_of(request.uri().path())
        .into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn the_key_is_taken_from_either_header_and_nothing_else() {
        let key = ApiKey::new("s3cret").unwrap();
        assert!(key.accepts(&headers(&[("authorization", "Bearer s3cret")])));
        assert!(key.accepts(&headers(&[("authorization", "bearer  s3cret ")])));
        assert!(key.accepts(&headers(&[("x-api-key", "s3cret")])));
        assert!(key.accepts(&headers(&[
            ("authorization", "Bearer wrong"),
            ("x-api-key", "s3cret")
        ])));
        assert!(!key.accepts(&headers(&[])));
        assert!(!key.accepts(&headers(&[("authorization", "Bearer s3cre")])));
        assert!(!key.accepts(&headers(&[("authorization", "Basic s3cret")])));
        assert!(!key.accepts(&headers(&[("authorization", "s3cret")])));
        assert!(!key.accepts(&headers(&[("x-api-key", "s3cret-and-more")])));
    }

    #[test]
    fn a_blank_key_is_no_key() {
        assert!(ApiKey::new("").is_none());
        assert!(ApiKey::new("  ").is_none());
        assert!(format!("{:?}", ApiKey::new("s3cret").unwrap()).contains(".."));
    }
}
