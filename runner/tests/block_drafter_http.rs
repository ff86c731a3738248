//! A DFlash block drafter served as its target's draft over HTTP (issue 49): the tiny Llama
//! fixture imported with a byte-level tokenizer and the DFlash drafter drawn for it
//! (`nn/tests/fixtures/dflash`), paired by a Modelfile's `DRAFT` through `/api/create`. A
//! request that leaves the drafter to the server drafts blocks with it, answers as the target
//! alone does (greedy, and with logprobs), and says so in its statistics; a drafter that does
//! not fit is refused at create, naming what differs.
//!
//! No download: the fixtures are committed, so this runs everywhere.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use runner::engine::LoopConfig;
use serde_json::{Value, json};
use support::{Server, post, start_server_with};

const TARGET: &str = "tiny-llama:test";
const PAIRED: &str = "tiny-llama-dflash:test";
const DRAFT: &str = "tiny-llama-dflash-draft:test";

fn dflash() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/tests/fixtures/dflash")
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Option<Server>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            start_server_with(&[], LoopConfig::from_env(), |store| {
                support::import_tiny_fixture(store, "llama", TARGET)
            })
        })
        .as_ref()
        .expect("the tiny Llama needs no download")
}

fn create(model: &str, draft: &Path) -> (u16, Value) {
    post(
        server(),
        "/api/create",
        json!({
            "model": model,
            "modelfile": format!("FROM {TARGET}\nDRAFT {}", draft.display()),
            "stream": false,
        }),
    )
}

/// The target paired with the fixture's drafter, created once.
fn paired() -> &'static str {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let (status, response) = create(PAIRED, &dflash());
        assert_eq!(status, 200, "{response}");
    });
    PAIRED
}

fn generate(model: &str, format: Option<Value>) -> Value {
    let mut request = json!({
        "model": model,
        "prompt": "Write the first lines of a poem about the sea.",
        "stream": false,
        "logprobs": true,
        "top_logprobs": 2,
        "options": { "temperature": 0, "num_predict": 24 },
    });
    if let Some(format) = format {
        request["format"] = format;
    }
    let (status, reply) = post(server(), "/api/generate", request);
    assert_eq!(status, 200, "{reply}");
    reply
}

#[test]
fn the_block_drafter_drafts_by_default_and_the_answer_is_the_targets() {
    answers_as_the_target(None);
}

/// The same under a JSON schema: verification applies the grammar, drafts stay free.
#[test]
fn schema_constrained_block_drafting_answers_as_the_target() {
    answers_as_the_target(Some(json!({
        "type": "object",
        "properties": { "line": { "type": "string" } },
        "required": ["line"],
    })));
}

fn answers_as_the_target(format: Option<Value>) {
    let model = paired();
    let alone = generate(TARGET, format.clone());
    let drafted = generate(model, format);
    assert_eq!(drafted["response"], alone["response"], "{drafted}");
    let stats = &drafted["speculation"];
    assert_eq!(stats["drafter"], DRAFT, "{drafted}");
    let rounds = stats["rounds"].as_u64().unwrap_or(0);
    assert!(rounds > 0, "{drafted}");
    assert!(
        stats["drafted"].as_u64().unwrap_or(0) <= 3 * rounds,
        "{drafted}"
    );
    let entries = |reply: &Value| reply["logprobs"].as_array().cloned().unwrap_or_default();
    for (a, b) in entries(&drafted).iter().zip(&entries(&alone)) {
        assert_eq!(a["token"], b["token"]);
        let (x, y) = (
            a["logprob"].as_f64().unwrap(),
            b["logprob"].as_f64().unwrap(),
        );
        assert!((x - y).abs() <= 1e-4, "{a} against {b}");
    }
    let (status, show) = post(server(), "/api/show", json!({ "model": DRAFT }));
    assert_eq!(status, 200, "{show}");
    assert_eq!(show["details"]["family"], "dflash", "{show}");
    assert_eq!(show["capabilities"], json!(["drafting"]), "{show}");
}

#[test]
fn a_block_drafter_that_does_not_fit_is_refused_at_create() {
    let folder = tempfile::tempdir().unwrap();
    std::fs::copy(
        dflash().join("model.safetensors"),
        folder.path().join("model.safetensors"),
    )
    .unwrap();
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(dflash().join("config.json")).unwrap()).unwrap();
    config["dflash_config"]["target_layer_ids"] = json!([0, 7]);
    std::fs::write(folder.path().join("config.json"), config.to_string()).unwrap();
    let (status, response) = create("tiny-llama-misfit:test", folder.path());
    assert_eq!(status, 400, "{response}");
    let error = response["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("layer 7, and the target has 2"),
        "{response}"
    );
}
