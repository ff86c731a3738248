//! Structured logs: with the JSON format, every event of a request — its "answered" line and
//! the summary of the generation it started — names the request's id, which is the client's
//! `x-request-id` when it sent one and is returned in the response either way.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use runner::logging::{LogFormat, subscriber};
use serde_json::{Value, json};
use support::{MODEL, client, server};

/// Log output collected in memory.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The events logged so far whose request span has `id`.
fn events_of(buffer: &Buffer, id: &str) -> Vec<Value> {
    let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    text.lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("each log line is JSON"))
        .filter(|event| event["span"]["request_id"] == id)
        .collect()
}

#[test]
fn json_log_lines_carry_the_request_id() {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    tracing::subscriber::set_global_default(subscriber(
        LogFormat::Json,
        "info".into(),
        move || writer.clone(),
    ))
    .unwrap();
    let Some(s) = server() else { return };

    let response = client()
        .post(format!("{}/api/generate", s.base))
        .header("x-request-id", "trace-7f3a")
        .json(&json!({"model": MODEL, "prompt": "Hi", "stream": false,
                      "options": {"temperature": 0, "num_predict": 3}}))
        .send()
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-request-id"], "trace-7f3a");
    let events = events_of(&buffer, "trace-7f3a");
    let message = |event: &Value| {
        event["fields"]["message"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let finished = events
        .iter()
        .find(|e| message(e) == "generation finished")
        .unwrap_or_else(|| panic!("no generation summary for the request in {events:#?}"));
    assert_eq!(finished["fields"]["generated_tokens"], 3);
    assert_eq!(finished["fields"]["reason"], "length");
    let answered = events
        .iter()
        .find(|e| message(e) == "answered")
        .unwrap_or_else(|| panic!("no answered line for the request in {events:#?}"));
    assert_eq!(answered["fields"]["status"], 200);
    assert_eq!(answered["span"]["route"], "/api/generate");

    // Without a usable client id, one is made, returned and logged; a hostile one is replaced.
    for sent in [None, Some("two words")] {
        let mut request = client().get(format!("{}/api/version", s.base));
        if let Some(sent) = sent {
            request = request.header("x-request-id", sent);
        }
        let response = request.send().unwrap();
        let id = response.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(!id.is_empty() && Some(id.as_str()) != sent, "{id}");
        let events = events_of(&buffer, &id);
        assert!(
            events.iter().any(|e| message(e) == "answered"),
            "no answered line for {id}"
        );
    }
}
