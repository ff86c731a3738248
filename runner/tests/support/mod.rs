//! The end-to-end harness the server tests share: one real server per test binary on a
//! loopback port with `smollm2:135m`, and blocking HTTP helpers.
//!
//! The model is fetched through the project's own pull path into the per-user cache. When it
//! cannot be fetched the tests fail loudly under `CI`, and are skipped with a notice otherwise.

#![allow(dead_code)] // Each test binary uses its own subset.

pub mod cache;
pub mod served;

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use runner::engine::{Engine, LoopConfig};
use runner::model_keeper::{ModelKeeper, ResidentLimits};
use runner::model_name::ModelName;
use runner::server::{AppState, router};
use runner::store::Store;
use serde_json::{Value, json};

pub const MODEL: &str = "smollm2:135m";

/// A 1×1 PNG.
pub const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

pub struct Server {
    pub base: String,
    _runtime: tokio::runtime::Runtime,
    _home: tempfile::TempDir,
}

/// The shared server, or `None` (after a notice) when the model cannot be fetched outside CI.
pub fn server() -> Option<&'static Server> {
    static SERVER: OnceLock<Option<Server>> = OnceLock::new();
    SERVER.get_or_init(start).as_ref()
}

/// Tests run one at a time: they share one engine, and the cancellation test reads the
/// prefix cache's state.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn start() -> Option<Server> {
    start_server(&[MODEL], LoopConfig::from_env())
}

/// A server of its own with `models` pulled, serving them with `config`; `None` (after a
/// notice) when a model cannot be fetched outside CI.
pub fn start_server(models: &[&str], config: LoopConfig) -> Option<Server> {
    start_server_with(models, config, |_| {})
}

/// Like [`start_server`], with `prepare` run on the store once the models are pulled (to
/// create models from them) and before the server starts.
pub fn start_server_with(
    models: &[&str],
    config: LoopConfig,
    prepare: impl FnOnce(&Store),
) -> Option<Server> {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open(home.path().to_path_buf()).unwrap();
    start_server_in(home, store, models, config, prepare)
}

/// Like [`start_server`], its state set up by `configure` (a default output limit, say).
pub fn start_server_configured(
    models: &[&str],
    config: LoopConfig,
    configure: impl FnOnce(AppState) -> AppState,
) -> Option<Server> {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open(home.path().to_path_buf()).unwrap();
    serve_in(
        home,
        store,
        models,
        config,
        |_| {},
        configure,
        ResidentLimits::from_env(),
    )
}

/// Like [`start_server_with`], over `store` (kept in `home`, which the server owns).
pub fn start_server_in(
    home: tempfile::TempDir,
    store: Store,
    models: &[&str],
    config: LoopConfig,
    prepare: impl FnOnce(&Store),
) -> Option<Server> {
    serve_in(
        home,
        store,
        models,
        config,
        prepare,
        |state| state,
        ResidentLimits::from_env(),
    )
}

/// Like [`start_server_with`], its models resident within `limits`.
pub fn start_server_resident(
    models: &[&str],
    limits: ResidentLimits,
    prepare: impl FnOnce(&Store),
) -> Option<Server> {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open(home.path().to_path_buf()).unwrap();
    let config = LoopConfig::from_env();
    serve_in(home, store, models, config, prepare, |state| state, limits)
}

fn serve_in(
    home: tempfile::TempDir,
    store: Store,
    models: &[&str],
    config: LoopConfig,
    prepare: impl FnOnce(&Store),
    configure: impl FnOnce(AppState) -> AppState,
    limits: ResidentLimits,
) -> Option<Server> {
    remove_at_exit(home.path());
    if !models.iter().all(|model| pulled(&store, model)) {
        return None;
    }
    prepare(&store);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let base = runtime.block_on(async {
        let engine = Arc::new(Engine::with_config(config).unwrap());
        let keeper = ModelKeeper::with_limits(engine, store.clone(), 16, None, limits);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = router(configure(AppState::new(store, keeper)));
        tokio::spawn(async move {
            runner::server::listen::serve(listener, app, std::future::pending())
                .await
                .unwrap();
        });
        format!("http://{addr}")
    });
    Some(Server {
        base,
        _runtime: runtime,
        _home: home,
    })
}

/// Folders removed and child processes ended when the test process exits.
static DIRS: Mutex<Vec<std::path::PathBuf>> = Mutex::new(Vec::new());
static CHILDREN: Mutex<Vec<std::process::Child>> = Mutex::new(Vec::new());

/// Removes `dir` when the test process exits. A binary's shared server lives in a `static`,
/// which Rust never drops, so its home (a pulled model, hundreds of MB) would outlive every run
/// and fill the disk; a server that is dropped removes its home itself, and this is then a
/// no-op.
pub fn remove_at_exit(dir: &std::path::Path) {
    register_exit_hook();
    DIRS.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(dir.to_path_buf());
}

/// Ends `child` when the test process exits (a server process a `static` holds, which Rust
/// never drops), before the folders are removed.
pub fn kill_at_exit(child: std::process::Child) {
    register_exit_hook();
    CHILDREN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(child);
}

#[allow(unsafe_code)] // registering an exit hook is a call into the C library
fn register_exit_hook() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    extern "C" fn at_exit() {
        let mut children = CHILDREN.lock().unwrap_or_else(|e| e.into_inner());
        for child in children.iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let dirs = DIRS.lock().unwrap_or_else(|e| e.into_inner());
        for dir in dirs.iter() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    unsafe extern "C" {
        /// The C library's exit hook; the test harness leaves through `exit` both when every
        /// test passed and when one failed.
        fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
    }
    // SAFETY: `at_exit` is a plain function that never unwinds, as `atexit` requires.
    REGISTERED.call_once(|| unsafe {
        atexit(at_exit);
    });
}

/// A store in `home` holding `model` (pulled through the project's own path), or `None` (after
/// a notice) when it cannot be fetched outside CI.
pub fn store_with(home: &std::path::Path, model: &str) -> Option<Store> {
    let store = Store::open(home.to_path_buf()).unwrap();
    pulled(&store, model).then_some(store)
}

/// Whether `model` is in `store`, pulled through the project's own path now if it was not; a
/// failure panics when `CI` is set, and is a notice (the caller skips) otherwise.
/// Whether `model` is in the store at `home`, pulled there now if need be (see [`pulled`]).
pub fn pulled_into(home: &std::path::Path, model: &str) -> bool {
    pulled(&Store::open(home.to_path_buf()).unwrap(), model)
}

fn pulled(store: &Store, model: &str) -> bool {
    let name = ModelName::parse(model).unwrap();
    match runner::pull::pull(store, &name, &mut |_| {}) {
        Ok(_) => true,
        Err(e) if std::env::var_os("CI").is_some() => {
            panic!("CI is set and {model} could not be pulled: {e}")
        }
        Err(e) => {
            eprintln!("skipping: {model} could not be pulled ({e})");
            false
        }
    }
}

pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .unwrap()
}

pub fn post(s: &Server, path: &str, body: Value) -> (u16, Value) {
    let r = client()
        .post(format!("{}{path}", s.base))
        .json(&body)
        .send()
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

pub fn get(s: &Server, path: &str) -> (u16, Value) {
    let r = client().get(format!("{}{path}", s.base)).send().unwrap();
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(Value::Null))
}

/// `/api/ps` once the loaded model runs no sequence. The engine publishes its status after
/// the step in which a request ended, while the request's answer leaves inside that step, so
/// a client reading `/api/ps` at once may still see the request running; this waits (at most
/// about ten seconds) for the step to finish.
pub fn ps_when_idle(s: &Server) -> Value {
    let mut ps = Value::Null;
    for _ in 0..400 {
        ps = get(s, "/api/ps").1;
        if ps["models"][0]["running_sequences"].as_u64() == Some(0) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    ps
}

/// Posts `body` and checks for a 200 before the body is read.
fn post_ok(s: &Server, path: &str, body: Value) -> reqwest::blocking::Response {
    let r = client()
        .post(format!("{}{path}", s.base))
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    r
}

/// NDJSON lines of a streamed Ollama response.
pub fn post_ndjson(s: &Server, path: &str, body: Value) -> Vec<Value> {
    post_ok(s, path, body)
        .text()
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `data:` payloads of a streamed OpenAI response (`[DONE]` kept as a string).
pub fn post_sse(s: &Server, path: &str, body: Value) -> Vec<Value> {
    let r = post_ok(s, path, body);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    r.text()
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap_or(Value::String(d.to_string())))
        .collect()
}

/// Replaces values that change from run to run with placeholders.
pub fn redact(value: &Value) -> Value {
    const VOLATILE: &[&str] = &[
        "created_at",
        "created",
        "modified_at",
        "expires_at",
        "total_duration",
        "load_duration",
        "prompt_eval_duration",
        "eval_duration",
        "id",
        "digest",
        "size",
        // Measured at load: the dtype a device computes in decides it.
        "weights_bytes",
        "system_fingerprint",
        "response",
        "content",
        "text",
        "token",
        "bytes",
        "logprob",
        "arguments",
        "reasoning_content",
        "thinking",
        "version",
        // What the prefix cache holds depends on which tests ran before.
        "prompt_eval_count",
        "prompt_cached_count",
        "cached_tokens",
        "prefix_cache_bytes",
        "prefix_cache_budget",
        "prefix_cache_nodes",
        "prefilled_tokens",
        "input_tokens",
        "cache_read_input_tokens",
    ];
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let scalar = !v.is_null() && !v.is_object() && !v.is_array();
                    let v = if VOLATILE.contains(&k.as_str()) && (scalar || k == "bytes") {
                        json!(format!("[{k}]"))
                    } else {
                        redact(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redact).collect()),
        other => other.clone(),
    }
}

/// GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for
/// characters from U+0100 on. Tiny fixtures get a tokenizer of one token per byte.
#[allow(dead_code)]
pub fn byte_characters() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap()
            }
        })
        .collect()
}

/// An added special token of a `tokenizer.json`.
#[allow(dead_code)]
pub fn special_token(id: u32, content: &str) -> Value {
    json!({ "id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true })
}

/// A byte-level BPE `tokenizer.json` with no merges: `vocab` maps each byte's character (and
/// any other plain token) to its id, `added` lists the special tokens.
#[allow(dead_code)]
pub fn byte_level_tokenizer(vocab: serde_json::Map<String, Value>, added: Vec<Value>) -> Value {
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": { "type": "ByteLevel", "add_prefix_space": false,
                           "trim_offsets": true, "use_regex": true },
        "post_processor": null,
        "decoder": { "type": "ByteLevel", "add_prefix_space": false,
                     "trim_offsets": true, "use_regex": true },
        "model": { "type": "BPE", "dropout": null, "unk_token": null,
                   "continuing_subword_prefix": null, "end_of_word_suffix": null,
                   "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                   "vocab": vocab, "merges": [] }
    })
}

/// The vocabulary of a tiny fixture's test tokenizer: one token per byte (GPT-2's
/// byte-to-character table, no merges) from `first_byte` on, the fixture's `specials` at the
/// ids its config names, and the other ids below `size` filled with unused specials, so every
/// id the model can produce decodes.
pub struct ByteVocabulary {
    /// Where the 256 bytes start.
    pub first_byte: u32,
    /// Special tokens and their ids.
    pub specials: &'static [(u32, &'static str)],
    /// The model's vocabulary size.
    pub size: u32,
}

impl ByteVocabulary {
    /// A folder with the fixture's files (`source`) and this tokenizer, whose
    /// `tokenizer_config.json` names `bos` and `eos` and holds `template`.
    pub fn tokenizer_folder(
        &self,
        source: &std::path::Path,
        template: &str,
        bos: &str,
        eos: &str,
    ) -> tempfile::TempDir {
        let folder = tempfile::tempdir().unwrap();
        for file in ["config.json", "generation_config.json", "model.safetensors"] {
            std::fs::copy(source.join(file), folder.path().join(file)).unwrap();
        }
        // The specials below the bytes are in the model's vocabulary too, or the tokenizer
        // would renumber them past it.
        let vocab: serde_json::Map<String, Value> = byte_characters()
            .into_iter()
            .enumerate()
            .map(|(byte, c)| (c.to_string(), json!(byte as u32 + self.first_byte)))
            .chain(
                self.specials
                    .iter()
                    .filter(|&&(id, _)| id < self.first_byte)
                    .map(|&(id, text)| (text.to_string(), json!(id))),
            )
            .collect();
        let bytes = self.first_byte..self.first_byte + 256;
        let added: Vec<Value> = (0..self.size)
            .filter(|id| !bytes.contains(id))
            .map(|id| match self.specials.iter().find(|&&(i, _)| i == id) {
                Some(&(_, text)) => special_token(id, text),
                None => special_token(id, &format!("<unused{id}>")),
            })
            .collect();
        let tokenizer = byte_level_tokenizer(vocab, added);
        std::fs::write(folder.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
        let config = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": bos,
            "eos_token": eos,
            "add_bos_token": false,
            "chat_template": template,
        });
        std::fs::write(
            folder.path().join("tokenizer_config.json"),
            config.to_string(),
        )
        .unwrap();
        folder
    }

    /// The ids of `text` under this tokenizer: specials by name (the unused fillers too),
    /// every other byte alone.
    pub fn ids(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut rest = text;
        'outer: while !rest.is_empty() {
            for &(id, special) in self.specials {
                if let Some(after) = rest.strip_prefix(special) {
                    out.push(id);
                    rest = after;
                    continue 'outer;
                }
            }
            if let Some((id, after)) = self.unused_special(rest) {
                out.push(id);
                rest = after;
                continue;
            }
            let c = rest.chars().next().unwrap();
            let mut buf = [0u8; 4];
            out.extend(
                c.encode_utf8(&mut buf)
                    .bytes()
                    .map(|b| u32::from(b) + self.first_byte),
            );
            rest = &rest[c.len_utf8()..];
        }
        out
    }
}

impl ByteVocabulary {
    /// `<unusedN>` at the start of `text`, when N is one of the filler ids.
    fn unused_special<'t>(&self, text: &'t str) -> Option<(u32, &'t str)> {
        let (digits, after) = text.strip_prefix("<unused")?.split_once('>')?;
        let id: u32 = digits.parse().ok()?;
        let filler = id < self.size
            && !(self.first_byte..self.first_byte + 256).contains(&id)
            && self.specials.iter().all(|&(i, _)| i != id)
            && digits == id.to_string();
        filler.then_some((id, after))
    }
}

/// A PNG of `width`×`height` whose colours follow `seed`.
pub fn png(width: u32, height: u32, seed: u8) -> Vec<u8> {
    let image = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([
            (x as u8).wrapping_mul(37).wrapping_add(seed),
            (y as u8)
                .wrapping_mul(59)
                .wrapping_add(seed.wrapping_mul(3)),
            ((x + y) as u8).wrapping_mul(11) ^ seed,
        ])
    });
    let mut bytes = Vec::new();
    image
        .write_to(
            &mut std::io::Cursor::new(&mut bytes),
            image::ImageFormat::Png,
        )
        .unwrap();
    bytes
}

/// Standard base64, as Ollama's `images` and data URLs carry images.
pub fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Asserts that the first token's top-5 logprobs in `reply` (an `/api/generate` answer with
/// `top_logprobs: 5`) are within 1e-4 of `direct`'s: the distribution a model computed
/// directly, not only its argmax. Returns how far apart they are.
pub fn assert_first_logprobs(reply: &Value, direct: &[f32]) -> f32 {
    assert_top_logprobs(&reply["logprobs"][0]["top_logprobs"], direct, reply)
}

/// Asserts that `top` (a served token's top-5 alternatives, each with a `logprob`) is within
/// 1e-4 of `direct`; `reply` is shown on failure. Returns how far apart they are.
pub fn assert_top_logprobs(top: &Value, direct: &[f32], reply: &Value) -> f32 {
    let served: Vec<f32> = top
        .as_array()
        .unwrap_or_else(|| panic!("no logprobs: {reply}"))
        .iter()
        .map(|t| t["logprob"].as_f64().unwrap() as f32)
        .collect();
    let worst = served
        .iter()
        .zip(direct)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    eprintln!("first token's top logprobs: served {served:?}, direct {direct:?}, {worst:e} apart");
    assert!(served.len() == 5 && worst < 1e-4, "{worst:e}: {reply}");
    worst
}

/// ChatML, as Qwen models write it: the template the tiny fixtures are imported with.
#[allow(dead_code)]
pub const CHATML: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n\
{{ message.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Imports the tiny fixture `nn/tests/fixtures/<fixture>` as `name`, with a tokenizer whose
/// ids fit its 512-row vocabulary (one token per byte, ChatML's specials after them) and the
/// ChatML template.
#[allow(dead_code)]
pub fn import_tiny_fixture(store: &Store, fixture: &str, name: &str) {
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nn/tests/fixtures")
        .join(fixture);
    let folder = tempfile::tempdir().unwrap();
    for file in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(source.join(file), folder.path().join(file)).unwrap();
    }
    let vocab: serde_json::Map<String, Value> = byte_characters()
        .into_iter()
        .enumerate()
        .map(|(id, c)| (c.to_string(), json!(id)))
        .collect();
    let added = vec![
        special_token(256, "<|endoftext|>"),
        special_token(257, "<|im_start|>"),
        special_token(258, "<|im_end|>"),
    ];
    let tokenizer = byte_level_tokenizer(vocab, added);
    std::fs::write(folder.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "add_bos_token": false,
        "chat_template": CHATML,
    });
    std::fs::write(
        folder.path().join("tokenizer_config.json"),
        config.to_string(),
    )
    .unwrap();
    let name = ModelName::parse(name).unwrap();
    runner::import::import_path(store, &name, folder.path(), "test", &mut |_, _, _| {}).unwrap();
}
