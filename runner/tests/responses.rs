//! OpenAI's Responses API on `smollm2:135m`: the response object and the stream's event
//! sequence (insta snapshots, volatile values redacted), `previous_response_id` continuing a
//! stored conversation through the prefix cache, and errors; every field the Open Responses
//! schema requires; the tool shapes Codex sends (namespaces, custom tools, OpenAI's built-in
//! tools dropped with a warning) and the request fields it sets.

use crate::support;

use serde_json::{Value, json};
use support::{MODEL, Server, client, post, post_sse, redact, serial, server};

/// A function tool in the Responses shape. Its one argument is a choice, so that a forced
/// call is short whatever a 135M model makes of it.
fn function(name: &str) -> Value {
    json!({"type": "function", "name": name, "description": "Ask another agent for help.",
           "strict": false,
           "parameters": {"type": "object",
                          "properties": {"task": {"type": "string",
                                                  "enum": ["list files", "read a file"]}},
                          "required": ["task"], "additionalProperties": false}})
}

/// The final response object and the streamed events of the same request.
fn response_and_stream(s: &Server, body: Value) -> (Value, Vec<Value>) {
    let (status, response) = post(s, "/v1/responses", body.clone());
    assert_eq!(status, 200, "{response}");
    let mut streamed = body;
    streamed["stream"] = json!(true);
    (response, post_sse(s, "/v1/responses", streamed))
}

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
    let mut shape = redact(&first);
    shape["completed_at"] = json!("[completed_at]");
    insta::assert_json_snapshot!("response", shape);

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
            json!({"model": MODEL, "input": "x", "tools": [{"name": "lookup"}]}),
            400,
            "tools[0] needs a `type` (\"function\", \"custom\" or \"namespace\")",
        ),
        (json!({"model": MODEL, "input": []}), 400, "empty"),
        (
            json!({"model": MODEL, "input": [{"type": "teleport_call"}]}),
            400,
            "input[0]: item type \"teleport_call\" is not supported",
        ),
        (
            json!({"model": MODEL, "input": [{"type": "message", "role": "user",
                                              "content": [{"text": "hi"}]}]}),
            400,
            "input[0]: content part type (none) is not supported",
        ),
        (
            json!({"model": MODEL, "input": "x", "background": true}),
            400,
            "`background: true` is not supported",
        ),
    ] {
        let (got, reply) = post(s, "/v1/responses", body.clone());
        assert_eq!(got, status, "{body}: {reply}");
        let message = reply["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(needle),
            "`{message}` should mention `{needle}`"
        );
        // The issue's `tools[4] of type Some("namespace")`: no Rust debug text reaches a client.
        assert!(!message.contains("Some("), "{message}");
    }
}

/// What a field of the response object must hold, per the Open Responses schema.
#[derive(Debug, Clone, Copy)]
enum Kind {
    String,
    Integer,
    Number,
    Boolean,
    Array,
    Object,
    /// An object or a string (`tool_choice`).
    ObjectOrString,
}

/// Every field `ResponseResource` requires in the Open Responses schema
/// (openresponses/openresponses, `schema/components/schemas/ResponseResource.json`,
/// `required`), with its type; `true` where `null` is allowed too.
const REQUIRED: &[(&str, Kind, bool)] = &[
    ("id", Kind::String, false),
    ("object", Kind::String, false),
    ("created_at", Kind::Integer, false),
    ("completed_at", Kind::Integer, true),
    ("status", Kind::String, false),
    ("incomplete_details", Kind::Object, true),
    ("model", Kind::String, false),
    ("previous_response_id", Kind::String, true),
    ("instructions", Kind::String, true),
    ("output", Kind::Array, false),
    ("error", Kind::Object, true),
    ("tools", Kind::Array, false),
    ("tool_choice", Kind::ObjectOrString, false),
    ("truncation", Kind::String, false),
    ("parallel_tool_calls", Kind::Boolean, false),
    ("text", Kind::Object, false),
    ("top_p", Kind::Number, false),
    ("presence_penalty", Kind::Number, false),
    ("frequency_penalty", Kind::Number, false),
    ("top_logprobs", Kind::Integer, false),
    ("temperature", Kind::Number, false),
    ("reasoning", Kind::Object, true),
    ("user", Kind::String, true),
    ("usage", Kind::Object, true),
    ("max_output_tokens", Kind::Integer, true),
    ("max_tool_calls", Kind::Integer, true),
    ("store", Kind::Boolean, false),
    ("background", Kind::Boolean, false),
    ("service_tier", Kind::String, false),
    ("metadata", Kind::Object, false),
    ("safety_identifier", Kind::String, true),
    ("prompt_cache_key", Kind::String, true),
];

/// Checks `response` against [`REQUIRED`] and the required fields of its output items;
/// `what` names it in failures.
fn assert_open_responses_shape(response: &Value, what: &str) {
    for &(field, kind, nullable) in REQUIRED {
        let value = response
            .get(field)
            .unwrap_or_else(|| panic!("{what}: `{field}` is missing: {response}"));
        let fits = match kind {
            Kind::String => value.is_string(),
            Kind::Integer => value.is_u64() || value.is_i64(),
            Kind::Number => value.is_number(),
            Kind::Boolean => value.is_boolean(),
            Kind::Array => value.is_array(),
            Kind::Object => value.is_object(),
            Kind::ObjectOrString => value.is_object() || value.is_string(),
        };
        assert!(
            fits || (nullable && value.is_null()),
            "{what}: `{field}` should be {kind:?}{}, is {value}",
            if nullable { " or null" } else { "" }
        );
    }
    // Output items: a message's text parts need `logprobs`, a function call its strings.
    for item in response["output"].as_array().unwrap() {
        for field in ["type", "id", "status"] {
            assert!(
                item[field].is_string(),
                "{what}: item without `{field}`: {item}"
            );
        }
        match item["type"].as_str().unwrap() {
            "message" => {
                assert_eq!(item["role"], "assistant");
                for part in item["content"].as_array().unwrap() {
                    assert_eq!(part["type"], "output_text", "{what}: {part}");
                    assert!(part["text"].is_string(), "{what}: {part}");
                    assert!(part["annotations"].is_array(), "{what}: {part}");
                    assert!(part["logprobs"].is_array(), "{what}: {part}");
                }
            }
            "function_call" => {
                for field in ["call_id", "name", "arguments"] {
                    assert!(item[field].is_string(), "{what}: `{field}` in {item}");
                }
            }
            "reasoning" => assert!(item["summary"].is_array(), "{what}: {item}"),
            other => panic!("{what}: unexpected item type {other}"),
        }
    }
    if let Some(usage) = response["usage"].as_object() {
        for field in ["input_tokens", "output_tokens", "total_tokens"] {
            assert!(usage[field].is_u64(), "{what}: usage.{field}");
        }
        assert!(usage["input_tokens_details"]["cached_tokens"].is_u64());
        assert!(usage["output_tokens_details"]["reasoning_tokens"].is_u64());
    }
}

/// Every field the Open Responses schema requires is present with its type: on the final
/// object and on the streamed `response.created`, `response.in_progress` and the closing
/// event's response, with text and with a tool call, and the sampling numbers are the ones
/// used.
#[test]
fn every_open_responses_required_field_is_present() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let bodies = [
        json!({"model": MODEL, "input": "Say hi.", "max_output_tokens": 4,
               "temperature": 0.7, "top_p": 0.9}),
        json!({"model": MODEL, "input": "Ask for help.", "max_output_tokens": 48,
               "temperature": 0, "tools": [function("ask")], "tool_choice": "required",
               "store": false}),
    ];
    for body in bodies {
        let (response, events) = response_and_stream(s, body.clone());
        assert_open_responses_shape(&response, "the response");
        assert!(response["completed_at"].is_u64(), "{response}");
        for event in &events {
            let kind = event["type"].as_str().unwrap();
            if let Some(streamed) = event.get("response") {
                assert_open_responses_shape(streamed, kind);
                let done = matches!(kind, "response.completed" | "response.incomplete");
                assert_eq!(streamed["completed_at"].is_u64(), done, "{kind}");
            }
        }
        let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
        assert_eq!(&kinds[..2], ["response.created", "response.in_progress"]);
        assert!(
            matches!(
                kinds.last(),
                Some(&"response.completed" | &"response.incomplete")
            ),
            "{kinds:?}"
        );
        if body.get("tools").is_some() {
            assert_eq!(response["output"][0]["type"], "function_call", "{response}");
        } else {
            assert_eq!(response["temperature"], json!(0.7));
            assert_eq!(response["top_p"], json!(0.9));
        }
    }
    // With no sampling settings, the numbers reported are the model's defaults in use.
    let (_, response) = post(
        s,
        "/v1/responses",
        json!({"model": MODEL, "input": "Hi.",
                                                          "max_output_tokens": 1}),
    );
    for field in [
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
    ] {
        assert!(response[field].is_number(), "{field}: {response}");
    }
}

/// Codex's `namespace` tools are flattened into their functions; a call goes back as a
/// `function_call` naming the function and its namespace, and comes back in the next request's
/// input (with its output) as Codex sends it.
#[test]
fn a_namespace_tool_is_flattened_into_its_functions() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let tools = json!([{"type": "namespace", "name": "collaboration",
                        "description": "Tools in the collaboration namespace.",
                        "tools": [function("spawn_agent")]}]);
    let body = json!({"model": MODEL, "input": "Ask an agent to list the files.",
                      "tools": tools, "tool_choice": "required", "max_output_tokens": 48,
                      "temperature": 0});
    let (response, events) = response_and_stream(s, body);
    let call = &response["output"][0];
    assert_eq!(call["type"], "function_call", "{response}");
    assert_eq!(call["name"], "spawn_agent", "{response}");
    assert_eq!(call["namespace"], "collaboration", "{response}");
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments["task"].is_string(), "{arguments}");
    // The response lists the flat function it offered.
    assert_eq!(response["tools"][0]["type"], "function", "{response}");
    assert_eq!(response["tools"][0]["name"], "spawn_agent", "{response}");
    let done = events
        .iter()
        .find(|e| e["type"] == "response.output_item.done")
        .unwrap();
    assert_eq!(done["item"]["namespace"], "collaboration", "{done}");

    let (status, follow) = post(
        s,
        "/v1/responses",
        json!({"model": MODEL, "tools": tools, "max_output_tokens": 4, "store": false,
        "input": [
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "Ask an agent."}]},
            {"type": "function_call", "call_id": "call_1", "name": "spawn_agent",
             "namespace": "collaboration", "arguments": "{\"task\":\"list files\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "done"}
        ]}),
    );
    assert_eq!(status, 200, "{follow}");
}

/// Codex's default request ("responses-lite") sends no `tools`: an `additional_tools` input
/// item declares them, in namespaces. They are offered as top-level ones are.
#[test]
fn tools_declared_in_the_input_are_offered() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let (status, response) = post(
        s,
        "/v1/responses",
        json!({"model": MODEL, "tool_choice": "required", "parallel_tool_calls": false,
        "max_output_tokens": 48, "temperature": 0, "store": false,
        "reasoning": {"effort": "low", "context": "all_turns"},
        "input": [
            {"type": "additional_tools", "id": "at_1", "role": "developer", "tools": [
                {"type": "namespace", "name": "collaboration",
                 "description": "Agents.", "tools": [function("spawn_agent")]}]},
            {"type": "message", "id": "msg_1", "role": "user",
             "content": [{"type": "input_text", "text": "Ask an agent."}]}
        ]}),
    );
    assert_eq!(status, 200, "{response}");
    let call = &response["output"][0];
    assert_eq!(call["type"], "function_call", "{response}");
    assert_eq!(call["name"], "spawn_agent", "{response}");
    assert_eq!(call["namespace"], "collaboration", "{response}");
}

/// A `custom` (freeform) tool is offered as a function of one string; its call goes back as a
/// `custom_tool_call` with that string as `input`, streamed with its input events.
#[test]
fn a_custom_tool_is_called_with_free_text() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let tools = json!([{"type": "custom", "name": "apply_patch",
                        "description": "Use this tool to edit files.",
                        "format": {"type": "grammar", "syntax": "lark",
                                   "definition": "start: \"*** Begin Patch\" /(.|\\n)*/"}}]);
    let body = json!({"model": MODEL, "input": "Call apply_patch with the input \"hi\".", "tools": tools,
                      "tool_choice": "required", "max_output_tokens": 64, "temperature": 0});
    let (response, events) = response_and_stream(s, body);
    let call = &response["output"][0];
    assert_eq!(call["type"], "custom_tool_call", "{response}");
    assert_eq!(call["name"], "apply_patch");
    assert!(call["input"].is_string(), "{call}");
    assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert!(
        kinds.contains(&"response.custom_tool_call_input.done"),
        "{kinds:?}"
    );
    let (status, follow) = post(
        s,
        "/v1/responses",
        json!({"model": MODEL, "tools": tools, "max_output_tokens": 4, "input": [
            {"type": "message", "role": "user", "content": "Create hello.txt."},
            {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch",
             "input": "*** Begin Patch\n*** End Patch"},
            {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done!"}
        ]}),
    );
    assert_eq!(status, 200, "{follow}");
}

/// OpenAI's built-in tools (and items they made) are left out with a warning in the response's
/// `metadata`, a header and the log; the client's functions are still offered.
#[test]
fn built_in_tools_are_dropped_with_a_warning() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let body = json!({"model": MODEL, "max_output_tokens": 4,
        "metadata": {"session": "abc"},
        "tools": [{"type": "web_search", "external_web_access": false},
                  {"type": "file_search", "vector_store_ids": ["vs_1"]},
                  {"type": "code_interpreter", "container": {"type": "auto"}},
                  {"type": "image_generation"}, {"type": "local_shell"},
                  {"type": "mcp", "server_label": "x", "server_url": "https://example.com"},
                  function("ask")],
        "input": [{"type": "message", "role": "user", "content": "Hi."},
                  {"type": "web_search_call", "id": "ws_1", "status": "completed",
                   "action": {"type": "search", "query": "weather"}}]});
    let r = client()
        .post(format!("{}/v1/responses", s.base))
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let header = r.headers()["x-mlxkit-warning"]
        .to_str()
        .unwrap()
        .to_string();
    let response: Value = r.json().unwrap();
    let warning = response["metadata"]["mlxkit_warning"].as_str().unwrap();
    assert_eq!(response["metadata"]["session"], "abc");
    assert_eq!(header, warning);
    for needle in [
        "built-in tools, which a local model cannot call, are left out: web_search (tools[0]), \
         file_search (tools[1]), code_interpreter (tools[2]), image_generation (tools[3]), \
         local_shell (tools[4]), mcp (tools[5])",
        "are left out: web_search_call (input[1])",
    ] {
        assert!(
            warning.contains(needle),
            "`{warning}` should mention {needle}"
        );
    }
    assert!(warning.chars().count() <= 483, "{warning}");
    let names: Vec<&str> = response["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ask"]);
    // Streamed, the warning is in the first event's metadata already.
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let events = post_sse(s, "/v1/responses", streamed);
    assert_eq!(events[0]["response"]["metadata"]["mlxkit_warning"], warning);
}

/// The request fields Codex and the Open Responses tests set are accepted, and the response
/// reports them.
#[test]
fn the_fields_codex_sends_are_accepted() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let (status, response) = post(
        s,
        "/v1/responses",
        json!({
            "model": MODEL, "instructions": "You are Codex.",
            "input": [{"type": "message", "role": "developer",
                       "content": [{"type": "input_text", "text": "Sandbox: read-only."}]},
                      {"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": "Say hi."}]}],
            "tools": [function("ask")], "tool_choice": "auto", "parallel_tool_calls": false,
            "reasoning": {"effort": "medium", "summary": "auto"},
            "store": false, "stream": false,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "019a-thread", "client_metadata": {"x-codex-turn": "1"},
            "text": {"verbosity": "low"},
            "safety_identifier": "user-hash", "user": "someone", "service_tier": "auto",
            "truncation": "auto", "max_tool_calls": 1, "top_logprobs": 0,
            "background": false, "presence_penalty": 0.5, "frequency_penalty": 0.25,
            "max_output_tokens": 4
        }),
    );
    assert_eq!(status, 200, "{response}");
    assert_open_responses_shape(&response, "the response");
    for (field, value) in [
        ("prompt_cache_key", json!("019a-thread")),
        ("safety_identifier", json!("user-hash")),
        ("user", json!("someone")),
        ("service_tier", json!("default")),
        ("truncation", json!("auto")),
        ("max_tool_calls", json!(1)),
        ("top_logprobs", json!(0)),
        ("background", json!(false)),
        ("store", json!(false)),
        ("parallel_tool_calls", json!(false)),
        ("presence_penalty", json!(0.5)),
        ("frequency_penalty", json!(0.25)),
        ("reasoning", json!({"effort": "medium", "summary": "auto"})),
        (
            "text",
            json!({"verbosity": "low", "format": {"type": "text"}}),
        ),
    ] {
        assert_eq!(response[field], value, "{field}: {response}");
    }
    // `store: false`: nothing to continue from.
    let (status, _) = post(
        s,
        "/v1/responses",
        json!({"model": MODEL, "previous_response_id": response["id"], "input": "Again."}),
    );
    assert_eq!(status, 404);
}
