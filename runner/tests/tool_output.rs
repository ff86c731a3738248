//! Tools end to end (issue 48, points 2 and 4): tools reach every model's prompt, through its
//! template where the template renders them, else written into the system turn: in the
//! generic format for `gemma3:270m` (its template has no tool section, its family no call
//! syntax), in Hermes' words for `smollm2:135m` (a ChatML template without a tool section); a
//! copy of `smollm2:135m` with a template that renders tools stands for the template path. And
//! tool-call output is clean on every API: no markup in content, no half call when a limit
//! cuts one, no whitespace-only content beside calls, parallel calls as separate calls.

use crate::support;

use std::sync::OnceLock;

use serde_json::{Value, json};
use support::{Server, post, post_ndjson, post_sse, serial};

const GEMMA: &str = "gemma3:270m";
const SMOL: &str = support::MODEL;
/// `smollm2:135m` with a template that renders tools as Hermes `<tool_call>` calls.
const HERMES: &str = "smollm2-hermes:135m";

/// Text that is tool-call syntax, in any format: none of it may reach content.
const MARKUP: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<tool",
    "[TOOL_CALLS]",
    "<|python_tag|>",
    "\"tool_call",
    "{\"response\"",
    "{\"name\"",
];

fn server() -> Option<&'static Server> {
    static SERVER: OnceLock<Option<Server>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            let server =
                support::start_server(&[SMOL, GEMMA], runner::engine::LoopConfig::from_env())?;
            let template = tokenizer::Family::ChatMl.fallback_template();
            let (status, created) = post(
                &server,
                "/api/create",
                json!({"model": HERMES, "from": SMOL, "template": template, "stream": false}),
            );
            assert_eq!(status, 200, "{created}");
            Some(server)
        })
        .as_ref()
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The current weather in a city, from the zeppelin observatory.",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "maxLength": 12}},
                       "required": ["city"], "additionalProperties": false}}})
}

fn time_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_time",
        "parameters": {"type": "object",
                       "properties": {"zone": {"type": "string", "maxLength": 8}},
                       "required": ["zone"], "additionalProperties": false}}})
}

fn question() -> Value {
    json!([{"role": "user", "content": "What is the weather in Paris?"}])
}

/// Fails when `text` carries tool-call markup or is whitespace only beside calls.
fn assert_clean(text: &str, beside_calls: bool, context: &Value) {
    for marker in MARKUP {
        assert!(
            !text.contains(marker),
            "{marker} reached content: {context}"
        );
    }
    if beside_calls {
        assert!(
            text.is_empty() || !text.trim().is_empty(),
            "whitespace-only content beside calls: {context}"
        );
    }
}

/// An OpenAI chat request for `model` with `extra` fields.
fn openai(model: &str, extra: Value) -> Value {
    let mut body = json!({"model": model, "messages": question(), "temperature": 0,
                          "max_tokens": 64, "tools": [weather_tool(), time_tool()]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// The content and calls of a streamed OpenAI chat, each content delta checked.
fn openai_stream(s: &Server, body: Value) -> (String, Vec<Value>, String) {
    let mut body = body;
    body["stream"] = json!(true);
    let chunks = post_sse(s, "/v1/chat/completions", body);
    let (mut content, mut calls, mut finish) = (String::new(), Vec::new(), String::new());
    let any_calls = chunks
        .iter()
        .any(|c| !c["choices"][0]["delta"]["tool_calls"].is_null());
    for chunk in &chunks {
        let choice = &chunk["choices"][0];
        if let Some(text) = choice["delta"]["content"].as_str() {
            assert_clean(text, any_calls, chunk);
            content.push_str(text);
        }
        calls.extend(
            choice["delta"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        );
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = reason.to_string();
        }
    }
    (content, calls, finish)
}

#[test]
fn show_says_which_tool_format_a_model_uses() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let format = |model: &str| {
        let (status, shown) = post(s, "/api/show", json!({"model": model}));
        assert_eq!(status, 200, "{shown}");
        shown["tool_format"].clone()
    };
    // A template that renders tools says so before the model loads.
    assert_eq!(format(HERMES), "template");
    // Loaded, the probe of the template and the vocabulary's family answer.
    for (model, expected) in [(GEMMA, "generic"), (SMOL, "hermes"), (HERMES, "template")] {
        let (status, reply) = post(
            s,
            "/v1/chat/completions",
            json!({"model": model, "messages": question(), "max_tokens": 1}),
        );
        assert_eq!(status, 200, "{reply}");
        assert_eq!(format(model), expected, "{model}");
    }
}

#[test]
fn tools_reach_a_template_without_a_tool_section() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let prompt_tokens = |model: &str, tools: Value| {
        let (status, reply) = post(
            s,
            "/v1/chat/completions",
            json!({"model": model, "messages": question(), "max_tokens": 1, "tools": tools}),
        );
        assert_eq!(status, 200, "{reply}");
        reply["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    for model in [GEMMA, SMOL] {
        let without = prompt_tokens(model, json!([]));
        let with = prompt_tokens(model, json!([weather_tool(), time_tool()]));
        // The schemas, the descriptions and the instruction: far more than a few tokens.
        assert!(
            with > without + 60,
            "{model}: {without} → {with} prompt tokens"
        );
    }

    // A forced call comes back parsed, on every API, streamed or not.
    let (status, reply) = post(
        s,
        "/v1/chat/completions",
        openai(GEMMA, json!({"tool_choice": "required"})),
    );
    assert_eq!(status, 200, "{reply}");
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{reply}");
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert!(
        ["get_weather", "get_time"].contains(&call["name"].as_str().unwrap()),
        "{reply}"
    );
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments.is_object(), "{reply}");
    assert_clean(
        choice["message"]["content"].as_str().unwrap_or(""),
        true,
        &reply,
    );

    let named = json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let (content, calls, finish) = openai_stream(s, openai(GEMMA, named));
    assert_eq!(finish, "tool_calls");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert!(content.is_empty(), "{content:?}");

    let (status, reply) = post(
        s,
        "/v1/messages",
        json!({"model": GEMMA, "max_tokens": 64, "temperature": 0, "messages": question(),
               "tools": [{"name": "get_weather", "description": "The weather in a city.",
                          "input_schema": weather_tool()["function"]["parameters"]}],
               "tool_choice": {"type": "any"}}),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["stop_reason"], "tool_use", "{reply}");
    for block in reply["content"].as_array().unwrap() {
        match block["type"].as_str().unwrap() {
            "tool_use" => assert_eq!(block["name"], "get_weather", "{reply}"),
            "text" => assert_clean(block["text"].as_str().unwrap(), true, &reply),
            other => panic!("unexpected block {other}: {reply}"),
        }
    }

    let (status, reply) = post(
        s,
        "/v1/responses",
        json!({"model": GEMMA, "input": "What is the weather in Paris?", "temperature": 0,
               "max_output_tokens": 64, "tool_choice": "required",
               "tools": [{"type": "function", "name": "get_weather",
                          "parameters": weather_tool()["function"]["parameters"]}]}),
    );
    assert_eq!(status, 200, "{reply}");
    let output = reply["output"].as_array().unwrap();
    assert!(
        output.iter().any(|item| item["type"] == "function_call"),
        "{reply}"
    );

    // An answer (the model may also call): never the reply object's markup.
    let lines = post_ndjson(
        s,
        "/api/chat",
        json!({"model": GEMMA, "messages": [{"role": "user", "content": "Say hello."}],
               "tools": [weather_tool()], "options": {"temperature": 0, "num_predict": 48}}),
    );
    for line in &lines {
        if let Some(text) = line["message"]["content"].as_str() {
            assert_clean(text, false, line);
        }
    }

    // Earlier calls and results render for the template, as text turns it accepts.
    let (status, reply) = post(
        s,
        "/v1/chat/completions",
        json!({"model": GEMMA, "temperature": 0, "max_tokens": 32, "tools": [weather_tool()],
               "messages": [
                   {"role": "user", "content": "What is the weather in Paris?"},
                   {"role": "assistant", "content": null, "tool_calls": [
                       {"id": "call_1", "type": "function", "function": {
                           "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                   {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"}]}),
    );
    assert_eq!(status, 200, "{reply}");
    assert_clean(
        reply["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or(""),
        false,
        &reply,
    );
}

#[test]
fn a_call_cut_by_max_tokens_leaves_no_half_call_on_any_api() {
    let Some(s) = server() else { return };
    let _serial = serial();
    for model in [HERMES, GEMMA, SMOL] {
        for max_tokens in [2, 6, 10] {
            let limits = json!({"tool_choice": "required", "max_tokens": max_tokens});
            let (status, reply) = post(s, "/v1/chat/completions", openai(model, limits.clone()));
            assert_eq!(status, 200, "{reply}");
            let choice = &reply["choices"][0];
            assert_eq!(choice["finish_reason"], "length", "{model}: {reply}");
            assert!(
                choice["message"]["tool_calls"].is_null(),
                "{model}: {reply}"
            );
            assert_clean(
                choice["message"]["content"].as_str().unwrap_or(""),
                false,
                &reply,
            );

            let (content, calls, finish) = openai_stream(s, openai(model, limits));
            assert_eq!(finish, "length", "{model}");
            assert!(calls.is_empty(), "{model}: {calls:?}");
            assert!(content.trim().is_empty(), "{model}: {content:?}");

            let anthropic = json!({"model": model, "max_tokens": max_tokens, "temperature": 0,
                "messages": question(), "tool_choice": {"type": "any"},
                "tools": [{"name": "get_weather",
                           "input_schema": weather_tool()["function"]["parameters"]}]});
            let (status, reply) = post(s, "/v1/messages", anthropic.clone());
            assert_eq!(status, 200, "{reply}");
            assert_eq!(reply["stop_reason"], "max_tokens", "{model}: {reply}");
            for block in reply["content"].as_array().unwrap() {
                assert_eq!(block["type"], "text", "{model}: {reply}");
                assert_clean(block["text"].as_str().unwrap(), false, &reply);
            }
            let mut streamed = anthropic;
            streamed["stream"] = json!(true);
            let r = support::client()
                .post(format!("{}/v1/messages", s.base))
                .json(&streamed)
                .send()
                .unwrap()
                .text()
                .unwrap();
            assert!(r.contains("\"stop_reason\":\"max_tokens\""), "{model}: {r}");
            assert!(!r.contains("tool_use"), "{model}: {r}");
            for marker in MARKUP {
                // Markers would appear JSON-escaped inside a text delta.
                let escaped = serde_json::to_string(marker).unwrap();
                assert!(!r.contains(escaped.trim_matches('"')), "{marker}: {r}");
            }

            let (status, reply) = post(
                s,
                "/v1/responses",
                json!({"model": model, "input": "What is the weather in Paris?",
                       "temperature": 0, "max_output_tokens": max_tokens,
                       "tool_choice": "required",
                       "tools": [{"type": "function", "name": "get_weather",
                                  "parameters": weather_tool()["function"]["parameters"]}]}),
            );
            assert_eq!(status, 200, "{reply}");
            assert_eq!(reply["status"], "incomplete", "{model}: {reply}");
            for item in reply["output"].as_array().unwrap() {
                assert_eq!(item["type"], "message", "{model}: {reply}");
                for part in item["content"].as_array().into_iter().flatten() {
                    assert_clean(part["text"].as_str().unwrap_or(""), false, &reply);
                }
            }
        }
    }
}

#[test]
fn whitespace_is_never_content_beside_calls() {
    let Some(s) = server() else { return };
    let _serial = serial();
    for model in [HERMES, GEMMA] {
        for seed in 0..3 {
            let body = openai(
                model,
                json!({"tool_choice": "required", "temperature": 1.0, "seed": seed,
                       "max_tokens": 96}),
            );
            let (status, reply) = post(s, "/v1/chat/completions", body.clone());
            assert_eq!(status, 200, "{reply}");
            let message = &reply["choices"][0]["message"];
            if !message["tool_calls"].is_null() {
                assert_clean(message["content"].as_str().unwrap_or(""), true, &reply);
            }
            openai_stream(s, body);
        }
    }
}

/// Two calls the model writes in one reply come back as two calls, also when a limit cuts
/// the second: the first stands and nothing of the second shows. The reply is pinned by a
/// `const` schema (a format constrains the answer; the calls in it are still read).
#[test]
fn parallel_calls_come_out_separate() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let reply_object = json!({"tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_time", "arguments": {"zone": "CET"}}]});
    let body = |max_tokens: u64| {
        openai(
            GEMMA,
            json!({"max_tokens": max_tokens, "response_format": {"type": "json_schema",
                   "json_schema": {"name": "calls", "schema": {"const": reply_object}}}}),
        )
    };
    let (status, reply) = post(s, "/v1/chat/completions", body(200));
    assert_eq!(status, 200, "{reply}");
    let calls = reply["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap();
    let names: Vec<&str> = calls
        .iter()
        .map(|c| c["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["get_weather", "get_time"], "{reply}");
    let ids: Vec<&str> = calls.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_ne!(ids[0], ids[1], "{reply}");
    let (content, streamed, _) = openai_stream(s, body(200));
    assert!(content.is_empty(), "{content:?}");
    let indices: Vec<&Value> = streamed.iter().map(|c| &c["index"]).collect();
    assert_eq!(indices, [&json!(0), &json!(1)], "{streamed:?}");

    // Cut closer and closer to the start: whatever the cut, the calls that come back are the
    // whole ones before it, and some cut falls inside the second.
    let used = reply["usage"]["completion_tokens"].as_u64().unwrap();
    let mut inside_second = None;
    for max_tokens in (used.saturating_sub(20)..used).rev() {
        let (status, cut) = post(s, "/v1/chat/completions", body(max_tokens));
        assert_eq!(status, 200, "{cut}");
        let choice = &cut["choices"][0];
        let calls = choice["message"]["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let names: Vec<&str> = calls
            .iter()
            .map(|c| c["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names[..],
            ["get_weather", "get_time"][..names.len()],
            "{cut}"
        );
        assert_clean(
            choice["message"]["content"].as_str().unwrap_or(""),
            true,
            &cut,
        );
        if names.len() == 1 {
            inside_second = Some(max_tokens);
            break;
        }
    }
    let cut = inside_second.expect("no cut fell inside the second call");
    let lines = post_ndjson(
        s,
        "/api/chat",
        json!({"model": GEMMA, "messages": question(), "tools": [weather_tool(), time_tool()],
               "format": {"const": reply_object},
               "options": {"temperature": 0, "num_predict": cut}}),
    );
    let last = lines.last().unwrap();
    assert_eq!(last["done_reason"], "length", "{lines:?}");
    let calls: Vec<&Value> = lines
        .iter()
        .flat_map(|l| l["message"]["tool_calls"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(calls.len(), 1, "{lines:?}");
    for line in &lines {
        assert_clean(
            line["message"]["content"].as_str().unwrap_or(""),
            true,
            line,
        );
    }
}
