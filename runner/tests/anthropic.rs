//! Anthropic's Messages API end to end on `smollm2:135m`: the response and event shapes
//! (insta snapshots, volatile values redacted), tool use round trips, stop sequences, token
//! counting and errors in Anthropic's shape; and every message shape Claude Code sends
//! accepted (mid-conversation system messages, thinking, output and context settings, cache
//! control, server tools dropped with a warning, a `max_tokens` beyond the context).

use crate::support;

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

/// Creates `name` from the test model with `template` (and `parameters`), once per server.
fn create_variant(s: &Server, name: &str, template: Option<&str>, parameters: Value) {
    let mut body = json!({"model": name, "from": MODEL, "parameters": parameters,
                          "stream": false});
    if let Some(template) = template {
        body["template"] = json!(template);
    }
    let (status, reply) = post(s, "/api/create", body);
    assert_eq!(status, 200, "{reply}");
}

/// ChatML, as SmolLM2's, that raises on a system turn after the first (as templates that
/// demand alternating roles do).
const REFUSING: &str = "{% for m in messages %}{% if m.role == 'system' and not loop.first %}\
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// ChatML that prints only the first system turn and the user and assistant turns.
const DROPPING: &str = "{% for m in messages %}{% if loop.first or m.role != 'system' %}\
<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Claude Code's `mid-conversation-system` beta: a `system` message inside `messages`. Where
/// the template takes it (SmolLM2's ChatML) it is a system turn of its own, so the prompt is
/// longer than with its text folded into the user turn; where the template refuses it or
/// leaves it out, it is folded into the user turn beside it: the prompt is exactly the folded
/// one. Either way the request is answered.
#[test]
fn a_mid_conversation_system_message_is_rendered_in_place_or_folded() {
    let Some(s) = server() else { return };
    let _serial = serial();
    create_variant(s, "smollm2:refuses-late-system", Some(REFUSING), json!({}));
    create_variant(s, "smollm2:drops-late-system", Some(DROPPING), json!({}));
    let late = json!([
        {"role": "user", "content": "List three fruits."},
        {"role": "system", "content": [{"type": "text", "text": "Answer in French.",
                                         "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": "Only the names."}
    ]);
    let folded = json!([{"role": "user",
        "content": "List three fruits.\n\nAnswer in French.\n\nOnly the names."}]);
    let count = |model: &str, messages: &Value| {
        let (status, count) = post(
            s,
            "/v1/messages/count_tokens",
            json!({"model": model, "system": "You are terse.", "messages": messages}),
        );
        assert_eq!(status, 200, "{model}: {count}");
        count["input_tokens"].as_u64().unwrap()
    };
    let in_place = count(MODEL, &late);
    assert!(
        in_place > count(MODEL, &folded),
        "ChatML renders the system message as a turn of its own"
    );
    for model in ["smollm2:refuses-late-system", "smollm2:drops-late-system"] {
        assert_eq!(count(model, &late), count(model, &folded), "{model}");
    }
    for model in [
        MODEL,
        "smollm2:refuses-late-system",
        "smollm2:drops-late-system",
    ] {
        let (status, reply) = post(
            s,
            "/v1/messages",
            json!({"model": model, "max_tokens": 4, "temperature": 0,
                   "system": "You are terse.", "messages": late}),
        );
        assert_eq!(status, 200, "{model}: {reply}");
        assert_eq!(reply["type"], "message", "{reply}");
    }
}

/// The fields Claude Code sends besides the conversation are accepted, each with its stated
/// effect: `thinking` in its three forms, `context_management` (no edits made, and said so),
/// `output_config.effort`, `cache_control` on blocks and tools, `metadata`, `service_tier`,
/// `container` and the beta headers.
#[test]
fn the_fields_claude_code_sends_are_accepted() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let mut tool = weather_tool();
    tool["cache_control"] = json!({"type": "ephemeral"});
    for thinking in [
        json!({"type": "adaptive"}),
        json!({"type": "enabled", "budget_tokens": 1024}),
        json!({"type": "disabled"}),
    ] {
        let body = json!({
            "model": MODEL, "max_tokens": 4, "temperature": 0, "stream": false,
            "thinking": thinking,
            "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
            "output_config": {"effort": "high"},
            "metadata": {"user_id": "user_abc_account_123_session_x"},
            "service_tier": "auto",
            "container": null,
            "system": [{"type": "text", "text": "You are Claude Code.",
                        "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            "tools": [tool],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>Be brief.</system-reminder>"},
                {"type": "text", "text": "Say hi.", "cache_control": {"type": "ephemeral"}}]}]
        });
        let r = client()
            .post(format!("{}/v1/messages", s.base))
            .header("anthropic-version", "2023-06-01")
            .header(
                "anthropic-beta",
                "claude-code-20250219,interleaved-thinking-2025-05-14,\
                 context-management-2025-06-27,mid-conversation-system-2026-04-07",
            )
            .json(&body)
            .send()
            .unwrap();
        assert_eq!(r.status(), 200, "{thinking}");
        assert!(r.headers().get("x-mlxkit-warning").is_none());
        let reply: Value = r.json().unwrap();
        assert_eq!(reply["type"], "message", "{reply}");
        assert_eq!(
            reply["context_management"],
            json!({"applied_edits": []}),
            "{reply}"
        );
    }
}

/// Anthropic's own tools (server tools like web search, and the tools whose schemas live in
/// Claude) and the MCP connector are left out with a warning in a header and the log; the
/// client's own tools are still offered and called.
#[test]
fn anthropic_server_tools_are_dropped_with_a_warning() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let r = client()
        .post(format!("{}/v1/messages", s.base))
        .json(&json!({
            "model": MODEL, "max_tokens": 64, "temperature": 0,
            "tools": [
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
                {"type": "bash_20250124", "name": "bash"},
                {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
                weather_tool()
            ],
            "mcp_servers": [{"type": "url", "url": "https://example.com/sse", "name": "x"}],
            "tool_choice": {"type": "any"},
            "messages": [
                {"role": "user", "content": "Find the news, then the weather in Paris."},
                // A history from Claude's API, where the server tool ran.
                {"role": "assistant", "content": [
                    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
                     "input": {"query": "news"}},
                    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
                     "content": []},
                    {"type": "text", "text": "No news today."}]},
                {"role": "user", "content": "What is the weather in Paris?"}
            ]
        }))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let warning = r.headers()["x-mlxkit-warning"]
        .to_str()
        .unwrap()
        .to_string();
    for needle in [
        "Anthropic's built-in tools, which a local model cannot run, are left out: \
         web_search (web_search_20250305, tools[0]), bash (bash_20250124, tools[1]), \
         str_replace_based_edit_tool (text_editor_20250728, tools[2])",
        "`mcp_servers`",
        "left out: server_tool_use (messages[1].content[0]), \
         web_search_tool_result (messages[1].content[1])",
    ] {
        assert!(
            warning.contains(needle),
            "`{warning}` should mention {needle}"
        );
    }
    let reply: Value = r.json().unwrap();
    assert_eq!(reply["stop_reason"], "tool_use", "{reply}");
    let call = reply["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap();
    assert_eq!(call["name"], "get_weather", "{reply}");
}

/// `output_config.format` with a JSON schema makes the answer follow it (structured outputs).
#[test]
fn an_output_format_schema_shapes_the_answer() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"], "additionalProperties": false});
    for (field, value) in [
        (
            "output_config",
            json!({"format": {"type": "json_schema", "schema": schema}}),
        ),
        (
            "output_format",
            json!({"type": "json_schema", "schema": schema}),
        ),
    ] {
        let mut body = json!({"model": MODEL, "max_tokens": 48, "temperature": 0,
            "messages": [{"role": "user", "content": "Name a city in France as JSON."}]});
        body[field] = value;
        let (status, reply) = post(s, "/v1/messages", body);
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["stop_reason"], "end_turn", "{reply}");
        let text = reply["content"][0]["text"].as_str().unwrap();
        let answer: Value = serde_json::from_str(text).unwrap();
        assert!(answer["city"].is_string(), "{field}: {answer}");
    }
}

/// Claude Code asks for `max_tokens: 32000`, more than a small model's context: the answer is
/// not refused; it stops where the context ends, with `max_tokens` as the reason.
#[test]
fn max_tokens_beyond_the_context_stops_at_its_end() {
    let Some(s) = server() else { return };
    let _serial = serial();
    create_variant(s, "smollm2:ctx96", None, json!({"num_ctx": 96}));
    let body = json!({"model": "smollm2:ctx96", "max_tokens": 32000, "temperature": 0,
        "system": "You write long stories.",
        "messages": [{"role": "user", "content": "Tell me a very long story about the sea."}]});
    let (status, count) = post(s, "/v1/messages/count_tokens", body.clone());
    assert_eq!(status, 200, "{count}");
    let (status, reply) = post(s, "/v1/messages", body);
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["stop_reason"], "max_tokens", "{reply}");
    assert_eq!(
        reply["usage"]["output_tokens"].as_u64().unwrap(),
        96 - count["input_tokens"].as_u64().unwrap(),
        "{reply}"
    );
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
                {"role": "tool", "content": "no"}]}),
            400,
            "invalid_request_error",
            "messages[0].role is \"tool\"",
        ),
        (
            json!({"model": MODEL, "max_tokens": 4, "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                    "content": [{"type": "video"}]}]}]}),
            400,
            "invalid_request_error",
            "tool result part type \"video\" is not supported",
        ),
        (
            json!({"model": MODEL, "max_tokens": 4, "messages": user,
                   "output_config": {"format": {"type": "regex"}}}),
            400,
            "invalid_request_error",
            "must be \"json_schema\", got \"regex\"",
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
        assert!(!message.contains("Some("), "no Rust debug text: {message}");
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
