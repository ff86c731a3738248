//! What a request asked that a local server does not do, said rather than refused: a hosted
//! tool (web search, code execution) left out, a history block only a hosted tool could have
//! made skipped. Agents send these by default and work without them, so a 400 would stop an
//! agent for nothing; silence would hide that part of the request was not honoured. Each
//! warning is logged, and the response carries them where its API has a place: the
//! [`HEADER`] on every API, and the Responses API's `metadata` too.

use axum::http::HeaderValue;
use axum::response::Response;

/// The response header that carries a request's warnings, joined by `"; "`.
pub const HEADER: &str = "x-mlxkit-warning";

/// The most characters of warnings put in a response: a client shows them, not a log.
const MAX_CHARS: usize = 480;

/// The warnings one request raised, in order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Warnings(Vec<String>);

impl Warnings {
    /// Adds a warning and logs it.
    pub fn push(&mut self, warning: impl Into<String>) {
        let warning = warning.into();
        tracing::warn!("{warning}");
        self.0.push(warning);
    }

    /// Whether none was raised.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The warnings as one line of at most [`MAX_CHARS`] characters (the rest is in the log).
    pub fn joined(&self) -> String {
        let all = self.0.join("; ");
        match all.char_indices().nth(MAX_CHARS) {
            Some((cut, _)) => format!("{}...", &all[..cut]),
            None => all,
        }
    }

    /// Puts the warnings in `response`'s [`HEADER`], if there are any. Header values are
    /// visible ASCII: other characters become `?`.
    pub fn attach(&self, response: &mut Response) {
        if self.is_empty() {
            return;
        }
        let ascii: String = self
            .joined()
            .chars()
            .map(|c| {
                if c == ' ' || c.is_ascii_graphic() {
                    c
                } else {
                    '?'
                }
            })
            .collect();
        if let Ok(value) = HeaderValue::from_str(&ascii) {
            response.headers_mut().insert(HEADER, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;

    #[test]
    fn warnings_are_joined_capped_and_put_in_a_header() {
        let mut warnings = Warnings::default();
        let mut response = "ok".into_response();
        warnings.attach(&mut response);
        assert!(response.headers().get(HEADER).is_none());

        warnings.push("tools[0] `web_search` is hosted — dropped");
        warnings.push("x".repeat(1000));
        let joined = warnings.joined();
        assert!(joined.starts_with("tools[0] `web_search` is hosted — dropped; xxx"));
        assert_eq!(joined.chars().count(), MAX_CHARS + 3);
        assert!(joined.ends_with("x..."));
        warnings.attach(&mut response);
        let header = response.headers()[HEADER].to_str().unwrap();
        assert!(header.starts_with("tools[0] `web_search` is hosted ? dropped; x"));
    }
}
