//! OpenAI's Responses API on `smollm2:135m`: the response object and the stream's event
//! sequence (insta snapshots, volatile values redacted), `previous_response_id` continuing a
//! stored conversation through the prefix cache, and errors.

mod support;

use serde_json::{Value, json};
use support::{MODEL, client, post, redact, serial, server};

#[test]
fn a_response_its_stream_and_a_follow_up() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let body = json!({"model": MODEL, "instructions": "You are terse.", "input": "Say hi.",
                      "max_output_tokens": 6, "temperature": 0});
    let (status, first) = post(s, "/v1/responses", body.clone());
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["object"], "response");
    assert_eq!(first["status"], "incomplete");
    assert_eq!(first["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(first["usage"]["output_tokens"], 6);
    insta::assert_json_snapshot!("response", redact(&first));

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let text = client()
        .post(format!("{}/v1/responses", s.base))
        .json(&streamed)
        .send()
        .unwrap()
        .text()
        .unwrap();
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    // Runs of deltas are one entry: how many pieces the text came in is not the shape.
    let mut kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    kinds.dedup();
    insta::assert_json_snapshot!("response_stream_events", kinds);
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], i, "events are numbered in order");
    }
    let deltas: String = events.iter().filter_map(|e| e["delta"].as_str()).collect();
    assert_eq!(
        deltas,
        first["output"][0]["content"][0]["text"].as_str().unwrap()
    );

    let (status, follow) = post(
        s,
        "/v1/responses",
        json!({"model": MODEL, "previous_response_id": first["id"], "input": "Again.",
               "max_output_tokens": 4, "temperature": 0}),
    );
    assert_eq!(status, 200, "{follow}");
    assert_eq!(follow["previous_response_id"], first["id"]);
    assert!(
        follow["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0,
        "the stored conversation is the follow-up's cached prefix: {follow}"
    );
}

#[test]
fn responses_refuse_what_they_cannot_do() {
    let Some(s) = server() else { return };
    let _serial = serial();
    for (body, status, needle) in [
        (
            json!({"model": MODEL, "previous_response_id": "resp_nope", "input": "x"}),
            404,
            "not stored",
        ),
        (
            json!({"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]}),
            400,
            "only function tools",
        ),
        (json!({"model": MODEL, "input": []}), 400, "empty"),
        (
            json!({"model": MODEL, "input": [{"type": "computer_call"}]}),
            400,
            "not supported",
        ),
    ] {
        let (got, reply) = post(s, "/v1/responses", body.clone());
        assert_eq!(got, status, "{body}: {reply}");
        let message = reply["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(needle),
            "`{message}` should mention `{needle}`"
        );
    }
}
