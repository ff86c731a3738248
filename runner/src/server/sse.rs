//! Server-sent event streams: each generation output becomes zero or more JSON events, in the
//! shape of the API that was called.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio::sync::mpsc::Receiver;

use crate::server::error::ApiError;
use crate::server::generation::Output;

/// One API's event shapes for a stream of `T`s (a generation's outputs, or OpenAI's `n`
/// choices' outputs tagged with their index).
pub trait SseShape<T = Output>: Send + 'static {
    /// Events sent before the first output (Anthropic's `message_start`).
    fn opening(&mut self) -> Vec<Value> {
        Vec::new()
    }

    /// Events for one output.
    fn chunks(&mut self, output: &T) -> Vec<Value>;

    /// Whether each event carries an `event:` line named by its payload's `type` (Anthropic);
    /// otherwise events are bare `data:` lines (OpenAI).
    fn named_events(&self) -> bool {
        false
    }

    /// The line that ends the stream after the last output (OpenAI's `[DONE]`).
    fn done_marker(&self) -> Option<&'static str> {
        Some("[DONE]")
    }
}

/// A streamed `text/event-stream` body of `outputs` shaped by `shape`.
pub fn sse<T: Send + 'static>(outputs: Receiver<T>, mut shape: impl SseShape<T>) -> Response {
    let first = shape.opening();
    let opening = render(&shape, first);
    let events = futures_util::stream::unfold(
        (outputs, shape, Some(opening), false),
        |(mut outputs, mut shape, opening, done)| async move {
            if let Some(opening) = opening.filter(|o| !o.is_empty()) {
                return Some((Ok(Bytes::from(opening)), (outputs, shape, None, false)));
            }
            if done {
                return None;
            }
            match outputs.recv().await {
                Some(output) => {
                    let events = shape.chunks(&output);
                    let text = render(&shape, events);
                    Some((
                        Ok::<Bytes, Infallible>(Bytes::from(text)),
                        (outputs, shape, None, false),
                    ))
                }
                None => {
                    let text = shape
                        .done_marker()
                        .map(|marker| format!("data: {marker}\n\n"))
                        .unwrap_or_default();
                    Some((Ok(Bytes::from(text)), (outputs, shape, None, true)))
                }
            }
        },
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(events))
        .unwrap_or_else(|_| ApiError::internal("building the response").into_response())
}

fn render<T>(shape: &impl SseShape<T>, events: Vec<Value>) -> String {
    let mut text = String::new();
    for event in events {
        if shape.named_events()
            && let Some(name) = event.get("type").and_then(Value::as_str)
        {
            text.push_str("event: ");
            text.push_str(name);
            text.push('\n');
        }
        text.push_str("data: ");
        text.push_str(&event.to_string());
        text.push_str("\n\n");
    }
    text
}
