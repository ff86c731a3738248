//! Structured output end to end with `smollm2:135m`: seeded requests sampled at temperature
//! 1.0 through every generation endpoint must come back as JSON that validates against the
//! requested schema, tool calls must match their tool's parameters, and every malformed or
//! unsupported constraint is a 400 naming the problem.
//!
//! A 135M model sampled at temperature 1.0 rarely writes valid JSON on its own, so these tests
//! fail when the constraint is not applied on every token.

use crate::support;

use serde_json::{Value, json};
use support::{MODEL, Server, get, post, post_ndjson, post_sse, serial, server};

/// Tokens each constrained answer may take. Every schema below bounds its strings, arrays
/// and properties, so a complete answer always fits.
const MAX_TOKENS: u32 = 256;

/// Five schemas covering nested objects, arrays, enums, bounded numbers, required fields and
/// string patterns.
fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        (
            "Describe a person and where they live.",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 24},
                    "address": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string", "maxLength": 20},
                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
                        },
                        "required": ["city", "zip"],
                        "additionalProperties": false
                    }
                },
                "required": ["name", "address"],
                "additionalProperties": false
            }),
        ),
        (
            "List the items of a small order.",
            json!({
                "type": "object",
                "properties": {
                    "items": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 3,
                        "items": {
                            "type": "object",
                            "properties": {
                                "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                                "quantity": {"type": "integer", "minimum": 1, "maximum": 99}
                            },
                            "required": ["sku", "quantity"],
                            "additionalProperties": false
                        }
                    }
                },
                "required": ["items"],
                "additionalProperties": false
            }),
        ),
        (
            "Pick a shirt.",
            json!({
                "type": "object",
                "properties": {
                    "color": {"enum": ["red", "green", "blue"]},
                    "size": {"type": "string", "enum": ["S", "M", "L", "XL"]},
                    "in_stock": {"type": "boolean"}
                },
                "required": ["color", "size", "in_stock"],
                "additionalProperties": false
            }),
        ),
        (
            "Report today's weather.",
            json!({
                "type": "object",
                "properties": {
                    "celsius": {"type": "integer", "minimum": -50, "maximum": 50},
                    "humidity": {"type": "number", "minimum": 0, "maximum": 1},
                    "wind_kmh": {"type": "integer", "exclusiveMinimum": 0, "maximum": 200}
                },
                "required": ["celsius", "humidity", "wind_kmh"],
                "additionalProperties": false
            }),
        ),
        (
            "Create a user account.",
            json!({
                "type": "object",
                "properties": {
                    "username": {"type": "string", "pattern": "^[a-z][a-z0-9_]{2,11}$"},
                    "email": {"type": "string", "pattern": "^[a-z]{1,10}@[a-z]{1,10}\\.(com|org)$"},
                    "roles": {
                        "type": "array",
                        "items": {"enum": ["admin", "editor", "viewer"]},
                        "maxItems": 3
                    },
                    "nickname": {"type": "string", "maxLength": 12}
                },
                "required": ["username", "email", "roles"],
                "additionalProperties": false
            }),
        ),
    ]
}

/// One seeded request through `endpoint` (cycled so every endpoint and both streaming modes
/// are covered) at `temperature`, drafting with `draft`; returns the generated text.
fn ask(s: &Server, endpoint: usize, prompt: &str, schema: &Value, seed: u64) -> String {
    ask_with(s, endpoint, prompt, schema, seed, 1.0, "none")
}

fn ask_with(
    s: &Server,
    endpoint: usize,
    prompt: &str,
    schema: &Value,
    seed: u64,
    temperature: f64,
    draft: &str,
) -> String {
    let options = json!({
        "temperature": temperature, "seed": seed, "num_predict": MAX_TOKENS, "draft": draft
    });
    let user = format!("{prompt} Answer in JSON.");
    match endpoint % 5 {
        0 => {
            let (status, r) = post(
                s,
                "/api/generate",
                json!({ "model": MODEL, "prompt": user, "format": schema, "stream": false, "options": options }),
            );
            assert_eq!(status, 200, "{r}");
            r["response"].as_str().unwrap_or_default().to_string()
        }
        1 => post_ndjson(
            s,
            "/api/chat",
            json!({ "model": MODEL, "messages": [{"role": "user", "content": user}], "format": schema, "options": options }),
        )
        .iter()
        .filter_map(|l| l["message"]["content"].as_str())
        .collect(),
        2 => {
            let (status, r) = post(
                s,
                "/v1/chat/completions",
                json!({
                    "model": MODEL,
                    "messages": [{"role": "user", "content": user}],
                    "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
                    "temperature": temperature, "seed": seed, "max_tokens": MAX_TOKENS,
                    "draft": draft
                }),
            );
            assert_eq!(status, 200, "{r}");
            r["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        }
        3 => post_sse(
            s,
            "/v1/chat/completions",
            json!({
                "model": MODEL,
                "messages": [{"role": "user", "content": user}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
                "temperature": temperature, "seed": seed, "max_tokens": MAX_TOKENS,
                "stream": true, "draft": draft
            }),
        )
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect(),
        _ => {
            let (status, r) = post(
                s,
                "/v1/completions",
                json!({
                    "model": MODEL,
                    "prompt": format!("{user}\n"),
                    "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
                    "temperature": temperature, "seed": seed, "max_tokens": MAX_TOKENS,
                    "draft": draft
                }),
            );
            assert_eq!(status, 200, "{r}");
            r["choices"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        }
    }
}

#[test]
fn fifty_seeded_samples_across_five_schemas_all_validate() {
    let Some(s) = server() else { return };
    let _serial = serial();
    // One client per schema at once: the engine decodes the five in one batch, and each
    // answer must still validate on its own.
    let failures: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = schemas()
            .into_iter()
            .enumerate()
            .map(|(i, (prompt, schema))| {
                scope.spawn(move || {
                    let validator =
                        jsonschema::validator_for(&schema).expect("the test's schema is valid");
                    let mut failures = Vec::new();
                    for k in 0..10 {
                        let request = i * 10 + k;
                        let text = ask(s, request, prompt, &schema, 1000 + request as u64);
                        match serde_json::from_str::<Value>(&text) {
                            Err(e) => {
                                failures.push(format!("#{request}: not JSON ({e}): {text:?}"))
                            }
                            Ok(value) => {
                                let errors: Vec<String> = validator
                                    .iter_errors(&value)
                                    .map(|e| e.to_string())
                                    .collect();
                                if !errors.is_empty() {
                                    failures.push(format!("#{request}: {errors:?} in {text}"));
                                }
                            }
                        }
                    }
                    failures
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a client thread panicked"))
            .collect()
    });
    assert!(
        failures.is_empty(),
        "{} of 50 answers broke their schema:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn speculative_samples_validate_and_greedy_answers_do_not_change() {
    let Some(s) = server() else { return };
    let _serial = serial();
    // Four seeded samples at temperature 1.0 per schema, through every endpoint, the five
    // schemas' clients at once (speculating sequences verified in one batch).
    std::thread::scope(|scope| {
        for (i, (prompt, schema)) in schemas().into_iter().enumerate() {
            scope.spawn(move || {
                let validator =
                    jsonschema::validator_for(&schema).expect("the test's schema is valid");
                for k in 0..4 {
                    let request = i * 4 + k;
                    let seed = 2000 + request as u64;
                    let text = ask_with(s, request, prompt, &schema, seed, 1.0, "ngram");
                    let value: Value = serde_json::from_str(&text)
                        .unwrap_or_else(|e| panic!("#{request}: not JSON ({e}): {text:?}"));
                    assert!(validator.is_valid(&value), "#{request}: {text}");
                }
            });
        }
    });
    // Greedy answers alone, plain and drafted (by prompt lookup, and by the head `pull`
    // installed for SmolLM2).
    for (i, (prompt, schema)) in schemas().iter().enumerate() {
        let plain = ask_with(s, i, prompt, schema, 0, 0.0, "none");
        for draft in ["ngram", "mtp"] {
            let drafted = ask_with(s, i, prompt, schema, 0, 0.0, draft);
            assert_eq!(drafted, plain, "schema {i}, drafted by {draft}");
        }
    }
}

#[test]
fn json_mode_returns_an_object() {
    let Some(s) = server() else { return };
    let _serial = serial();
    for seed in 0..2 {
        let (status, r) = post(
            s,
            "/api/generate",
            json!({ "model": MODEL, "prompt": "Tell me about cats.", "format": "json", "stream": false,
                    "options": {"temperature": 1.0, "seed": seed, "num_predict": 160} }),
        );
        assert_eq!(status, 200, "{r}");
        if r["done_reason"] == "stop" {
            let text = r["response"].as_str().unwrap();
            let value: Value = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("seed {seed}: not JSON ({e}): {text:?}"));
            assert!(value.is_object(), "seed {seed}: {text}");
        } else {
            // Free-form objects can outrun the budget; the text so far must still be a JSON
            // prefix, which the grammar guarantees: it starts an object.
            assert!(r["response"].as_str().unwrap().starts_with('{'), "{r}");
        }
    }
    let (status, r) = post(
        s,
        "/v1/chat/completions",
        json!({ "model": MODEL, "messages": [{"role": "user", "content": "Give me a JSON object with a greeting."}],
                "response_format": {"type": "json_object"}, "temperature": 0, "max_tokens": 160 }),
    );
    assert_eq!(status, 200, "{r}");
    let text = r["choices"][0]["message"]["content"].as_str().unwrap();
    if r["choices"][0]["finish_reason"] == "stop" {
        let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(value.is_object());
    }
}

#[test]
fn a_required_tool_call_matches_its_parameters() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let parameters = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"enum": ["celsius", "fahrenheit"]}
        },
        "required": ["city", "unit"],
        "additionalProperties": false
    });
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": parameters}},
        {"type": "function", "function": {"name": "get_time", "parameters": {
            "type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}},
            "required": ["zone"], "additionalProperties": false}}}
    ]);
    let validator = jsonschema::validator_for(&parameters).unwrap();
    for seed in 0..4 {
        let (status, r) = post(
            s,
            "/v1/chat/completions",
            json!({
                "model": MODEL,
                "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
                "tools": tools,
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "parallel_tool_calls": false,
                "temperature": 1.0, "seed": seed, "max_tokens": MAX_TOKENS
            }),
        );
        assert_eq!(status, 200, "{r}");
        let calls = r["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap_or_else(|| panic!("seed {seed}: no tool calls in {r}"));
        assert_eq!(calls.len(), 1, "seed {seed}: {r}");
        for call in calls {
            assert_eq!(call["function"]["name"], "get_weather", "{r}");
            let arguments: Value =
                serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
            assert!(validator.is_valid(&arguments), "seed {seed}: {arguments}");
        }
    }
    // Ollama's chat with tools: any call made is pinned to its tool's schema.
    let (status, r) = post(
        s,
        "/api/chat",
        json!({ "model": MODEL, "stream": false, "tools": tools,
                "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
                "options": {"temperature": 1.0, "seed": 7, "num_predict": MAX_TOKENS} }),
    );
    assert_eq!(status, 200, "{r}");
    for call in r["message"]["tool_calls"].as_array().into_iter().flatten() {
        let name = call["function"]["name"].as_str().unwrap();
        assert!(["get_weather", "get_time"].contains(&name), "{r}");
    }
}

#[test]
fn bad_constraints_are_clear_errors_and_the_server_stays_healthy() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let chat = |extra: Value| {
        let mut body = json!({ "model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4 });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let deep = (0..40).fold(
        json!({"type": "string"}),
        |inner, _| json!({"type": "object", "properties": {"a": inner}}),
    );
    let cases = [
        (
            "/api/generate",
            json!({ "model": MODEL, "prompt": "x", "format": "yaml" }),
            "format",
        ),
        (
            "/api/generate",
            json!({ "model": MODEL, "prompt": "x", "format": 5 }),
            "format",
        ),
        (
            "/api/chat",
            json!({ "model": MODEL, "messages": [{"role": "user", "content": "x"}],
                    "format": {"type": "object", "properties": {"n": {"type": "wat"}}} }),
            "schema",
        ),
        (
            "/api/generate",
            json!({ "model": MODEL, "prompt": "x", "format": deep }),
            "nesting",
        ),
        (
            "/v1/chat/completions",
            chat(json!({ "response_format": {"type": "yaml"} })),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            chat(json!({ "response_format": {"type": "json_schema"} })),
            "json_schema.schema",
        ),
        (
            "/v1/chat/completions",
            chat(json!({ "tool_choice": "required" })),
            "no `tools`",
        ),
        (
            "/v1/chat/completions",
            chat(
                json!({ "tools": [{"type": "function", "function": {"name": "f"}}],
                         "tool_choice": {"type": "function", "function": {"name": "g"}} }),
            ),
            "not among",
        ),
        (
            "/v1/chat/completions",
            chat(json!({ "tool_choice": "sometimes" })),
            "tool_choice",
        ),
        (
            "/v1/completions",
            json!({ "model": MODEL, "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "wat"}}} }),
            "schema",
        ),
    ];
    for (path, body, needle) in cases {
        let (status, reply) = post(s, path, body.clone());
        assert_eq!(status, 400, "{path} {body}: {reply}");
        let message = reply["error"]
            .as_str()
            .or_else(|| reply["error"]["message"].as_str())
            .unwrap_or_default()
            .to_string();
        assert!(
            message.contains(needle),
            "{path}: {message:?} should name {needle:?}"
        );
        assert_eq!(get(s, "/api/version").0, 200);
    }
}

/// The error message of a 400 in any API's shape.
fn error_message(reply: &Value) -> String {
    reply["error"]
        .as_str()
        .or_else(|| reply["error"]["message"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[test]
fn schemas_the_compiler_cannot_use_are_400s_naming_the_problem() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let cycle = json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                       "$ref": "#/$defs/a"});
    let requires_itself =
        json!({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]});
    let openai_schema = |schema: &Value| {
        json!({ "model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}} })
    };
    let cases = [
        (
            "/api/generate",
            json!({ "model": MODEL, "prompt": "x", "format": {"$ref": "#"}, "stream": false }),
            "`#` refers back to itself",
        ),
        (
            "/api/chat",
            json!({ "model": MODEL, "messages": [{"role": "user", "content": "x"}], "format": cycle,
                    "stream": false }),
            "`#/$defs/a` and `#/$defs/b` refer back to one another",
        ),
        (
            "/v1/chat/completions",
            openai_schema(&requires_itself),
            "`#` refers back to itself",
        ),
        (
            "/v1/chat/completions",
            json!({ "model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}],
                    "tool_choice": "required" }),
            "tool-call schema admits no complete output",
        ),
        (
            "/api/generate",
            json!({ "model": MODEL, "prompt": "x", "stream": false,
                    "format": {"enum": (0..5000).collect::<Vec<_>>()} }),
            "alternatives of one anyOf/oneOf/allOf/enum is too large: 5000",
        ),
    ];
    for (path, body, needle) in cases {
        let (status, reply) = post(s, path, body.clone());
        assert_eq!(status, 400, "{path}: {reply}");
        let message = error_message(&reply);
        assert!(
            message.contains(needle),
            "{path}: {message:?} should say {needle:?}"
        );
        for leak in [
            "<state>",
            "<grammar>",
            "non-verbose",
            "Tokens:",
            "/work/",
            "/root/",
        ] {
            assert!(
                !message.contains(leak),
                "{path}: {message:?} leaks {leak:?}"
            );
        }
        assert_eq!(get(s, "/api/version").0, 200);
    }

    // 10,000 levels, written as text: serializing such a value would recurse that deep here.
    let depth = 10_000;
    let schema = format!(
        "{}{{\"type\":\"string\"}}{}",
        "{\"type\":\"object\",\"properties\":{\"a\":".repeat(depth),
        "}}".repeat(depth)
    );
    let body = format!(r#"{{"model":"{MODEL}","prompt":"x","stream":false,"format":{schema}}}"#);
    let reply = support::client()
        .post(format!("{}/api/generate", s.base))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .unwrap();
    assert_eq!(reply.status().as_u16(), 400);
    let message = error_message(&reply.json::<Value>().unwrap());
    assert!(message.contains("recursion limit"), "{message:?}");
    assert_eq!(get(s, "/api/version").0, 200);
}

#[test]
fn a_recursive_schema_that_can_end_still_constrains_the_answer() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let tree = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#"}}
        },
        "required": ["name", "children"],
        "additionalProperties": false
    });
    let validator = jsonschema::validator_for(&tree).expect("the test's schema is valid");
    // A 135M model likes to nest such a tree until its budget runs out; an answer cut off
    // that way is checked as far as it goes: only the schema's keys, names within 8 chars.
    for seed in 0..3 {
        let (status, r) = post(
            s,
            "/api/generate",
            json!({ "model": MODEL, "prompt": "Describe a small family tree in JSON.",
                    "format": tree, "stream": false,
                    "options": {"temperature": 1.0, "seed": seed, "num_predict": MAX_TOKENS} }),
        );
        assert_eq!(status, 200, "{r}");
        let text = r["response"].as_str().unwrap_or_default();
        assert!(text.trim_start().starts_with('{'), "seed {seed}: {text:?}");
        if r["done_reason"] == "stop" {
            let value: Value = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("seed {seed}: not JSON ({e}): {text:?}"));
            let errors: Vec<String> = validator
                .iter_errors(&value)
                .map(|e| e.to_string())
                .collect();
            assert!(errors.is_empty(), "seed {seed}: {errors:?} in {text}");
        }
        let strings = json_strings(text);
        assert!(strings.len() >= 2, "seed {seed}: {text:?}");
        for (i, (string, is_key)) in strings.iter().enumerate() {
            if !is_key {
                continue;
            }
            assert!(
                string == "name" || string == "children",
                "seed {seed}: key {string:?} in {text:?}"
            );
            if let Some((name, false)) = strings.get(i + 1).filter(|_| string == "name") {
                assert!(name.chars().count() <= 8, "seed {seed}: name {name:?}");
            }
        }
    }
}

/// The complete JSON strings in `text`, in order, each with whether it is an object key
/// (followed by a colon). A string cut off at the end is left out.
fn json_strings(text: &str) -> Vec<(String, bool)> {
    let mut found = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut raw = String::from('"');
        let mut closed = false;
        while let Some(c) = chars.next() {
            raw.push(c);
            match c {
                '\\' => raw.extend(chars.next()),
                '"' => {
                    closed = true;
                    break;
                }
                _ => {}
            }
        }
        if !closed {
            break;
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let is_key = chars.peek() == Some(&':');
        if let Ok(Value::String(s)) = serde_json::from_str(&raw) {
            found.push((s, is_key));
        }
    }
    found
}

/// Claude Code's `Bash`-like tool: a map property with `propertyNames`, which the grammar
/// engine cannot compile (issue 48 saw a 400 with a 19,169-character message).
fn tool_with_property_names() -> Value {
    json!({"type": "function", "function": {"name": "run", "parameters": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {
            "command": {"type": "string", "maxLength": 40},
            "env": {"type": "object", "propertyNames": {"pattern": "^[A-Z_]+$"},
                    "additionalProperties": {"type": "string", "maxLength": 10}, "maxProperties": 2}
        },
        "required": ["command"]
    }}})
}

#[test]
fn a_property_names_schema_gets_a_call_and_says_what_was_loosened() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "List the files here."}],
        "tools": [
            {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}},
            tool_with_property_names()
        ],
        "tool_choice": {"type": "function", "function": {"name": "run"}},
        "temperature": 1.0, "seed": 3, "max_tokens": MAX_TOKENS
    });
    let reply = support::client()
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(reply.status().as_u16(), 200);
    let header = reply
        .headers()
        .get("x-mlxkit-schema-loosened")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert_eq!(header, "tools[1] #/properties/env: propertyNames");
    let r: Value = reply.json().unwrap();
    let call = &r["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "run", "{r}");
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments["command"].is_string(), "{arguments}");

    // The header rides on every API, streaming or not.
    let anthropic_tool = json!({"name": "run",
        "input_schema": tool_with_property_names()["function"]["parameters"]});
    for (path, body) in [
        (
            "/v1/messages",
            json!({"model": MODEL, "max_tokens": 64, "stream": true,
            "messages": [{"role": "user", "content": "x"}], "tools": [anthropic_tool],
            "tool_choice": {"type": "any"}}),
        ),
        (
            "/api/chat",
            json!({"model": MODEL, "stream": false, "tools": [tool_with_property_names()],
            "messages": [{"role": "user", "content": "x"}], "options": {"num_predict": 64}}),
        ),
        (
            "/v1/responses",
            json!({"model": MODEL, "input": "x", "max_output_tokens": 64,
            "tools": [{"type": "function", "name": "run",
                       "parameters": tool_with_property_names()["function"]["parameters"]}]}),
        ),
        (
            "/api/generate",
            json!({"model": MODEL, "prompt": "x", "stream": false,
            "options": {"num_predict": 16},
            "format": {"type": "array", "uniqueItems": true, "maxItems": 2}}),
        ),
    ] {
        let reply = support::client()
            .post(format!("{}{path}", s.base))
            .json(&body)
            .send()
            .unwrap();
        assert_eq!(reply.status().as_u16(), 200, "{path}");
        let header = reply
            .headers()
            .get("x-mlxkit-schema-loosened")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let expected = if path == "/api/generate" {
            "format #: uniqueItems"
        } else {
            "tools[0] #/properties/env: propertyNames"
        };
        assert_eq!(header.as_deref(), Some(expected), "{path}");
        let _ = reply.bytes();
    }
}

/// An open schema (no `additionalProperties`): a small model forced to call used to pad it
/// with invented keys until `max_tokens` (2 of 10 forced Anthropic calls never finished).
fn open_parameters() -> Value {
    json!({"type": "object", "properties": {
        "city": {"type": "string", "description": "The city"},
        "days": {"type": "integer", "description": "How many days"}
    }, "required": ["city"]})
}

/// Whether `arguments` has the required `city` and no key `open_parameters` does not list.
fn declared_arguments(arguments: &Value) -> bool {
    arguments["city"].is_string()
        && arguments
            .as_object()
            .is_some_and(|m| m.keys().all(|k| k == "city" || k == "days"))
}

#[test]
fn forced_calls_with_an_open_schema_always_complete() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let mut failures = Vec::new();
    for seed in 0..10u64 {
        let (status, r) = post(
            s,
            "/v1/messages",
            json!({
                "model": MODEL, "max_tokens": 200, "temperature": 1.0, "seed": seed,
                "messages": [{"role": "user", "content": "What will the weather be in Lyon?"}],
                "tools": [{"name": "forecast", "description": "Weather forecast",
                           "input_schema": open_parameters()}],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": seed % 2 == 1}
            }),
        );
        assert_eq!(status, 200, "{r}");
        let calls: Vec<&Value> = r["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["type"] == "tool_use")
            .collect();
        // With parallel calls allowed (Anthropic's default) a small model may repeat its call
        // until `max_tokens`: every call that comes back must still be whole and declared.
        let stopped =
            r["stop_reason"] == "tool_use" || (seed % 2 == 0 && r["stop_reason"] == "max_tokens");
        if !stopped || calls.is_empty() || !calls.iter().all(|c| declared_arguments(&c["input"])) {
            failures.push(format!("anthropic seed {seed}: {r}"));
        }
    }
    for seed in 0..10u64 {
        let (status, r) = post(
            s,
            "/v1/chat/completions",
            json!({
                "model": MODEL, "max_tokens": 200, "temperature": 0.9, "seed": 100 + seed,
                "messages": [{"role": "user", "content": "What will the weather be in Lyon?"}],
                "tools": [{"type": "function", "function": {"name": "forecast",
                           "parameters": open_parameters()}}],
                "tool_choice": "required", "parallel_tool_calls": seed % 2 == 0
            }),
        );
        assert_eq!(status, 200, "{r}");
        let choice = &r["choices"][0];
        let calls = choice["message"]["tool_calls"].as_array();
        let stopped = choice["finish_reason"] == "tool_calls"
            || (seed % 2 == 0 && choice["finish_reason"] == "length");
        let complete = stopped
            && calls.is_some_and(|calls| {
                !calls.is_empty()
                    && calls.iter().all(|c| {
                        c["function"]["arguments"]
                            .as_str()
                            .and_then(|a| serde_json::from_str::<Value>(a).ok())
                            .is_some_and(|a| declared_arguments(&a))
                    })
            });
        if !complete {
            failures.push(format!("openai seed {seed}: {r}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 20 forced calls did not complete:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn an_invalid_tool_schema_is_a_short_400() {
    let Some(s) = server() else { return };
    let _serial = serial();
    // A large schema with one broken type: the message names the place, not the schema.
    let properties: serde_json::Map<String, Value> = (0..200)
        .map(|i| {
            (
                format!("p{i}"),
                json!({"type": "string", "description": "x".repeat(80)}),
            )
        })
        .chain([("bad".to_string(), json!({"type": "strin"}))])
        .collect();
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f",
                "parameters": {"type": "object", "properties": properties}}}]}),
        ),
        (
            "/v1/messages",
            json!({"model": MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"name": "f", "input_schema": {"type": "object", "properties": properties}}]}),
        ),
    ] {
        let (status, reply) = post(s, path, body);
        assert_eq!(status, 400, "{path}: {reply}");
        let message = error_message(&reply);
        assert!(
            message.len() < 500,
            "{path}: {} chars: {message}",
            message.len()
        );
        assert!(
            message.contains("`tools[0]` (f) parameters: invalid JSON schema"),
            "{message}"
        );
        assert!(message.contains("#/properties/bad/type"), "{message}");
    }
}
