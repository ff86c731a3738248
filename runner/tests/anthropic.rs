//! Anthropic's Messages API end to end on `smollm2:135m`: the response and event shapes
//! (insta snapshots, volatile values redacted), tool use round trips, stop sequences, token
//! counting and errors in Anthropic's shape.

mod support;

use serde_json::{Value, json};
use support::{MODEL, PNG, Server, client, post, redact, serial, server};

/// The named events of a streamed response, as (event, data) pairs.
fn post_events(s: &Server, body: Value) -> Vec<(String, Value)> {
    let r = client()
        .post(format!("{}/v1/messages", s.base))
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let text = r.text().unwrap();
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let mut lines = block.lines();
        let name = lines
            .next()
            .and_then(|l| l.strip_prefix("event: "))
            .unwrap();
        let data = lines.next().and_then(|l| l.strip_prefix("data: ")).unwrap();
        let data: Value = serde_json::from_str(data).unwrap();
        assert_eq!(
            data["type"], name,
            "an event is named by its payload's type"
        );
        events.push((name.to_string(), data));
    }
    events
}

fn weather_tool() -> Value {
    json!({"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"], "additionalProperties": false}})
}

#[test]
fn a_message_and_its_stream_say_the_same() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let body = json!({"model": MODEL, "max_tokens": 8, "temperature": 0,
                      "system": [{"type": "text", "text": "You are terse."}],
                      "messages": [{"role": "user", "content": "Say hi."}]});
    let (status, reply) = post(s, "/v1/messages", body.clone());
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["type"], "message");
    assert!(reply["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(reply["stop_reason"], "max_tokens");
    assert_eq!(reply["usage"]["output_tokens"], 8);
    insta::assert_json_snapshot!("anthropic_message", redact(&reply));

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let events = post_events(s, streamed);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        &names[..3],
        ["message_start", "ping", "content_block_start"]
    );
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let text: String = events
        .iter()
        .filter_map(|(_, e)| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, reply["content"][0]["text"].as_str().unwrap());
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["usage"]["output_tokens"], 8);
    insta::assert_json_snapshot!("anthropic_message_start", redact(&events[0].1));
    insta::assert_json_snapshot!("anthropic_message_delta", redact(delta));
}

#[test]
fn a_tool_use_round_trip() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let question = json!({"role": "user", "content": "What is the weather in Paris?"});
    let (status, reply) = post(
        s,
        "/v1/messages",
        json!({"model": MODEL, "max_tokens": 64, "temperature": 0,
               "tools": [weather_tool()],
               "tool_choice": {"type": "tool", "name": "get_weather",
                               "disable_parallel_tool_use": true},
               "messages": [question]}),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["stop_reason"], "tool_use", "{reply}");
    let call = reply["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap()
        .clone();
    assert_eq!(call["name"], "get_weather");
    assert!(call["input"]["city"].is_string(), "{call}");
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"));
    // The arguments are generated text: their shape is checked above, not their words.
    let mut shape = call.clone();
    shape["input"] = json!("[input]");
    insta::assert_json_snapshot!("anthropic_tool_use", redact(&shape));

    // The result goes back with an agent's reminder after it, in place.
    let turns = json!([
        question,
        {"role": "assistant", "content": reply["content"]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call["id"], "content": "18C and sunny"},
            {"type": "text", "text": "<system-reminder>Answer in one line.</system-reminder>"}
        ]}
    ]);
    let (status, answer) = post(
        s,
        "/v1/messages",
        json!({"model": MODEL, "max_tokens": 16, "temperature": 0,
               "tools": [weather_tool()], "messages": turns}),
    );
    assert_eq!(status, 200, "{answer}");
    // The conversation up to the call was evaluated before: the cache holds it.
    assert!(
        answer["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0,
        "{answer}"
    );
    let (status, count) = post(
        s,
        "/v1/messages/count_tokens",
        json!({"model": MODEL, "tools": [weather_tool()], "messages": turns}),
    );
    assert_eq!(status, 200, "{count}");
    let usage = &answer["usage"];
    assert_eq!(
        count["input_tokens"].as_u64(),
        Some(
            usage["input_tokens"].as_u64().unwrap()
                + usage["cache_read_input_tokens"].as_u64().unwrap()
        ),
        "count_tokens counts the prompt the reply evaluated: {count} {usage}"
    );

    // Streamed, the call is one tool_use block whose input arrives as JSON.
    let events = post_events(
        s,
        json!({"model": MODEL, "max_tokens": 64, "temperature": 0, "stream": true,
               "tools": [weather_tool()],
               "tool_choice": {"type": "tool", "name": "get_weather",
                               "disable_parallel_tool_use": true},
               "messages": [question]}),
    );
    let start = events
        .iter()
        .find(|(_, e)| e["content_block"]["type"] == "tool_use")
        .unwrap();
    let index = &start.1["index"];
    let partial: String = events
        .iter()
        .filter(|(_, e)| &e["index"] == index)
        .filter_map(|(_, e)| e["delta"]["partial_json"].as_str())
        .collect();
    let input: Value = serde_json::from_str(&partial).unwrap();
    assert_eq!(input, call["input"], "the stream calls as the message did");
}

#[test]
fn stop_sequences_are_reported() {
    let Some(s) = server() else { return };
    let _serial = serial();
    // Whatever greedy text comes, its second character is a stop sequence of it.
    let (_, probe) = post(
        s,
        "/v1/messages",
        json!({"model": MODEL, "max_tokens": 8, "temperature": 0,
               "messages": [{"role": "user", "content": "Name a color."}]}),
    );
    let text = probe["content"][0]["text"].as_str().unwrap().to_string();
    let stop: String = text.chars().skip(1).take(1).collect();
    let (status, reply) = post(
        s,
        "/v1/messages",
        json!({"model": MODEL, "max_tokens": 8, "temperature": 0, "stop_sequences": [stop],
               "messages": [{"role": "user", "content": "Name a color."}]}),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["stop_reason"], "stop_sequence", "{reply}");
    assert_eq!(reply["stop_sequence"], json!(stop));
}

#[test]
fn errors_come_in_anthropics_shape() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let user = json!([{"role": "user", "content": "hi"}]);
    for (body, status, kind, needle) in [
        (
            json!({"model": "nosuch:1b", "max_tokens": 4, "messages": user}),
            404,
            "not_found_error",
            "not found",
        ),
        (
            json!({"model": MODEL, "messages": user}),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            json!({"model": MODEL, "max_tokens": 4, "messages": [
                {"role": "user", "content": [{"type": "image", "source": {
                    "type": "base64", "media_type": "image/png", "data": PNG}}]}]}),
            400,
            "invalid_request_error",
            "does not support images",
        ),
        (
            json!({"model": MODEL, "max_tokens": 4, "messages": [
                {"role": "system", "content": "no"}]}),
            400,
            "invalid_request_error",
            "top-level `system`",
        ),
        (
            json!({"model": MODEL, "max_tokens": 4, "messages": user,
                   "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            400,
            "invalid_request_error",
            "server tool",
        ),
        (
            json!({"model": MODEL, "max_tokens": 4, "messages": user,
                   "tool_choice": {"type": "tool"}}),
            400,
            "invalid_request_error",
            "needs a `name`",
        ),
    ] {
        let (got, reply) = post(s, "/v1/messages", body.clone());
        assert_eq!(got, status, "{body}: {reply}");
        assert_eq!(reply["type"], "error", "{reply}");
        assert_eq!(reply["error"]["type"], kind, "{reply}");
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(needle),
            "`{message}` should mention `{needle}`"
        );
    }
    // Malformed JSON is refused in the same shape.
    let r = client()
        .post(format!("{}/v1/messages", s.base))
        .header("content-type", "application/json")
        .body("{oops")
        .send()
        .unwrap();
    assert_eq!(r.status(), 400);
    let reply: Value = r.json().unwrap();
    assert_eq!(reply["error"]["type"], "invalid_request_error");
    insta::assert_json_snapshot!("anthropic_error", reply);
}
