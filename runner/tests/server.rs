//! End to end: the real server on a loopback port with `smollm2:135m`, every endpoint,
//! streamed and not, bad input, cancellation and concurrency.
//!
//! Response shapes are insta snapshots with timings, ids and generated text redacted (greedy
//! text can differ between CPUs in near ties; its shape cannot).

use crate::support;

use serde_json::{Value, json};
use support::{
    MODEL, PNG, Server, client, get, post, post_ndjson, post_sse, ps_when_idle, redact, serial,
    server,
};

fn greedy(n: u32) -> Value {
    json!({ "temperature": 0, "num_predict": n })
}

/// `listing` with only `MODEL`'s entry left in its `list`: the other modules of this test
/// binary create and load models on the shared server too.
fn only_model(mut listing: Value, list: &str, key: &str) -> Value {
    let entries = listing[list].as_array_mut().expect("a list of models");
    entries.retain(|entry| entry[key] == MODEL);
    assert_eq!(entries.len(), 1, "{MODEL} is listed once");
    listing
}

#[test]
fn model_management_endpoints() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let (status, version) = get(s, "/api/version");
    assert_eq!(status, 200);
    assert_eq!(version["version"], env!("CARGO_PKG_VERSION"));
    let (status, tags) = get(s, "/api/tags");
    assert_eq!(status, 200);
    insta::assert_json_snapshot!("tags", redact(&only_model(tags, "models", "name")));
    let (status, show) = post(s, "/api/show", json!({ "model": MODEL }));
    assert_eq!(status, 200);
    assert_eq!(show["details"]["family"], "llama");
    // `curl -d` labels JSON as a form; Ollama's documented examples rely on it being accepted.
    let r = client()
        .post(format!("{}/api/show", s.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(json!({ "model": MODEL }).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(show["details"]["parameter_size"], "135M");
    let (status, models) = get(s, "/v1/models");
    assert_eq!(status, 200);
    insta::assert_json_snapshot!("v1_models", redact(&only_model(models, "data", "id")));

    // copy, create (from a stored model, with a system prompt and parameters), delete.
    let (status, _) = post(
        s,
        "/api/copy",
        json!({ "source": MODEL, "destination": "mine:copy" }),
    );
    assert_eq!(status, 200);
    let lines = post_ndjson(
        s,
        "/api/create",
        json!({ "model": "mine:terse", "from": MODEL, "system": "Answer in one word.", "parameters": { "temperature": 0 } }),
    );
    assert_eq!(lines.last().unwrap()["status"], "success", "{lines:?}");
    let (_, show) = post(s, "/api/show", json!({ "model": "mine:terse" }));
    assert_eq!(show["system"], "Answer in one word.");
    assert!(
        show["parameters"]
            .as_str()
            .unwrap()
            .contains("temperature 0")
    );
    let (status, _) = post(
        s,
        "/api/create",
        json!({ "model": "bad", "modelfile": "FROM\n" }),
    );
    assert_eq!(status, 400);
    let r = client()
        .delete(format!("{}/api/delete", s.base))
        .json(&json!({ "model": "mine:copy" }))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = client()
        .delete(format!("{}/api/delete", s.base))
        .json(&json!({ "model": "mine:copy" }))
        .send()
        .unwrap();
    assert_eq!(r.status(), 404);

    // Pulling a model already in the download cache streams progress and succeeds.
    let lines = post_ndjson(s, "/api/pull", json!({ "model": MODEL }));
    assert_eq!(lines.last().unwrap()["status"], "success", "{lines:?}");
    let (status, body) = post(
        s,
        "/api/pull",
        json!({ "model": "nosuch:model", "stream": false }),
    );
    assert_eq!(status, 404, "{body}");
}

#[test]
fn ollama_generate_and_chat() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let (status, one) = post(
        s,
        "/api/generate",
        json!({ "model": MODEL, "prompt": "Name a color.", "stream": false, "options": greedy(8) }),
    );
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["done"], true);
    assert_eq!(one["eval_count"], 8);
    assert_eq!(one["done_reason"], "length");
    assert!(!one["response"].as_str().unwrap().is_empty());
    insta::assert_json_snapshot!("generate", redact(&one));

    // Streamed: the pieces join to the same text.
    let lines = post_ndjson(
        s,
        "/api/generate",
        json!({ "model": MODEL, "prompt": "Name a color.", "options": greedy(8) }),
    );
    let joined: String = lines
        .iter()
        .filter_map(|l| l["response"].as_str())
        .collect();
    assert_eq!(joined, one["response"].as_str().unwrap());
    assert_eq!(lines.last().unwrap()["done"], true);
    insta::assert_json_snapshot!("generate_stream_last", redact(lines.last().unwrap()));

    let chat = json!({
        "model": MODEL,
        "messages": [{ "role": "system", "content": "Be brief." }, { "role": "user", "content": "Say hello." }],
        "stream": false,
        "options": greedy(6),
        "logprobs": true,
        "top_logprobs": 2,
    });
    let (status, reply) = post(s, "/api/chat", chat.clone());
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["message"]["role"], "assistant");
    assert_eq!(reply["logprobs"].as_array().unwrap().len(), 6);
    assert_eq!(
        reply["logprobs"][0]["top_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    insta::assert_json_snapshot!("chat", redact(&reply));
    let mut streamed = chat;
    streamed["stream"] = json!(true);
    let lines = post_ndjson(s, "/api/chat", streamed);
    let joined: String = lines
        .iter()
        .filter_map(|l| l["message"]["content"].as_str())
        .collect();
    assert_eq!(joined, reply["message"]["content"].as_str().unwrap());

    // Stop strings end generation without leaking.
    let (_, long) = post(
        s,
        "/api/generate",
        json!({ "model": MODEL, "prompt": "Count: 1, 2, 3,", "stream": false, "raw": true, "options": greedy(12) }),
    );
    let text = long["response"].as_str().unwrap();
    if let Some(cut) = text
        .char_indices()
        .nth(3)
        .map(|(i, _)| &text[i..])
        .and_then(|t| t.get(..2))
    {
        let (_, stopped) = post(
            s,
            "/api/generate",
            json!({ "model": MODEL, "prompt": "Count: 1, 2, 3,", "stream": false, "raw": true,
                    "options": { "temperature": 0, "num_predict": 12, "stop": [cut] } }),
        );
        let out = stopped["response"].as_str().unwrap();
        assert!(
            !out.contains(cut),
            "stop string {cut:?} leaked into {out:?}"
        );
        assert!(text.starts_with(out), "{out:?} is not a prefix of {text:?}");
        assert_eq!(stopped["done_reason"], "stop");
    }
}

#[test]
fn openai_endpoints() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let body = json!({
        "model": MODEL,
        "messages": [{ "role": "user", "content": "Say hi." }],
        "max_tokens": 6,
        "temperature": 0,
        "seed": 1,
        "logprobs": true,
        "top_logprobs": 3,
    });
    let (status, reply) = post(s, "/v1/chat/completions", body.clone());
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["object"], "chat.completion");
    assert_eq!(reply["usage"]["completion_tokens"], 6);
    assert_eq!(reply["choices"][0]["finish_reason"], "length");
    assert_eq!(
        reply["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    insta::assert_json_snapshot!("chat_completion", redact(&reply));

    let mut streamed = body;
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({ "include_usage": true });
    let events = post_sse(s, "/v1/chat/completions", streamed);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let usage = &events[events.len() - 2];
    assert_eq!(usage["usage"]["completion_tokens"], 6);
    let joined: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        joined,
        reply["choices"][0]["message"]["content"].as_str().unwrap()
    );
    // The role alone first (issue 48: clients and llama.cpp's tests expect it), then text.
    insta::assert_json_snapshot!("chat_completion_chunk_first", redact(&events[0]));
    insta::assert_json_snapshot!("chat_completion_chunk_content", redact(&events[1]));

    let (status, completion) = post(
        s,
        "/v1/completions",
        json!({ "model": MODEL, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0 }),
    );
    assert_eq!(status, 200, "{completion}");
    assert_eq!(completion["object"], "text_completion");
    insta::assert_json_snapshot!("completion", redact(&completion));
    let events = post_sse(
        s,
        "/v1/completions",
        json!({ "model": MODEL, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0, "stream": true }),
    );
    let joined: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(joined, completion["choices"][0]["text"].as_str().unwrap());
}

#[test]
fn bad_input_is_a_clear_error_and_the_server_stays_healthy() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let healthy = |s: &Server| assert_eq!(get(s, "/api/version").0, 200);

    let r = client()
        .post(format!("{}/api/generate", s.base))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("invalid JSON"),
        "{body}"
    );
    healthy(s);

    let cases = [
        (
            "/api/generate",
            json!({ "model": "nosuch:model", "prompt": "hi" }),
            404,
            "not found",
        ),
        (
            "/api/chat",
            json!({ "model": "", "messages": [] }),
            400,
            "model",
        ),
        (
            "/api/generate",
            json!({ "model": MODEL, "prompt": "hi", "options": { "temperature": -1 } }),
            400,
            "temperature",
        ),
        (
            "/api/generate",
            json!({ "model": MODEL, "prompt": "hi", "options": { "num_predict": 2.5 } }),
            400,
            "num_predict",
        ),
        (
            "/api/generate",
            json!({ "model": MODEL, "prompt": "hi", "options": { "top_p": 7 } }),
            400,
            "top_p",
        ),
        (
            "/api/generate",
            json!({ "model": MODEL, "prompt": "hi", "images": ["%%%not base64"] }),
            400,
            "invalid image",
        ),
        (
            "/api/generate",
            json!({ "model": MODEL, "prompt": "hi", "images": [PNG] }),
            400,
            "does not support images",
        ),
        (
            "/api/chat",
            json!({ "model": MODEL, "messages": [{ "role": "user", "content": "hi", "images": [PNG] }] }),
            400,
            "does not support images",
        ),
        (
            "/api/generate",
            json!({ "model": MODEL, "prompt": "word ".repeat(600), "options": { "num_ctx": 64 } }),
            400,
            "context",
        ),
        (
            "/api/generate",
            json!({ "model": MODEL, "prompt": "hi", "format": "xml" }),
            400,
            "format",
        ),
        (
            "/api/generate",
            json!({ "model": "../../etc", "prompt": "hi" }),
            400,
            "invalid model name",
        ),
        (
            "/v1/chat/completions",
            json!({ "model": MODEL, "messages": [{ "role": "user", "content": "x" }], "temperature": "hot" }),
            400,
            "temperature",
        ),
    ];
    for (path, body, status, needle) in cases {
        let (got, reply) = post(s, path, body.clone());
        assert_eq!(got, status, "{path} {body}: {reply}");
        let message = reply["error"]
            .as_str()
            .or_else(|| reply["error"]["message"].as_str())
            .unwrap_or_default()
            .to_lowercase();
        assert!(
            message.contains(needle),
            "{path}: `{message}` should mention `{needle}`"
        );
        healthy(s);
    }
    let (status, body) = get(s, "/api/nothing-here");
    assert_eq!(status, 404);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("/api/nothing-here")
    );
    healthy(s);
}

/// A checkpoint whose config claims absurd sizes is refused at create, naming the field,
/// before anything is sized from it; the server keeps serving.
#[test]
fn create_refuses_a_config_with_absurd_sizes() {
    let Some(s) = server() else { return };
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/tests/fixtures/llama");
    for (field, value) in [
        ("num_hidden_layers", json!(1_000_000_000_000_000u64)),
        ("vocab_size", json!(1u64 << 40)),
        ("hidden_size", json!(u64::MAX)),
        ("num_attention_heads", json!(1u64 << 30)),
    ] {
        let folder = tempfile::tempdir().unwrap();
        for file in ["config.json", "generation_config.json", "model.safetensors"] {
            std::fs::copy(fixture.join(file), folder.path().join(file)).unwrap();
        }
        let mut config: Value =
            serde_json::from_slice(&std::fs::read(fixture.join("config.json")).unwrap()).unwrap();
        config[field] = value;
        std::fs::write(folder.path().join("config.json"), config.to_string()).unwrap();
        let (status, reply) = post(
            s,
            "/api/create",
            json!({ "model": "absurd:test", "from": folder.path(), "stream": false }),
        );
        assert_eq!(status, 400, "{field}: {reply}");
        let message = reply["error"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{field}: {message}");
        assert_eq!(get(s, "/api/version").0, 200);
    }
}

#[test]
fn a_cancelled_generation_leaves_a_healthy_server_and_a_warm_prefix() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let prompt = "Write a long story about a lighthouse keeper and the sea. ".repeat(8);
    // Start streaming, read the first lines, then disconnect.
    {
        let mut r = client()
            .post(format!("{}/api/generate", s.base))
            .json(&json!({ "model": MODEL, "prompt": prompt, "options": greedy(400) }))
            .send()
            .unwrap();
        let mut buffer = [0u8; 256];
        let mut seen = 0;
        while seen < 3 {
            let n = std::io::Read::read(&mut r, &mut buffer).unwrap();
            assert!(n > 0, "the stream ended early");
            seen += buffer[..n].iter().filter(|&&b| b == b'\n').count();
        }
    }
    // The server stays healthy, and the retry evaluates only what the cache lacks.
    assert_eq!(get(s, "/api/version").0, 200);
    let (status, retry) = post(
        s,
        "/api/generate",
        json!({ "model": MODEL, "prompt": prompt, "stream": false, "options": greedy(4) }),
    );
    assert_eq!(status, 200, "{retry}");
    let evaluated = retry["prompt_eval_count"].as_u64().unwrap();
    assert!(
        evaluated <= 1,
        "the retry evaluated {evaluated} prompt tokens instead of reusing the cache"
    );
}

#[test]
fn eight_concurrent_clients_all_get_complete_answers() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let answers: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                scope.spawn(move || {
                    let (status, reply) = post(
                        s,
                        "/api/generate",
                        json!({ "model": MODEL, "prompt": format!("Client {}: name a fruit.", i % 2), "stream": false, "options": greedy(5) }),
                    );
                    assert_eq!(status, 200, "{reply}");
                    reply
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(a["done"], true);
        assert_eq!(a["eval_count"], 5, "client {i}");
        // Same prompt, greedy: the same answer, whichever order the queue ran them in.
        assert_eq!(a["response"], answers[i % 2]["response"], "client {i}");
    }
}

#[test]
fn ps_reports_the_loaded_model() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let (status, _) = post(
        s,
        "/api/generate",
        json!({ "model": MODEL, "prompt": "hi", "stream": false, "options": greedy(1) }),
    );
    assert_eq!(status, 200);
    // The status is published after the step the answer left in: on a busy machine an
    // immediate `/api/ps` still saw the request running.
    let ps = ps_when_idle(s);
    insta::assert_json_snapshot!("ps", redact(&only_model(ps, "models", "name")));
}
