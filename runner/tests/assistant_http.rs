//! A Gemma 4 assistant served as its target's draft over HTTP (issue 49): the tiny Gemma 4
//! fixture from `nn/tests/fixtures`, imported with a byte-level tokenizer and a ChatML
//! template, and the assistant drawn for it (`gemma4_assistant`), paired by a Modelfile's
//! `DRAFT` through `/api/create` as a user pairs them. A request that leaves the drafter to
//! the server drafts with the assistant, answers as the target alone does, and says so in its
//! statistics (Ollama's final object, OpenAI's `usage`); an assistant that does not fit its
//! target is refused at create, naming what differs; the assistant alone serves nothing.
//!
//! No download: the fixtures are committed, so this runs everywhere.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use runner::engine::LoopConfig;
use serde_json::{Value, json};
use support::{Server, post, start_server_with};

const TARGET: &str = "tiny-gemma4:test";
const PAIRED: &str = "tiny-gemma4-assisted:test";
const DRAFT: &str = "tiny-gemma4-assisted-draft:test";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/tests/fixtures")
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Option<Server>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            start_server_with(&[], LoopConfig::from_env(), |store| {
                support::import_tiny_fixture(store, "gemma4", TARGET)
            })
        })
        .as_ref()
        .expect("the tiny Gemma 4 needs no download")
}

fn create(model: &str, modelfile: String) -> (u16, Value) {
    post(
        server(),
        "/api/create",
        json!({ "model": model, "modelfile": modelfile, "stream": false }),
    )
}

/// The target paired with the fixture's assistant, created once.
fn paired() -> &'static str {
    static PAIRED_ONCE: OnceLock<()> = OnceLock::new();
    PAIRED_ONCE.get_or_init(|| {
        let draft = fixtures().join("gemma4_assistant");
        let (status, response) =
            create(PAIRED, format!("FROM {TARGET}\nDRAFT {}", draft.display()));
        assert_eq!(status, 200, "{response}");
    });
    PAIRED
}

fn generate(model: &str, options: Value) -> Value {
    let (status, reply) = post(
        server(),
        "/api/generate",
        json!({
            "model": model,
            "prompt": "Name three rivers of Europe and say which is longest.",
            "stream": false,
            "options": options,
        }),
    );
    assert_eq!(status, 200, "{reply}");
    reply
}

#[test]
fn the_assistant_drafts_by_default_and_the_answer_is_the_targets() {
    let model = paired();
    let options = json!({ "temperature": 0, "num_predict": 24 });
    let alone = generate(TARGET, options.clone());
    let drafted = generate(model, options);
    assert_eq!(drafted["response"], alone["response"], "{drafted}");
    let stats = &drafted["speculation"];
    assert_eq!(stats["drafter"], DRAFT, "{drafted}");
    assert!(stats["rounds"].as_u64() > Some(0), "{drafted}");
    assert!(stats["drafted"].as_u64() > Some(0), "{drafted}");

    // OpenAI's chat completions: the same pairing, its statistics in `usage`.
    let (status, chat) = post(
        server(),
        "/v1/chat/completions",
        json!({
            "model": model,
            "messages": [{ "role": "user", "content": "Count from one to five." }],
            "temperature": 0,
            "max_tokens": 16,
        }),
    );
    assert_eq!(status, 200, "{chat}");
    let (status, plain) = post(
        server(),
        "/v1/chat/completions",
        json!({
            "model": TARGET,
            "messages": [{ "role": "user", "content": "Count from one to five." }],
            "temperature": 0,
            "max_tokens": 16,
        }),
    );
    assert_eq!(status, 200, "{plain}");
    assert_eq!(
        chat["choices"][0]["message"]["content"],
        plain["choices"][0]["message"]["content"]
    );
    assert_eq!(chat["usage"]["speculation"]["drafter"], DRAFT, "{chat}");
}

#[test]
fn an_assistant_that_does_not_fit_is_refused_at_create() {
    let folder = tempfile::tempdir().unwrap();
    let source = fixtures().join("gemma4_assistant");
    std::fs::copy(
        source.join("model.safetensors"),
        folder.path().join("model.safetensors"),
    )
    .unwrap();
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(source.join("config.json")).unwrap()).unwrap();
    config["backbone_hidden_size"] = 96.into();
    std::fs::write(folder.path().join("config.json"), config.to_string()).unwrap();
    let (status, response) = create(
        "tiny-gemma4-misfit:test",
        format!("FROM {TARGET}\nDRAFT {}", folder.path().display()),
    );
    assert_eq!(status, 400, "{response}");
    let error = response["error"].as_str().unwrap_or_default();
    assert!(error.contains("`hidden_size` of 96"), "{response}");
    let (_, tags) = support::get(server(), "/api/tags");
    let names: Vec<&str> = tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert!(
        !names.iter().any(|n| n.starts_with("tiny-gemma4-misfit")),
        "{names:?}"
    );
}

#[test]
fn the_assistant_alone_serves_nothing() {
    paired();
    let (status, reply) = post(
        server(),
        "/api/generate",
        json!({ "model": DRAFT, "prompt": "hello", "stream": false }),
    );
    assert_eq!(status, 400, "{reply}");
    let error = reply["error"].as_str().unwrap_or_default();
    assert!(error.contains("is a drafter"), "{reply}");
    let (status, show) = post(server(), "/api/show", json!({ "model": DRAFT }));
    assert_eq!(status, 200, "{show}");
    assert_eq!(show["capabilities"], json!(["drafting"]), "{show}");
    assert_eq!(show["details"]["family"], "gemma4_assistant", "{show}");
}

/// `quantize_draft` quantizes the assistant as it is stored (`--quantize-draft`): it still
/// fits, drafts, and the answer is still the target's.
#[test]
fn a_quantized_assistant_drafts_and_the_answer_is_the_targets() {
    let draft = fixtures().join("gemma4_assistant");
    let (status, response) = post(
        server(),
        "/api/create",
        json!({
            "model": "tiny-gemma4-q8:test",
            "modelfile": format!("FROM {TARGET}\nDRAFT {}", draft.display()),
            "quantize_draft": "int8",
            "stream": false,
        }),
    );
    assert_eq!(status, 200, "{response}");
    let (status, show) = post(
        server(),
        "/api/show",
        json!({ "model": "tiny-gemma4-q8-draft:test" }),
    );
    assert_eq!(status, 200, "{show}");
    assert_eq!(show["details"]["quantization_level"], "int8", "{show}");
    let options = json!({ "temperature": 0, "num_predict": 24 });
    let alone = generate(TARGET, options.clone());
    let drafted = generate("tiny-gemma4-q8:test", options);
    assert_eq!(drafted["response"], alone["response"], "{drafted}");
    assert_eq!(
        drafted["speculation"]["drafter"], "tiny-gemma4-q8-draft:test",
        "{drafted}"
    );
}

/// With a JSON schema and logprobs, drafting with the assistant answers as the target alone:
/// the same tokens, each with the same log-probability (to 1e-4: verification scores several
/// positions in one forward, whose sums may round differently) and the same alternatives.
#[test]
fn schema_constrained_answers_and_logprobs_are_the_targets() {
    let model = paired();
    let schema = json!({
        "type": "object",
        "properties": { "river": { "type": "string" }, "km": { "type": "integer" } },
        "required": ["river", "km"],
    });
    let ask = |model: &str| {
        let (status, reply) = post(
            server(),
            "/api/generate",
            json!({
                "model": model,
                "prompt": "The longest river of Europe, as JSON.",
                "format": schema,
                "stream": false,
                "logprobs": true,
                "top_logprobs": 2,
                "options": { "temperature": 0, "num_predict": 24 },
            }),
        );
        assert_eq!(status, 200, "{reply}");
        reply
    };
    let alone = ask(TARGET);
    let drafted = ask(model);
    assert_eq!(drafted["response"], alone["response"], "{drafted}");
    assert_eq!(drafted["speculation"]["drafter"], DRAFT, "{drafted}");
    let entries = |reply: &Value| reply["logprobs"].as_array().cloned().unwrap_or_default();
    let (ours, theirs) = (entries(&drafted), entries(&alone));
    assert_eq!(ours.len(), theirs.len(), "{drafted}");
    assert!(!ours.is_empty(), "{drafted}");
    for (a, b) in ours.iter().zip(&theirs) {
        assert_eq!(a["token"], b["token"]);
        let (x, y) = (
            a["logprob"].as_f64().unwrap(),
            b["logprob"].as_f64().unwrap(),
        );
        assert!((x - y).abs() <= 1e-4, "{a} against {b}");
        let tops = |e: &Value| -> Vec<Value> {
            e["top_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["token"].clone())
                .collect()
        };
        assert_eq!(tops(a), tops(b));
    }
}
