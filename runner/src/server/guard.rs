//! What keeps a web page from driving the server. A page may send any site a "simple" request
//! (a `text/plain` POST, say) without asking first; CORS then only hides the answer, after the
//! server has copied or replaced a model. So before routing, three rules, each failure a 403
//! (or a 415 for the body's type) naming the rule, in the route's API error shape:
//!
//! 1. **Host** must be allowed ([`hosts`](crate::server::hosts)): a DNS-rebinding page names its
//!    own domain.
//! 2. **Origin**, when sent, must be allowed ([`origins`](crate::server::origins)) or be the
//!    server's own (`http(s)://` + the request's `Host`). Every current browser sends `Origin`
//!    with every POST, PUT and DELETE, and with every cross-origin request, so this is what
//!    stops cross-site requests; it applies to preflights too.
//! 3. **Content-Type**: a request that can change state or run a model (POST, PUT, PATCH,
//!    DELETE) must label its body JSON (`application/json` or `…+json`, parameters allowed), or
//!    `multipart/form-data` on the routes that take a form. Two more labels are taken from
//!    clients that send no `Origin`, which browsers always do: `application/x-www-form-urlencoded`,
//!    which `curl -d` sends (Ollama's documented examples), and none at all (a script posting a
//!    string). `text/plain`, the one form encoding that can spell JSON, is always refused.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::server::access::Access;
use crate::server::error::ApiError;

/// The routes whose body is a form rather than JSON.
const FORM_ROUTES: &[&str] = &["/v1/audio/transcriptions"];

/// Middleware: applies the three rules above.
pub async fn check(State(access): State<Arc<Access>>, request: Request, next: Next) -> Response {
    match refusal(&access, &request) {
        Some(refused) => {
            tracing::info!(
                status = refused.status.as_u16(),
                "refused {} {}: {}",
                request.method(),
                request.uri().path(),
                refused.message
            );
            refused.in_dialect_of(request.uri().path()).into_response()
        }
        None => next.run(request).await,
    }
}

/// Why `request` is refused, or `None` when it may go on.
fn refusal(access: &Access, request: &Request) -> Option<ApiError> {
    let headers = request.headers();
    let host = match request.uri().authority() {
        // HTTP/2's `:authority`, or an absolute-form request line.
        Some(authority) => Some(authority.as_str().to_string()),
        None => match headers.get(header::HOST).map(|h| h.to_str()) {
            Some(Ok(host)) => Some(host.to_string()),
            Some(Err(_)) => return Some(forbidden("the Host header is not text".to_string())),
            None => None,
        },
    };
    if let Some(host) = &host
        && !access.hosts.allows(host)
    {
        return Some(forbidden(format!(
            "host `{host}` is not allowed: requests must name this machine (localhost or an \
             address), or a name listed in MLXKIT_HOSTS (a guard against DNS rebinding)"
        )));
    }
    let origin = match headers.get(header::ORIGIN).map(|o| o.to_str()) {
        Some(Ok(origin)) => Some(origin),
        Some(Err(_)) => return Some(forbidden("the Origin header is not text".to_string())),
        None => None,
    };
    if let Some(origin) = origin
        && !access.origins.allows(origin)
        && !same_origin(origin, host.as_deref())
    {
        return Some(forbidden(format!(
            "origin `{origin}` is not allowed to call this server: pages on this machine are, \
             and the origins listed in MLXKIT_ORIGINS"
        )));
    }
    let changes_state =
        [Method::POST, Method::PUT, Method::PATCH, Method::DELETE].contains(request.method());
    if changes_state {
        let form_route = FORM_ROUTES.contains(&request.uri().path());
        return body_type_refusal(headers, origin.is_some(), form_route);
    }
    None
}

/// Why the body's `Content-Type` is refused, or `None`.
fn body_type_refusal(
    headers: &HeaderMap,
    from_browser: bool,
    form_route: bool,
) -> Option<ApiError> {
    let expected = if form_route {
        "multipart/form-data"
    } else {
        "application/json"
    };
    let label = match headers.get(header::CONTENT_TYPE).map(|c| c.to_str()) {
        Some(Ok(label)) => label,
        Some(Err(_)) => return Some(unsupported("a Content-Type that is not text", expected)),
        None if from_browser => return Some(unsupported("no Content-Type", expected)),
        None => return None,
    };
    let media_type = label
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let json = media_type == "application/json"
        || media_type
            .strip_prefix("application/")
            .is_some_and(|subtype| subtype.ends_with("+json"));
    let accepted = json
        || (form_route && media_type == "multipart/form-data")
        || (!from_browser && media_type == "application/x-www-form-urlencoded");
    (!accepted).then(|| unsupported(&format!("Content-Type `{media_type}`"), expected))
}

/// Whether `origin` is the server's own address as the request named it.
fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else {
        return false;
    };
    let origin = origin.to_ascii_lowercase();
    let host = host.to_ascii_lowercase();
    origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .is_some_and(|authority| authority == host)
}

fn forbidden(message: String) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, message)
}

fn unsupported(what: &str, expected: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        format!(
            "a request with {what} is refused here (a web page could send it): send \
             `Content-Type: {expected}`"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::hosts::AllowedHosts;
    use crate::server::origins::AllowedOrigins;

    fn request(method: Method, path: &str, headers: &[(&str, &str)]) -> Request {
        let mut builder = Request::builder().method(method).uri(path);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(axum::body::Body::empty()).unwrap()
    }

    fn refused(
        access: &Access,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Option<u16> {
        refusal(access, &request(method, path, headers)).map(|e| e.status.as_u16())
    }

    #[test]
    fn a_cross_site_page_is_refused_whatever_it_sends() {
        let access = Access::default();
        let evil = ("origin", "https://evil.example");
        let host = ("host", "127.0.0.1:11434");
        for content_type in [
            "text/plain",
            "application/json",
            "application/x-www-form-urlencoded",
        ] {
            let headers = [evil, host, ("content-type", content_type)];
            assert_eq!(
                refused(&access, Method::POST, "/api/copy", &headers),
                Some(403)
            );
        }
        assert_eq!(
            refused(&access, Method::GET, "/api/tags", &[evil, host]),
            Some(403)
        );
        assert_eq!(
            refused(&access, Method::OPTIONS, "/api/chat", &[evil, host]),
            Some(403)
        );
        assert_eq!(
            refused(
                &access,
                Method::POST,
                "/api/copy",
                &[("origin", "null"), host]
            ),
            Some(403)
        );
    }

    #[test]
    fn a_rebound_host_is_refused_and_local_ones_pass() {
        let access = Access::default();
        let tags = |host: &str| refused(&access, Method::GET, "/api/tags", &[("host", host)]);
        assert_eq!(tags("attacker.example:11434"), Some(403));
        assert_eq!(tags("127.0.0.1:11434"), None);
        assert_eq!(tags("localhost:11434"), None);
        assert_eq!(tags("[::1]:11434"), None);
        let listed = Access {
            hosts: AllowedHosts::with_extra("box.lan"),
            ..Access::default()
        };
        assert_eq!(
            refused(
                &listed,
                Method::GET,
                "/api/tags",
                &[("host", "box.lan:11434")]
            ),
            None
        );
    }

    #[test]
    fn body_types_follow_the_client() {
        let access = Access::default();
        let post = |path: &str, headers: &[(&str, &str)]| {
            let mut all = vec![("host", "localhost:11434")];
            all.extend_from_slice(headers);
            refused(&access, Method::POST, path, &all)
        };
        let local = ("origin", "http://localhost:3000");
        // SDKs and agents.
        assert_eq!(
            post("/api/chat", &[("content-type", "application/json")]),
            None
        );
        assert_eq!(
            post(
                "/api/chat",
                &[("content-type", "Application/JSON; charset=utf-8")]
            ),
            None
        );
        assert_eq!(
            post(
                "/v1/messages",
                &[("content-type", "application/vnd.api+json")]
            ),
            None
        );
        // `curl -d`, and a script with no label.
        assert_eq!(
            post(
                "/api/show",
                &[("content-type", "application/x-www-form-urlencoded")]
            ),
            None
        );
        assert_eq!(post("/api/show", &[]), None);
        // A page's labels that need no preflight, from an allowed page.
        assert_eq!(
            post("/api/create", &[local, ("content-type", "text/plain")]),
            Some(415)
        );
        assert_eq!(
            post(
                "/api/create",
                &[local, ("content-type", "application/x-www-form-urlencoded")]
            ),
            Some(415)
        );
        assert_eq!(post("/api/create", &[local]), Some(415));
        assert_eq!(
            post(
                "/api/create",
                &[local, ("content-type", "application/json")]
            ),
            None
        );
        // `text/plain` spells JSON: refused from anyone.
        assert_eq!(
            post("/api/copy", &[("content-type", "text/plain")]),
            Some(415)
        );
        // Forms only where a form is taken.
        assert_eq!(
            post(
                "/v1/audio/transcriptions",
                &[local, ("content-type", "multipart/form-data; boundary=x")]
            ),
            None
        );
        assert_eq!(
            post(
                "/api/chat",
                &[("content-type", "multipart/form-data; boundary=x")]
            ),
            Some(415)
        );
        // Reads are not checked.
        assert_eq!(refused(&access, Method::GET, "/api/tags", &[local]), None);
    }

    #[test]
    fn a_page_served_under_the_servers_own_name_is_its_own_origin() {
        let access = Access {
            hosts: AllowedHosts::with_extra("llm.box.lan"),
            origins: AllowedOrigins::default(),
            api_key: None,
        };
        let headers = [
            ("host", "llm.box.lan:11434"),
            ("origin", "http://llm.box.lan:11434"),
            ("content-type", "application/json"),
        ];
        assert_eq!(refused(&access, Method::POST, "/api/chat", &headers), None);
        let other = [
            ("host", "llm.box.lan:11434"),
            ("origin", "http://llm.box.lan:8080"),
        ];
        assert_eq!(
            refused(&access, Method::GET, "/api/tags", &other),
            Some(403)
        );
    }
}
