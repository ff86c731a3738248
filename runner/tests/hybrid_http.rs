//! A hybrid model (gated delta nets beside attention) served over HTTP: the tiny Qwen3.5
//! fixture from `nn/tests/fixtures`, imported with a byte-level tokenizer and a ChatML
//! template, driven as a chat client would. Its recurrent layers restore only where a snapshot
//! was taken; the conversations below must still evaluate only what each request adds.
//!
//! No download: the fixture is committed, so this runs everywhere.

use crate::support;

use std::sync::OnceLock;

use runner::engine::LoopConfig;
use serde_json::{Value, json};
use support::{Server, post, start_server_with};

const MODEL: &str = "tiny-hybrid:test";

const TEMPLATE: &str = support::CHATML;

fn server() -> &'static Server {
    static SERVER: OnceLock<Option<Server>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            start_server_with(&[], LoopConfig::from_env(), |store| {
                support::import_tiny_fixture(store, "qwen3_5", MODEL)
            })
        })
        .as_ref()
        .expect("the tiny hybrid needs no download")
}

/// A greedy chat turn; returns the reply and the final object.
fn chat(messages: &[Value]) -> (String, Value) {
    let (status, reply) = post(
        server(),
        "/api/chat",
        json!({
            "model": MODEL,
            "messages": messages,
            "stream": false,
            "options": { "temperature": 0, "num_predict": 6 },
        }),
    );
    assert_eq!(status, 200, "{reply}");
    let text = reply["message"]["content"].as_str().unwrap().to_string();
    (text, reply)
}

fn evaluated(reply: &Value) -> u64 {
    reply["prompt_eval_count"].as_u64().unwrap()
}

fn cached(reply: &Value) -> u64 {
    reply["prompt_cached_count"].as_u64().unwrap()
}

fn message(role: &str, content: &str) -> Value {
    json!({ "role": role, "content": content })
}

/// Two conversations sharing a long system prompt, alternating A, B, A, B, then each one's
/// next turn: only what a request adds is evaluated, and a repeat answers as the first time.
#[test]
fn alternating_conversations_evaluate_only_what_they_add() {
    let system = message(
        "system",
        "You are a careful assistant. Answer briefly, cite the passage you rely on, and say \
         so when the passage does not contain the answer.",
    );
    let a = [
        system.clone(),
        message("user", "What does the passage say about rivers?"),
    ];
    let b = [
        system.clone(),
        message("user", "Summarise the second paragraph."),
    ];

    let (reply_a, first_a) = chat(&a);
    let (reply_b, first_b) = chat(&b);
    // B shares the system turn with A: the user message and what follows are new.
    let system_tokens = cached(&first_b);
    assert!(system_tokens > 100, "{first_b}");
    assert!(evaluated(&first_b) < 60, "{first_b}");

    for _ in 0..2 {
        for (messages, first, reply) in [(&a, &first_a, &reply_a), (&b, &first_b, &reply_b)] {
            let (again, response) = chat(messages);
            assert_eq!(&again, reply, "a repeat answers as before");
            assert_eq!(evaluated(&response), 1, "{response}");
            assert_eq!(
                cached(&response) + 1,
                evaluated(first) + cached(first),
                "{response}"
            );
        }
    }

    // The next turn of A: its reply and the new message are new, nothing before them.
    let next = [
        a[0].clone(),
        a[1].clone(),
        message("assistant", &reply_a),
        message("user", "And about lakes?"),
    ];
    let (_, response) = chat(&next);
    let prompt_a = evaluated(&first_a) + cached(&first_a);
    assert!(
        cached(&response) >= prompt_a,
        "the whole first turn is reused: {response}"
    );
    assert!(evaluated(&response) < 60, "{response}");
}

/// A hybrid speculates like any model (its recurrent layers roll back through captures taken
/// inside each round): with a layer-skip draft the answer is the plain one.
#[test]
fn a_speculating_hybrid_answers_as_without_speculation() {
    let generate = |options: Value| {
        let (status, reply) = post(
            server(),
            "/api/generate",
            json!({
                "model": MODEL,
                "prompt": "copy this: abc abc abc abc",
                "stream": false,
                "options": options,
            }),
        );
        assert_eq!(status, 200, "{reply}");
        reply
    };
    let plain = generate(json!({ "temperature": 0, "num_predict": 12 }));
    let drafted = generate(json!({ "temperature": 0, "num_predict": 12, "draft": "self:1" }));
    assert_eq!(drafted["response"], plain["response"], "{drafted}");
    assert_eq!(drafted["eval_count"], 12, "{drafted}");
    assert!(
        drafted["speculation"]["rounds"].as_u64() > Some(0),
        "{drafted}"
    );
}

/// `show` reports what the model can be asked to do, from its chat template: this one renders
/// no tools (they still reach it, written into the system turn, so `tools` is listed) and no
/// reasoning; a copy created with a template that renders both, offers both.
#[test]
fn show_reports_capabilities_from_the_template() {
    let (status, show) = post(server(), "/api/show", json!({ "model": MODEL }));
    assert_eq!(status, 200, "{show}");
    assert_eq!(
        show["capabilities"],
        json!(["completion", "tools"]),
        "{show}"
    );
    assert_eq!(show["details"]["family"], "qwen3_5_text");

    let template =
        format!("{{% if tools %}}{{{{ tools | tojson }}}}{{% endif %}}<think>{TEMPLATE}");
    let (status, reply) = post(
        server(),
        "/api/create",
        json!({ "model": "tiny-hybrid:tools", "from": MODEL, "template": template, "stream": false }),
    );
    assert_eq!(status, 200, "{reply}");
    let (_, show) = post(
        server(),
        "/api/show",
        json!({ "model": "tiny-hybrid:tools" }),
    );
    assert_eq!(
        show["capabilities"],
        json!(["completion", "tools", "thinking"]),
        "{show}"
    );
}
