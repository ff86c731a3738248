//! Hostile and odd requests against a live server with `smollm2:135m`: schemas that overflow
//! compilers, templates that loop or do not parse, sizes, encodings, methods, origins and slow
//! clients. Each case states the answer it must get, and after every case the server must
//! still answer `/api/version` promptly: none of them may abort the process or stall the
//! runtime. Each class here aborted the process or answered a 500 before its fix.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};
use support::{MODEL, PNG, Server, client, post, serial, server};

/// The server still answers a cheap request. The bound is generous for a loaded 2-core CI
/// machine; the probe this suite grew from measured at most 0.17 s.
fn assert_responsive(s: &Server, after: &str) {
    let reply = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap()
        .get(format!("{}/api/version", s.base))
        .send();
    assert!(
        reply.is_ok_and(|r| r.status() == 200),
        "the server stopped answering after: {after}"
    );
}

/// The error message of an Ollama- or OpenAI-shaped error body.
fn message(reply: &Value) -> String {
    reply["error"]
        .as_str()
        .or_else(|| reply["error"]["message"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Posts `body`, expects `status` and an error mentioning `needle`, then a live server.
fn expect(s: &Server, name: &str, path: &str, body: Value, status: u16, needle: &str) {
    let (got, reply) = post(s, path, body);
    assert_eq!(got, status, "{name}: {reply}");
    assert!(
        message(&reply).contains(needle),
        "{name}: `{}` should mention `{needle}`",
        message(&reply)
    );
    assert_responsive(s, name);
}

fn reference_chain(n: usize) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        defs.insert(
            format!("d{i}"),
            json!({"$ref": format!("#/$defs/d{}", i + 1)}),
        );
    }
    defs.insert(format!("d{n}"), json!({"type": "string"}));
    json!({"$ref": "#/$defs/d0", "$defs": defs})
}

fn many_optional_properties(n: usize) -> Value {
    let properties: serde_json::Map<_, _> = (0..n)
        .map(|i| (format!("p{i}"), json!({"type": "integer"})))
        .collect();
    json!({"type": "object", "properties": properties})
}

/// A tool whose parameters keep nested models in local `$defs`, as Pydantic writes them.
fn pydantic_tool() -> Value {
    json!({"type": "function", "function": {"name": "lookup", "parameters": {
        "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}},
        "type": "object",
        "properties": {"place": {"$ref": "#/$defs/Place"}},
        "required": ["place"]
    }}})
}

#[test]
fn hostile_schemas_are_400s_and_never_abort_the_process() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let generate = |format: Value| {
        json!({"model": MODEL, "prompt": "hi", "stream": false, "format": format,
               "options": {"num_predict": 4}})
    };
    // A 21 KB body whose `$ref` chain overflowed the compiling thread's stack.
    expect(
        s,
        "a 600-deep $ref chain",
        "/api/generate",
        generate(reference_chain(600)),
        400,
        "chain of `$ref` references",
    );
    // Thousands of optional properties overflowed llguidance's parser rows mid-generation.
    expect(
        s,
        "5000 optional properties",
        "/api/generate",
        generate(many_optional_properties(5000)),
        400,
        "properties of one object",
    );
    expect(
        s,
        "an unsatisfiable schema",
        "/api/generate",
        generate(json!({"type": "integer", "minimum": 5, "maximum": 1})),
        400,
        "schema",
    );
    expect(
        s,
        "a 5000-way enum",
        "/api/generate",
        generate(json!({"enum": (0..5000).collect::<Vec<_>>()})),
        400,
        "alternatives",
    );
}

#[test]
fn tools_with_local_definitions_are_served() {
    let Some(s) = server() else { return };
    let _serial = serial();
    for choice in ["auto", "required"] {
        let (status, reply) = post(
            s,
            "/v1/chat/completions",
            json!({"model": MODEL, "tools": [pydantic_tool()], "tool_choice": choice,
                   "messages": [{"role": "user", "content": "Where is the Louvre?"}],
                   "max_tokens": 48, "temperature": 0}),
        );
        assert_eq!(status, 200, "tool_choice {choice}: {reply}");
        if choice == "required" && reply["choices"][0]["finish_reason"] == "tool_calls" {
            let call = &reply["choices"][0]["message"]["tool_calls"][0]["function"];
            let arguments: Value =
                serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
            assert!(arguments["place"]["city"].is_string(), "{arguments}");
        }
        assert_responsive(s, "a tool with $defs");
    }
}

#[test]
fn broken_templates_are_refused_at_create() {
    let Some(s) = server() else { return };
    let _serial = serial();
    for (template, needle) in [
        ("{%}", "does not compile"),
        ("{{ foo(", "does not compile"),
        (
            "{% for i in range(9999) %}{% for j in range(9999) %}x{% endfor %}{% endfor %}",
            "work budget",
        ),
    ] {
        expect(
            s,
            template,
            "/api/create",
            json!({"model": "broken-template", "from": MODEL, "template": template,
                   "stream": false}),
            400,
            needle,
        );
    }
    // Nothing was stored.
    let (status, _) = post(s, "/api/show", json!({"model": "broken-template"}));
    assert_eq!(status, 404);
}

#[test]
fn request_fields_the_model_cannot_honour_are_400s() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                      "logit_bias": {"99999999": 5}, "max_tokens": 4});
    expect(
        s,
        "logit_bias outside the vocabulary",
        "/v1/chat/completions",
        chat.clone(),
        400,
        "outside the vocabulary",
    );
    let mut streamed = chat;
    streamed["stream"] = json!(true);
    expect(
        s,
        "logit_bias outside the vocabulary, streamed",
        "/v1/chat/completions",
        streamed,
        400,
        "outside the vocabulary",
    );
    // SmolLM2's vocabulary has no fill-in-the-middle markers: `suffix` is refused, never
    // silently dropped.
    expect(
        s,
        "suffix without infill markers",
        "/api/generate",
        json!({"model": MODEL, "prompt": "def f(", "suffix": "return x", "stream": false}),
        400,
        "does not support insert",
    );
    // Attachments are checked before a model loads: an unknown model is still "not found",
    // a text model refuses images without loading.
    expect(
        s,
        "an image for an unknown model",
        "/api/chat",
        json!({"model": "nosuch:1b", "stream": false,
               "messages": [{"role": "user", "content": "hi", "images": [PNG]}]}),
        404,
        "not found",
    );
}

#[test]
fn a_tool_call_cut_off_by_the_token_limit_ends_with_length_and_nothing_of_it() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let tool = json!({"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}}});
    for max_tokens in [3, 5, 9] {
        let (status, reply) = post(
            s,
            "/v1/chat/completions",
            json!({"model": MODEL, "tools": [tool], "tool_choice": "required",
                   "messages": [{"role": "user", "content": "call f"}],
                   "max_tokens": max_tokens, "temperature": 0}),
        );
        assert_eq!(status, 200, "max_tokens {max_tokens}: {reply}");
        let choice = &reply["choices"][0];
        assert_eq!(choice["finish_reason"], "length", "{reply}");
        // Neither a half call nor its raw text (issue 48).
        assert!(choice["message"]["tool_calls"].is_null(), "{reply}");
        assert!(
            choice["message"]["content"]
                .as_str()
                .is_none_or(|c| c.trim().is_empty()),
            "{reply}"
        );
    }
}

#[test]
fn sizes_and_encodings_are_refused_quickly() {
    let Some(s) = server() else { return };
    let _serial = serial();
    // 50 MB: refused from its byte length, not after tokenizing all of it.
    expect(
        s,
        "a 50 MB prompt",
        "/api/generate",
        json!({"model": MODEL, "prompt": "a ".repeat(25_000_000), "stream": false}),
        400,
        "bytes",
    );
    let raw = |body: Vec<u8>| {
        let r = client()
            .post(format!("{}/api/chat", s.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .unwrap();
        (r.status().as_u16(), r.text().unwrap_or_default())
    };
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    for (name, body) in [
        ("invalid UTF-8", b"{\"model\": \"\xff\xfe\"}".to_vec()),
        ("100,000 nested arrays", nested.into_bytes()),
        ("an empty body", Vec::new()),
        ("a bare number", b"1e999999".to_vec()),
    ] {
        let (status, text) = raw(body);
        assert_eq!(status, 400, "{name}: {text}");
        assert!(text.contains("error"), "{name}: {text}");
        assert_responsive(s, name);
    }
    // Four 12 MB prompts at once: the runtime keeps answering meanwhile.
    std::thread::scope(|scope| {
        let big: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    post(
                        s,
                        "/api/generate",
                        json!({"model": MODEL, "prompt": "word ".repeat(2_400_000),
                               "stream": false}),
                    )
                })
            })
            .collect();
        assert_responsive(s, "four 12 MB prompts in flight");
        for handle in big {
            let (status, reply) = handle.join().unwrap();
            assert_eq!(status, 400, "{reply}");
        }
    });
}

#[test]
fn methods_origins_and_slow_clients_get_http_answers() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let r = client().get(format!("{}/api/chat", s.base)).send().unwrap();
    assert_eq!(r.status(), 405);
    let body: Value = r.json().unwrap();
    assert!(message(&body).contains("GET"), "{body}");

    // A browser page on this machine may call the API (its preflight is answered)...
    let preflight = |origin: &str| {
        client()
            .request(reqwest::Method::OPTIONS, format!("{}/api/chat", s.base))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "content-type")
            .send()
            .unwrap()
    };
    let local = preflight("http://localhost:3000");
    assert_eq!(local.status(), 200);
    assert_eq!(
        local.headers()["access-control-allow-origin"],
        "http://localhost:3000"
    );
    // ...a page elsewhere may not.
    let remote = preflight("http://evil.example");
    assert!(!remote.headers().contains_key("access-control-allow-origin"));

    // A client that sends half a request line and stalls is cut off.
    let address = s.base.trim_start_matches("http://");
    let mut slow = TcpStream::connect(address).unwrap();
    slow.write_all(b"GET /api/version HTTP/1.1\r\n").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut rest = Vec::new();
    let outcome = slow.read_to_end(&mut rest);
    assert!(
        outcome.is_ok(),
        "the server should close a connection whose headers never finish: {outcome:?}"
    );
    assert_responsive(s, "a slow client");
}
