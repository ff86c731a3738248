//! Cross-origin requests: the browser pages `origins` allows may call the API and read its
//! answers, as they may Ollama's. A preflight from any other page never reaches this layer:
//! `guard` refuses it with a 403 first.

use axum::http::{HeaderValue, Method, request::Parts};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

use crate::server::origins::AllowedOrigins;

/// The CORS layer for `origins`.
pub fn layer(origins: AllowedOrigins) -> CorsLayer {
    CorsLayer::new()
        .allow_origin(AllowOrigin::predicate(
            move |origin: &HeaderValue, _: &Parts| {
                origin.to_str().is_ok_and(|origin| origins.allows(origin))
            },
        ))
        .allow_methods([
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::HEAD,
            Method::OPTIONS,
        ])
        .allow_headers(AllowHeaders::mirror_request())
}
