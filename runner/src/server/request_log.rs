//! A request id for every HTTP request, and a log line when it is answered.
//!
//! The id is the client's `x-request-id` when it sends a usable one (so a proxy's id follows
//! the request through), else one made here; it is returned in the response's `x-request-id`
//! header. Handling runs inside a `request` span carrying it, and so does the generation a
//! request starts (`server::generation` spawns it in the current span): every event logged
//! for the request, engine errors and the generation's summary included, names its id.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

/// The header carrying the id both ways.
pub const REQUEST_ID: &str = "x-request-id";

/// The longest client-sent id kept; a longer one is replaced, not trusted into every log line.
const MAX_CLIENT_ID_BYTES: usize = 128;

/// Middleware: names the request, runs it in its span, logs its status and time to headers.
pub async fn log_requests(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|value| value.to_str().ok())
        .filter(|id| usable_client_id(id))
        .map_or_else(new_id, str::to_string);
    if let Ok(value) = HeaderValue::from_str(&id) {
        request.headers_mut().insert(REQUEST_ID, value);
    }
    let route = request.extensions().get::<MatchedPath>().map_or_else(
        || request.uri().path().to_string(),
        |p| p.as_str().to_string(),
    );
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        method = %request.method(),
        route = %route,
    );
    let started = Instant::now();
    let mut response = next.run(request).instrument(span.clone()).await;
    span.in_scope(|| {
        tracing::info!(
            status = response.status().as_u16(),
            ms = started.elapsed().as_secs_f64() * 1e3,
            "answered"
        );
    });
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    response
}

/// Visible ASCII without spaces, 1 to [`MAX_CLIENT_ID_BYTES`] bytes.
fn usable_client_id(id: &str) -> bool {
    (1..=MAX_CLIENT_ID_BYTES).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

/// `<process start, hex seconds>-<count>`: unique within the process and across restarts.
fn new_id() -> String {
    static START: OnceLock<u64> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let start = START.get_or_init(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    format!("{start:x}-{}", COUNT.fetch_add(1, Ordering::Relaxed) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_kept_only_when_plain_and_short() {
        assert!(usable_client_id("req-42"));
        assert!(!usable_client_id(""));
        assert!(!usable_client_id("has space"));
        assert!(!usable_client_id("line\nbreak"));
        assert!(!usable_client_id(&"x".repeat(MAX_CLIENT_ID_BYTES + 1)));
    }

    #[test]
    fn made_ids_differ() {
        assert_ne!(new_id(), new_id());
    }
}
