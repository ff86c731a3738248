//! The `x-mlxkit-schema-loosened` response header: where a request's schemas were loosened
//! to compile (issue 48), on every API, without each API's handler carrying it.
//!
//! The request builder ([`crate::server::request::start`]) records its notes with [`record`]
//! while the handler runs; the middleware [`report`] gives each request a slot for them and
//! turns what was recorded into the header once the handler has built its response (for a
//! stream, before its body: the builder runs before the first byte). Work outside a request
//! (the CLI) records into nothing.

use std::sync::{Arc, Mutex};

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

/// The header's name.
pub const HEADER: &str = "x-mlxkit-schema-loosened";

/// The longest header value sent; past it the notes end with how many more there were.
const MAX_HEADER_BYTES: usize = 1024;

tokio::task_local! {
    /// The notes recorded while the current request's handler runs.
    static NOTES: Arc<Mutex<Vec<String>>>;
}

/// Records `notes` for the current request's header; outside a request, does nothing.
pub fn record(notes: &[String]) {
    if notes.is_empty() {
        return;
    }
    let _ = NOTES.try_with(|slot| {
        slot.lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .extend_from_slice(notes);
    });
}

/// Middleware: runs the request with a slot for notes, and reports them in the header.
pub async fn report(request: Request, next: Next) -> Response {
    let slot = Arc::new(Mutex::new(Vec::new()));
    let mut response = NOTES.scope(Arc::clone(&slot), next.run(request)).await;
    let notes = std::mem::take(&mut *slot.lock().unwrap_or_else(|p| p.into_inner()));
    if !notes.is_empty()
        && let Ok(value) = HeaderValue::from_str(&header_value(&notes))
    {
        response.headers_mut().insert(HEADER, value);
    }
    response
}

/// The notes joined by `; `, in printable ASCII (other bytes percent-encoded, as a URI would
/// write them), at most [`MAX_HEADER_BYTES`]: `…; and 4 more` says what did not fit.
pub fn header_value(notes: &[String]) -> String {
    let mut out = String::new();
    for (i, note) in notes.iter().enumerate() {
        let piece = printable(note);
        let separator = if out.is_empty() { "" } else { "; " };
        let rest = notes.len() - i;
        let tail = format!("; and {rest} more");
        if out.len() + separator.len() + piece.len() + tail.len() > MAX_HEADER_BYTES {
            out.push_str(if out.is_empty() { &tail[2..] } else { &tail });
            return out;
        }
        out.push_str(separator);
        out.push_str(&piece);
    }
    out
}

fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_joined_printable_and_bounded() {
        let notes = vec![
            "tools[0] #/properties/x: propertyNames".to_string(),
            "format #/properties/é: not".to_string(),
        ];
        assert_eq!(
            header_value(&notes),
            "tools[0] #/properties/x: propertyNames; format #/properties/%C3%A9: not"
        );
        let many: Vec<String> = (0..200)
            .map(|i| format!("tools[{i}] #/properties/p: propertyNames"))
            .collect();
        let value = header_value(&many);
        assert!(value.len() <= MAX_HEADER_BYTES, "{}", value.len());
        assert!(value.ends_with(" more"), "{value}");
        assert!(HeaderValue::from_str(&value).is_ok());
        let huge = vec!["x".repeat(5000)];
        assert_eq!(header_value(&huge), "and 1 more");
    }

    #[tokio::test]
    async fn notes_recorded_inside_a_request_reach_its_slot_only() {
        record(&["outside".to_string()]);
        let slot = Arc::new(Mutex::new(Vec::new()));
        NOTES
            .scope(Arc::clone(&slot), async {
                record(&["a".to_string()]);
                record(&[]);
                record(&["b".to_string()]);
            })
            .await;
        assert_eq!(*slot.lock().unwrap(), ["a", "b"]);
    }
}
