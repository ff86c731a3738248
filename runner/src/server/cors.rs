//! Cross-origin requests: browser apps on this machine may call the API, as they may call
//! Ollama's. Allowed by default: `localhost`, `127.0.0.1`, `[::1]` and `0.0.0.0` on any port
//! over http or https, and the app schemes of desktop shells (`app://`, `file://`,
//! `tauri://`, `vscode-webview://`, `vscode-file://`). `MLXKIT_ORIGINS` adds more, comma
//! separated: exact origins, or `*` for any.

use axum::http::{HeaderValue, Method, request::Parts};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// The environment variable naming extra allowed origins.
pub const ORIGINS_VARIABLE: &str = "MLXKIT_ORIGINS";

const LOCAL_HOSTS: &[&str] = &["localhost", "127.0.0.1", "[::1]", "0.0.0.0"];
const APP_SCHEMES: &[&str] = &[
    "app://",
    "file://",
    "tauri://",
    "vscode-webview://",
    "vscode-file://",
];

/// The CORS layer, with the extra origins read from the environment once.
pub fn layer() -> CorsLayer {
    let extra: Vec<String> = std::env::var(ORIGINS_VARIABLE)
        .unwrap_or_default()
        .split(',')
        .map(|o| o.trim().trim_end_matches('/').to_string())
        .filter(|o| !o.is_empty())
        .collect();
    CorsLayer::new()
        .allow_origin(AllowOrigin::predicate(
            move |origin: &HeaderValue, _: &Parts| {
                origin.to_str().is_ok_and(|origin| allowed(origin, &extra))
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

/// Whether a browser page from `origin` may call the API.
pub fn allowed(origin: &str, extra: &[String]) -> bool {
    if extra.iter().any(|e| e == "*" || e == origin) {
        return true;
    }
    if APP_SCHEMES.iter().any(|scheme| origin.starts_with(scheme)) {
        return true;
    }
    let Some(authority) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    let host = match authority.rsplit_once(':') {
        // A port, unless the colon is inside an IPv6 literal.
        Some((host, port)) if !port.contains(']') && port.chars().all(|c| c.is_ascii_digit()) => {
            host
        }
        _ => authority,
    };
    LOCAL_HOSTS.contains(&host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_pages_and_app_shells_are_allowed_and_others_are_not() {
        for origin in [
            "http://localhost:3000",
            "https://localhost",
            "http://127.0.0.1:8080",
            "http://[::1]:5173",
            "http://0.0.0.0",
            "tauri://localhost",
            "vscode-webview://abc",
        ] {
            assert!(allowed(origin, &[]), "{origin}");
        }
        for origin in [
            "http://evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example:80",
            "ftp://localhost",
            "null",
        ] {
            assert!(!allowed(origin, &[]), "{origin}");
        }
        let extra = vec!["https://app.example".to_string()];
        assert!(allowed("https://app.example", &extra));
        assert!(allowed("http://evil.example", &["*".to_string()]));
    }
}
