//! Server-sent event streams: each generation output becomes zero or more JSON events, in the
//! shape of the API that was called.

use std::convert::Infallible;
use std::time::Duration;

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

    /// An event that tells the client the answer is still coming, sent after [`HEARTBEAT`]
    /// without output (a long prompt's prefill, a tool call held until its arguments are
    /// whole). `None` sends an SSE comment, which keeps proxies from closing the connection
    /// but which clients do not see as an event.
    fn heartbeat(&mut self) -> Option<Value> {
        None
    }

    /// The line that ends the stream after the last output (OpenAI's `[DONE]`).
    fn done_marker(&self) -> Option<&'static str> {
        Some("[DONE]")
    }
}

/// How long a stream stays silent before it sends a heartbeat. Clients drop a stream that
/// sends nothing for a while (Codex CLI: 300 s without an *event*, and it then retries,
/// prefilling again), and a processor can take longer than that to read a coding agent's
/// first prompt; ten seconds is far inside any such timeout and costs a few bytes.
const HEARTBEAT: Duration = Duration::from_secs(10);

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
            let Ok(next) = tokio::time::timeout(HEARTBEAT, outputs.recv()).await else {
                let text = match shape.heartbeat() {
                    Some(event) => render(&shape, vec![event]),
                    None => ": heartbeat\n\n".to_string(),
                };
                return Some((Ok(Bytes::from(text)), (outputs, shape, None, false)));
            };
            match next {
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

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;
    use serde_json::json;
    use tokio::sync::mpsc;

    use super::*;

    /// Each output is one bare event; the heartbeat is `ping` when `pings`, else a comment.
    struct Plain {
        pings: bool,
    }

    impl SseShape<String> for Plain {
        fn chunks(&mut self, output: &String) -> Vec<Value> {
            vec![json!({ "text": output })]
        }

        fn heartbeat(&mut self) -> Option<Value> {
            self.pings.then(|| json!({ "type": "ping" }))
        }
    }

    /// The body's pieces as text, one per piece the stream yields, until it ends.
    async fn pieces(response: Response, outputs: mpsc::Sender<String>) -> Vec<String> {
        let mut body = response.into_body().into_data_stream();
        let mut pieces = Vec::new();
        // Silence first (two heartbeats' worth), then one output, then the end.
        let mut script = vec![None, None, Some("hello".to_string())].into_iter();
        let mut outputs = Some(outputs);
        while let Some(piece) = body.next().await {
            let piece = piece.map(|b| String::from_utf8_lossy(&b).into_owned());
            pieces.push(piece.unwrap_or_else(|e| format!("error: {e}")));
            match script.next() {
                Some(Some(text)) => {
                    if let Some(tx) = &outputs {
                        let _ = tx.send(text).await;
                    }
                }
                Some(None) => {}
                None => outputs = None,
            }
        }
        pieces
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_stream_sends_a_comment_until_output_arrives() {
        let (tx, rx) = mpsc::channel(4);
        let pieces = pieces(sse(rx, Plain { pings: false }), tx).await;
        assert_eq!(
            pieces,
            [
                ": heartbeat\n\n",
                ": heartbeat\n\n",
                ": heartbeat\n\n",
                "data: {\"text\":\"hello\"}\n\n",
                "data: [DONE]\n\n",
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_shape_with_a_heartbeat_event_sends_that_event() {
        let (tx, rx) = mpsc::channel(4);
        let pieces = pieces(sse(rx, Plain { pings: true }), tx).await;
        assert_eq!(pieces[0], "data: {\"type\":\"ping\"}\n\n");
        assert_eq!(pieces[3], "data: {\"text\":\"hello\"}\n\n");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_with_steady_output_sends_no_heartbeat() {
        let (tx, rx) = mpsc::channel(4);
        for text in ["a", "b"] {
            tx.send(text.to_string()).await.unwrap();
        }
        drop(tx);
        let mut body = sse(rx, Plain { pings: false })
            .into_body()
            .into_data_stream();
        let mut text = String::new();
        while let Some(Ok(piece)) = body.next().await {
            text.push_str(&String::from_utf8_lossy(&piece));
        }
        assert_eq!(
            text,
            "data: {\"text\":\"a\"}\n\ndata: {\"text\":\"b\"}\n\ndata: [DONE]\n\n"
        );
    }
}
