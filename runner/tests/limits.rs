//! Output limits and OpenAI's chat findings of issue 48, end to end on `smollm2:135m`: a
//! request with no limit (or one past what the context has left) stops at the context's end
//! with each API's length reason; a Modelfile's `num_predict` and the server's
//! `MLXKIT_MAX_OUTPUT_TOKENS` cap a request that names no limit; the first chat stream chunk is
//! role-only; `n > 1` runs as extra rows (streamed and not, seeded reruns repeat); an
//! embedding input past the context is refused on OpenAI's route.
//!
//! A model made with `PARAMETER num_ctx 64` keeps the context's end a few dozen tokens away,
//! so running into it is quick.

use crate::support;

use runner::engine::LoopConfig;
use serde_json::{Value, json};
use support::{MODEL, Server, post, post_sse, serial, server, start_server_configured};

/// The context of [`tiny_context`]'s model.
const TINY_CONTEXT: u64 = 64;

/// A prompt the model answers at length: it cannot finish before the context's end.
const LONG_ANSWER: &str = "Write a long story about a dragon who learns to fly.";

/// The name of a model made from [`MODEL`] with a context of [`TINY_CONTEXT`] tokens.
fn tiny_context(s: &Server) -> &'static str {
    let name = "smollm2-tiny-context:test";
    create(
        s,
        name,
        &format!("FROM {MODEL}\nPARAMETER num_ctx {TINY_CONTEXT}"),
    );
    name
}

fn create(s: &Server, name: &str, modelfile: &str) {
    let (status, reply) = post(
        s,
        "/api/create",
        json!({"model": name, "modelfile": modelfile, "stream": false}),
    );
    assert_eq!(status, 200, "{reply}");
}

fn count(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a count: {value}"))
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": LONG_ANSWER}], "temperature": 0})
}

/// No limit, or one past what the context leaves, ends where the context does, with the
/// length reason of the API it came through: never a refusal, never a run past the context.
#[test]
fn a_request_without_a_limit_stops_at_the_context_end_on_every_api() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let model = tiny_context(s);

    // Ollama: no `num_predict`, then one far past the context.
    for options in [
        json!({"temperature": 0}),
        json!({"temperature": 0, "num_predict": 5000}),
    ] {
        let (status, reply) = post(
            s,
            "/api/generate",
            json!({"model": model, "prompt": LONG_ANSWER, "stream": false, "options": options}),
        );
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["done_reason"], "length", "{reply}");
        let used = count(&reply["prompt_eval_count"])
            + count(&reply["prompt_cached_count"])
            + count(&reply["eval_count"]);
        assert_eq!(used, TINY_CONTEXT, "{reply}");
    }
    let mut body = chat(model);
    body["stream"] = json!(false);
    let (status, reply) = post(s, "/api/chat", body);
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["done_reason"], "length", "{reply}");

    // OpenAI's chat and text completions: none, and `max_tokens` past the context.
    for limit in [json!(null), json!(32000), json!(1e15)] {
        let mut body = chat(model);
        body["max_tokens"] = limit.clone();
        let (status, reply) = post(s, "/v1/chat/completions", body);
        assert_eq!(status, 200, "{limit}: {reply}");
        assert_eq!(reply["choices"][0]["finish_reason"], "length", "{reply}");
        assert_eq!(
            count(&reply["usage"]["total_tokens"]),
            TINY_CONTEXT,
            "{reply}"
        );

        let (status, reply) = post(
            s,
            "/v1/completions",
            json!({"model": model, "prompt": LONG_ANSWER, "temperature": 0, "max_tokens": limit}),
        );
        assert_eq!(status, 200, "{limit}: {reply}");
        assert_eq!(reply["choices"][0]["finish_reason"], "length", "{reply}");
        assert_eq!(
            count(&reply["usage"]["total_tokens"]),
            TINY_CONTEXT,
            "{reply}"
        );
    }
    let mut streamed = chat(model);
    streamed["stream"] = json!(true);
    let events = post_sse(s, "/v1/chat/completions", streamed);
    let finish = &events[events.len() - 2]["choices"][0]["finish_reason"];
    assert_eq!(finish, "length", "{events:?}");

    // Anthropic requires `max_tokens`; Claude Code sends 32,000.
    let (status, reply) = post(
        s,
        "/v1/messages",
        json!({"model": model, "max_tokens": 32000, "temperature": 0,
               "messages": [{"role": "user", "content": LONG_ANSWER}]}),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["stop_reason"], "max_tokens", "{reply}");
    let usage = &reply["usage"];
    let used = count(&usage["input_tokens"])
        + count(&usage["cache_read_input_tokens"])
        + count(&usage["output_tokens"]);
    assert_eq!(used, TINY_CONTEXT, "{reply}");

    // Responses: Codex sends no `max_output_tokens`.
    let (status, reply) = post(
        s,
        "/v1/responses",
        json!({"model": model, "input": LONG_ANSWER, "temperature": 0}),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["status"], "incomplete", "{reply}");
    assert_eq!(
        reply["incomplete_details"]["reason"], "max_output_tokens",
        "{reply}"
    );
    let used = count(&reply["usage"]["input_tokens"]) + count(&reply["usage"]["output_tokens"]);
    assert_eq!(used, TINY_CONTEXT, "{reply}");
}

/// A Modelfile's `num_predict` limits a request that names no limit of its own, on every API;
/// the request's own limit comes first.
#[test]
fn a_modelfile_num_predict_caps_requests_without_a_limit() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let model = "smollm2-short:test";
    create(s, model, &format!("FROM {MODEL}\nPARAMETER num_predict 5"));
    assert_limits(s, model, 5);
}

/// `MLXKIT_MAX_OUTPUT_TOKENS` (here set on the server's state as `serve` sets it from the
/// variable) limits a request that names none, below a Modelfile's `num_predict`.
#[test]
fn the_server_default_caps_requests_without_a_limit() {
    let Some(s) = start_server_configured(&[MODEL], LoopConfig::from_env(), |state| {
        state.with_max_output_tokens(Some(7))
    }) else {
        return;
    };
    let _serial = serial();
    assert_limits(&s, MODEL, 7);
    let model = "smollm2-short:test";
    create(&s, model, &format!("FROM {MODEL}\nPARAMETER num_predict 5"));
    assert_limits(&s, model, 5);
}

/// Requests to `model` that name no limit generate `limit` tokens (the prompt answers at
/// length) on each API; one that names 3 generates 3.
fn assert_limits(s: &Server, model: &str, limit: u64) {
    let (status, reply) = post(s, "/v1/chat/completions", chat(model));
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        count(&reply["usage"]["completion_tokens"]),
        limit,
        "{reply}"
    );
    assert_eq!(reply["choices"][0]["finish_reason"], "length", "{reply}");
    let mut asked = chat(model);
    asked["max_tokens"] = json!(3);
    let (_, reply) = post(s, "/v1/chat/completions", asked);
    assert_eq!(count(&reply["usage"]["completion_tokens"]), 3, "{reply}");

    let (status, reply) = post(
        s,
        "/api/generate",
        json!({"model": model, "prompt": LONG_ANSWER, "stream": false,
               "options": {"temperature": 0}}),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(count(&reply["eval_count"]), limit, "{reply}");
    assert_eq!(reply["done_reason"], "length", "{reply}");

    let (status, reply) = post(
        s,
        "/v1/responses",
        json!({"model": model, "input": LONG_ANSWER, "temperature": 0}),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(count(&reply["usage"]["output_tokens"]), limit, "{reply}");
    assert_eq!(reply["status"], "incomplete", "{reply}");
}

/// The first chunk of a streamed chat completion carries the role alone; no later chunk
/// carries it; the text follows in content deltas.
#[test]
fn the_first_chat_stream_chunk_is_role_only() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let mut body = chat(MODEL);
    body["max_tokens"] = json!(4);
    body["stream"] = json!(true);
    let events = post_sse(s, "/v1/chat/completions", body);
    let first = &events[0]["choices"][0];
    assert_eq!(first["index"], 0);
    assert_eq!(
        first["delta"],
        json!({"role": "assistant", "content": null}),
        "{events:?}"
    );
    assert_eq!(first["finish_reason"], Value::Null);
    let later = &events[1..events.len() - 1];
    assert!(
        later
            .iter()
            .all(|e| e["choices"][0]["delta"].get("role").is_none()),
        "{events:?}"
    );
    let text: String = later
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(!text.is_empty(), "{events:?}");
}

/// `n` choices: one per index, each its own sampling (seeded: they differ, and a rerun
/// repeats them), the prompt counted once in the usage, streamed choices interleaved by
/// index; `n` out of range is a 400 naming it.
#[test]
fn n_choices_run_together_and_count_the_prompt_once() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 8, "temperature": 1.5, "seed": 11, "n": 3,
    });
    let (status, reply) = post(s, "/v1/chat/completions", body.clone());
    assert_eq!(status, 200, "{reply}");
    let choices = reply["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{reply}");
    let texts: Vec<&str> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            assert_eq!(c["index"], i, "{reply}");
            c["message"]["content"].as_str().unwrap()
        })
        .collect();
    assert!(
        texts[0] != texts[1] || texts[1] != texts[2],
        "seeded choices should differ: {texts:?}"
    );
    let (_, again) = post(s, "/v1/chat/completions", body.clone());
    assert_eq!(again["choices"], reply["choices"], "a seeded rerun repeats");
    // Choice 0 draws with the request's seed: as a request for one choice does.
    let mut one = body.clone();
    one["n"] = json!(1);
    let (_, single) = post(s, "/v1/chat/completions", one);
    assert_eq!(
        single["choices"][0]["message"],
        reply["choices"][0]["message"]
    );
    let completion: u64 = choices
        .iter()
        .map(|c| if c["finish_reason"] == "length" { 8 } else { 0 })
        .sum();
    let usage = &reply["usage"];
    assert!(count(&usage["completion_tokens"]) >= completion, "{reply}");
    assert_eq!(
        count(&usage["prompt_tokens"]),
        count(&single["usage"]["prompt_tokens"]),
        "the prompt is counted once: {reply}"
    );
    assert_eq!(
        count(&usage["total_tokens"]),
        count(&usage["prompt_tokens"]) + count(&usage["completion_tokens"])
    );

    // Streamed: a role chunk per choice, then each choice's deltas, each finishing once.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = post_sse(s, "/v1/chat/completions", streamed);
    assert_eq!(events.last().unwrap(), "[DONE]");
    // The same tokens (what the prefix cache served may differ).
    let usage_event = &events[events.len() - 2]["usage"];
    for key in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(usage_event[key], reply["usage"][key], "{events:?}");
    }
    for (i, text) in texts.iter().enumerate() {
        let mine: Vec<&Value> = events
            .iter()
            .filter_map(|e| e["choices"].as_array()?.first())
            .filter(|c| c["index"] == i)
            .collect();
        assert_eq!(mine[0]["delta"]["role"], "assistant", "{mine:?}");
        let joined: String = mine
            .iter()
            .filter_map(|c| c["delta"]["content"].as_str())
            .collect();
        assert_eq!(&joined, text, "choice {i}");
        let finishes = mine
            .iter()
            .filter(|c| !c["finish_reason"].is_null())
            .count();
        assert_eq!(finishes, 1, "choice {i}: {mine:?}");
    }

    // Greedy choices are the same answer n times.
    let (status, greedy) = post(
        s,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4,
               "temperature": 0, "n": 2}),
    );
    assert_eq!(status, 200, "{greedy}");
    assert_eq!(greedy["choices"][1]["index"], 1, "{greedy}");
    assert_eq!(greedy["choices"][0]["text"], greedy["choices"][1]["text"]);
    assert_eq!(count(&greedy["usage"]["completion_tokens"]), 8, "{greedy}");
    let events = post_sse(
        s,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4,
               "temperature": 0, "n": 2, "stream": true}),
    );
    for i in 0..2 {
        let joined: String = events
            .iter()
            .filter_map(|e| e["choices"].as_array()?.first())
            .filter(|c| c["index"] == i)
            .filter_map(|c| c["text"].as_str())
            .collect();
        assert_eq!(joined, greedy["choices"][i]["text"].as_str().unwrap());
    }

    for n in [json!(0), json!(17), json!(2.5), json!("two")] {
        let mut bad = body.clone();
        bad["n"] = n.clone();
        let (status, reply) = post(s, "/v1/chat/completions", bad);
        assert_eq!(status, 400, "{n}: {reply}");
        assert_eq!(reply["error"]["type"], "invalid_request_error");
        assert!(
            reply["error"]["message"].as_str().unwrap().contains("`n`"),
            "{reply}"
        );
    }
}

/// OpenAI's embeddings refuse an input longer than the context, in OpenAI's error shape,
/// where they used to cut it silently; Ollama's cut it unless `truncate: false`.
#[test]
fn an_overlong_openai_embedding_input_is_refused() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let long = "word ".repeat(9000);
    let (status, reply) = post(
        s,
        "/v1/embeddings",
        json!({"model": MODEL, "input": ["short", long]}),
    );
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["error"]["type"], "invalid_request_error", "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("input 1") && message.contains("8192"),
        "{message}"
    );
    assert!(message.len() < 500, "{message}");
    let (status, reply) = post(
        s,
        "/api/embed",
        json!({"model": MODEL, "input": long, "truncate": false}),
    );
    assert_eq!(status, 400, "{reply}");
    assert!(
        reply["error"].as_str().unwrap().contains("truncate"),
        "{reply}"
    );
}
