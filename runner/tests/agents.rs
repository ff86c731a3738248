//! The coding agents people run against a local server — Claude Code, the Codex CLI, aider —
//! in their current releases, against `mlxkit serve` (issue 48). They are installed once,
//! pinned, into the per-user cache (`agents/install.rs`); under `CI` a missing `npm` or
//! package index fails these tests, elsewhere it skips them with a notice.
//!
//! The catalog model each agent gets follows from what it sends, not from what a tiny model
//! answers: Claude Code's first request is 12,100 tokens on SmolLM2's vocabulary (24 tools, a
//! 7 KB system prompt) and Codex's 13,947, both past `smollm2:135m`'s trained 8,192. Hosted
//! names (`claude-opus-…`, `gpt-…`) are stored nowhere, so they reach the server's default
//! model, `agent-smollm2`: SmolLM2 with a Modelfile that serves 16,384 tokens (`num_ctx`; the
//! loader stretches its rotary embedding 2x by YaRN, past which it only wrote `#` lines) and
//! decodes greedily (`temperature 0`: neither agent sends a temperature, and a sampled 135M
//! model at 12k tokens may write until the context's end). `gemma3:270m`, trained to 32,768,
//! is a base model that never ends a reply. aider gets `smollm2:135m`, whose context it must
//! report.
use crate::support;

mod install;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::json;
use support::cache::required;
use support::served::{Served, mlxkit};

/// The model hosted names fall back to (see the module's comment).
const AGENT_MODEL: &str = "agent-smollm2";

/// `AGENT_MODEL`'s Modelfile.
const AGENT_MODELFILE: &str =
    "FROM smollm2:135m\nPARAMETER num_ctx 16384\nPARAMETER temperature 0\n";

/// The longest an agent may take for its turn, start-up included.
const AGENT_TIMEOUT: Duration = Duration::from_secs(900);

/// The server every test here talks to, with `smollm2:135m` pulled, `agent-smollm2` created
/// and the default model set; `None` (after a notice) when a model cannot be fetched
/// outside CI.
fn server() -> Option<&'static Served> {
    static SERVER: OnceLock<Option<Served>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            let home = tempfile::tempdir().unwrap().keep();
            support::remove_at_exit(&home);
            support::store_with(&home, "smollm2:135m")?;
            let modelfile = home.join("Modelfile");
            std::fs::write(&modelfile, AGENT_MODELFILE).unwrap();
            mlxkit(
                &home,
                &["create", AGENT_MODEL, "-f", modelfile.to_str().unwrap()],
            );
            Some(Served::start(&home, &["--default-model", AGENT_MODEL]))
        })
        .as_ref()
}

/// Runs `command` (an agent) to its end or [`AGENT_TIMEOUT`], its output in files (an agent's
/// output can exceed a pipe while nobody reads it); returns its output and how long it took.
fn run_agent(name: &str, command: &mut Command) -> (Output, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let stdout = std::fs::File::create(dir.path().join("stdout")).unwrap();
    let stderr = std::fs::File::create(dir.path().join("stderr")).unwrap();
    let started = Instant::now();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {name}: {e}"));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > AGENT_TIMEOUT {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let elapsed = started.elapsed();
    eprintln!("{name}: {status} after {:.1} s", elapsed.as_secs_f64());
    let read = |file: &str| std::fs::read(dir.path().join(file)).unwrap_or_default();
    let output = Output {
        status,
        stdout: read("stdout"),
        stderr: read("stderr"),
    };
    (output, elapsed)
}

/// What an assertion about an agent's run shows: its output and the server's log.
fn report(s: &Served, output: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}\n--- stderr\n{}\n--- server log\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        tail(&String::from_utf8_lossy(&output.stderr), 60),
        s.log_tail(40)
    )
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// An agent's environment: nothing of the caller's (no API keys, no settings), a home of its
/// own, and `PATH` for the commands its tools run.
fn agent_command(program: &Path, home: &Path) -> Command {
    let mut command = Command::new(program);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("LANG", "C.UTF-8")
        .current_dir(home);
    command
}

/// Tests here run one at a time: each agent's turn keeps the two CPU cores busy.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    support::serial()
}

#[test]
fn claude_code_answers_with_its_default_tools() {
    let Some(s) = server() else { return };
    let Some(agents) = required("Claude Code and Codex", install::npm_agents()) else {
        return;
    };
    let _serial = serial();
    let home = tempfile::tempdir().unwrap();
    let (output, _) = run_agent(
        "claude",
        agent_command(&agents.claude, home.path())
            .args(["-p", "Reply with one short sentence about the sea."])
            .env("ANTHROPIC_BASE_URL", &s.base)
            .env("ANTHROPIC_API_KEY", "mlxkit-test")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("DISABLE_TELEMETRY", "1")
            .env("DISABLE_AUTOUPDATER", "1"),
    );
    assert!(output.status.success(), "{}", report(s, &output));
    let reply = String::from_utf8_lossy(&output.stdout);
    assert!(!reply.trim().is_empty(), "no reply: {}", report(s, &output));
}

#[test]
fn codex_exec_runs_in_its_default_configuration() {
    let Some(s) = server() else { return };
    let Some(agents) = required("Claude Code and Codex", install::npm_agents()) else {
        return;
    };
    let _serial = serial();
    let home = tempfile::tempdir().unwrap();
    let codex_home = home.path().join(".codex");
    std::fs::create_dir_all(&codex_home).unwrap();
    // Only the provider: Codex picks its own model (a hosted name), tools and options.
    // Retries off: a refused request should fail the test at once, not after backoffs.
    // A minute of silence drops the stream (the default is five): reading Codex's ~14k-token
    // first prompt takes longer than that here, so the answer arrives only because the
    // server's `response.in_progress` heartbeats count as events.
    std::fs::write(
        codex_home.join("config.toml"),
        format!(
            "model_provider = \"mlxkit\"\n\n\
             [model_providers.mlxkit]\n\
             name = \"mlxkit\"\n\
             base_url = \"{}/v1\"\n\
             wire_api = \"responses\"\n\
             request_max_retries = 0\n\
             stream_max_retries = 0\n\
             stream_idle_timeout_ms = 60000\n",
            s.base
        ),
    )
    .unwrap();
    let (output, _) = run_agent(
        "codex",
        agent_command(&agents.codex, home.path())
            .args([
                "exec",
                "--skip-git-repo-check",
                "Reply with one short sentence about the sea.",
            ])
            .env("CODEX_HOME", &codex_home),
    );
    assert!(output.status.success(), "{}", report(s, &output));
    let reply = String::from_utf8_lossy(&output.stdout);
    assert!(!reply.trim().is_empty(), "no reply: {}", report(s, &output));
}

/// A Modelfile's `num_ctx` past the trained context is the context served (`/api/ps`), and
/// the log says how the rotary embedding was stretched to it.
#[test]
fn a_modelfile_context_past_the_trained_one_is_served() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let client = support::client();
    let loaded = client
        .post(format!("{}/api/generate", s.base))
        .json(&json!({ "model": AGENT_MODEL, "keep_alive": "5m" }))
        .send()
        .unwrap();
    assert!(loaded.status().is_success(), "loading: {}", loaded.status());
    let ps = client
        .get(format!("{}/api/ps", s.base))
        .send()
        .unwrap()
        .json::<serde_json::Value>()
        .unwrap();
    let served = ps["models"]
        .as_array()
        .and_then(|models| {
            models
                .iter()
                .find(|m| m["name"] == format!("{AGENT_MODEL}:latest"))
        })
        .unwrap_or_else(|| panic!("{AGENT_MODEL} is not loaded: {ps}"));
    assert_eq!(served["context_length"], 16384, "{ps}");
    assert!(
        s.log().contains("stretched 2.00x (YaRN)"),
        "{}",
        s.log_tail(20)
    );
}

#[test]
fn aider_reports_the_true_context_size() {
    let Some(s) = server() else { return };
    let Some(python) = required("aider", install::aider_python()) else {
        return;
    };
    let _serial = serial();
    let home = tempfile::tempdir().unwrap();
    let aider_run = |message: &str| {
        run_agent(
            "aider",
            agent_command(&python, home.path())
                .args([
                    "-m",
                    "aider",
                    "--model",
                    "ollama_chat/smollm2:135m",
                    "--no-git",
                    "--yes-always",
                    "--no-check-update",
                    "--analytics-disable",
                    "--no-show-model-warnings",
                    "--no-pretty",
                    "--message",
                    message,
                ])
                .env("OLLAMA_API_BASE", &s.base)
                // litellm's bundled price and context map, not a download.
                .env("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
        )
    };
    let (output, _) = aider_run("/tokens");
    assert!(output.status.success(), "{}", report(s, &output));
    let text = String::from_utf8_lossy(&output.stdout);
    // SmolLM2-135M's `llama.context_length`, as litellm reads it from `/api/show`.
    assert!(
        text.contains("8,192 tokens max context window size"),
        "{}",
        report(s, &output)
    );
    // A turn: aider asks for `num_ctx` past the model's context (tokens × 1.25 + 8,192).
    let (output, _) = aider_run("Say hello.");
    assert!(output.status.success(), "{}", report(s, &output));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("Tokens:"), "{}", report(s, &output));
}

#[test]
fn hosted_model_names_reach_the_default_model_or_a_copy() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let client = support::client();
    let post = |path: &str, body: serde_json::Value| {
        let r = client
            .post(format!("{}{path}", s.base))
            .json(&body)
            .send()
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json::<serde_json::Value>().unwrap_or_default())
    };
    let (status, body) = post(
        "/v1/messages",
        json!({ "model": "claude-opus-5-5", "max_tokens": 2,
                "messages": [{ "role": "user", "content": "Hi" }] }),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(
        "/v1/chat/completions",
        json!({ "model": "gpt-5.5", "max_tokens": 2,
                "messages": [{ "role": "user", "content": "Hi" }] }),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(
        "/v1/responses",
        json!({ "model": "gpt-6.2-sol", "max_output_tokens": 2, "input": "Hi" }),
    );
    assert_eq!(status, 200, "{body}");
    // A local name that is missing is still a 404: only hosted names fall back.
    let (status, body) = post(
        "/v1/messages",
        json!({ "model": "smollm3:3b", "max_tokens": 2,
                "messages": [{ "role": "user", "content": "Hi" }] }),
    );
    assert_eq!(status, 404, "{body}");
    // A stored model under a hosted name is served as itself, not as the default.
    let (status, body) = post(
        "/api/copy",
        json!({ "source": "smollm2:135m", "destination": "claude-sonnet-4-5" }),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(
        "/v1/messages",
        json!({ "model": "claude-sonnet-4-5", "max_tokens": 2,
                "messages": [{ "role": "user", "content": "Hi" }] }),
    );
    assert_eq!(status, 200, "{body}");
    let (_, ps) = {
        let r = client.get(format!("{}/api/ps", s.base)).send().unwrap();
        (
            r.status(),
            r.json::<serde_json::Value>().unwrap_or_default(),
        )
    };
    assert_eq!(ps["models"][0]["name"], "claude-sonnet-4-5:latest", "{ps}");
}

#[test]
fn show_describes_a_model_in_ollamas_shape() {
    let Some(s) = server() else { return };
    let _serial = serial();
    // `tool_format` is known once the model's vocabulary is loaded (null before): load it, so
    // the snapshot does not depend on which test ran first.
    let loaded = support::client()
        .post(format!("{}/api/generate", s.base))
        .json(&json!({ "model": "smollm2:135m", "keep_alive": "5m" }))
        .send()
        .unwrap();
    assert!(
        loaded.status().is_success(),
        "loading smollm2:135m: {}",
        loaded.status()
    );
    let show = support::client()
        .post(format!("{}/api/show", s.base))
        .json(&json!({ "name": "smollm2:135m" }))
        .send()
        .unwrap()
        .json::<serde_json::Value>()
        .unwrap();
    // The keys litellm and Ollama's own clients read, with the GGUF's values.
    let info = &show["model_info"];
    assert_eq!(info["general.architecture"], "llama", "{info}");
    assert_eq!(info["llama.context_length"], 8192, "{info}");
    assert_eq!(info["llama.embedding_length"], 576, "{info}");
    assert_eq!(info["llama.block_count"], 30, "{info}");
    assert_eq!(info["llama.attention.head_count"], 9, "{info}");
    assert_eq!(info["llama.attention.head_count_kv"], 3, "{info}");
    assert!(info["general.parameter_count"].as_u64() > Some(100_000_000));
    let mut shown = support::redact(&show);
    // The template is the checkpoint's, long and checked elsewhere.
    shown["template"] = json!("[template]");
    insta::assert_json_snapshot!(shown);
}
