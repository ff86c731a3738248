//! One model served by a group of processes on loopback (issue 50): `mlxkit serve --hostfile`
//! as rank 0 and `mlxkit worker` for every other rank, as a user starts them, over MLX's ring
//! backend, every address in 127.0.0.0/8.
//!
//! - SmolLM2-135M split three ways by tensor parallelism (its 9 heads and 3 key/value heads
//!   split by three, not two) and two ways by pipeline parallelism answers greedy requests,
//!   one at a time and eight at once, with the tokens one process gives. Pipeline stages run
//!   each layer whole, so one request's logits are one process's exactly. A tensor-parallel
//!   split sums each row-parallel projection's partial products across ranks, which reorders
//!   f32 additions: its top-5 log-probabilities stay within [`LOGPROB_BOUND`] of one process's
//!   (measured below ~1e-5 on the tiny fixtures of `nn/tests/parallel.rs`), and a token may
//!   differ only where one process's top two were closer than [`MARGIN`].
//! - Gemma 3 270M (the other real model) split two ways by pipeline answers with one
//!   process's tokens and log-probabilities exactly.
//! - Across two pipeline ranks, prompt-lookup speculation (whose rejected drafts rewind every
//!   rank's caches) answers as one process does, and a long prompt whose client gave up
//!   mid-prefill, asked again, answers as one process does.
//! - With `--kv-cache q8`, every rank keeps 8-bit caches: two pipeline ranks answer with one
//!   process's logprobs exactly.
//! - `mlxkit bench --hostfile` over two ranks reports each rank's peak memory, and the worker
//!   ends cleanly when rank 0 closes the group.
//! - A worker killed with SIGKILL mid-generation ends the request in flight within seconds with
//!   an error naming it; rank 0 keeps answering `/api/version`, `/api/ps` and `/health` (which
//!   say whether the group serves), and the next request gets a 503 naming the rank. The
//!   worker started again, the group re-forms without rank 0 restarting (the third rank,
//!   caught mid-step, rejoins on its own), and the request is answered as before.
//! - A worker stopped with SIGSTOP mid-generation is lost after 10 s of silence: the request
//!   in flight ends with an error naming it. Running again, it rejoins on its own and the
//!   group serves again.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::served::Served;
use crate::support::{MODEL, client, pulled_into};

/// The most a top-5 log-probability of a split model may move from one process's.
const LOGPROB_BOUND: f64 = 1e-4;

/// One process's top-two log-probability gap below which a split model may pick the other.
const MARGIN: f64 = 1e-4;

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
];

/// A group serving on loopback: rank 0's server and its workers' processes.
struct Group {
    rank_0: Served,
    workers: Vec<Child>,
    /// The hostfile every rank was started with.
    hosts: PathBuf,
}

impl Drop for Group {
    fn drop(&mut self) {
        for worker in &mut self.workers {
            let _ = worker.kill();
            let _ = worker.wait();
        }
        let _ = Command::new("kill")
            .args(["-9", &self.rank_0.pid.to_string()])
            .status();
    }
}

/// `size` consecutive free loopback ports, and the free one below them (rank 0's control).
fn free_ports(size: usize) -> Vec<u16> {
    'search: for _ in 0..100 {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        let first = probe.local_addr().unwrap().port();
        drop(probe);
        if first < 2 || usize::from(first) + size >= 65535 {
            continue;
        }
        let ports: Vec<u16> = (first - 1..=first + size as u16 - 1).collect();
        for &port in &ports {
            if TcpListener::bind(("127.0.0.1", port)).is_err() {
                continue 'search;
            }
        }
        return ports[1..].to_vec();
    }
    panic!("no {size} consecutive free loopback ports");
}

/// A ring hostfile of `size` ranks on loopback, written into `dir`.
fn hostfile(dir: &Path, size: usize) -> PathBuf {
    let ranks: Vec<Vec<String>> = free_ports(size)
        .into_iter()
        .map(|port| vec![format!("127.0.0.1:{port}")])
        .collect();
    let path = dir.join(format!("hosts-{size}.json"));
    std::fs::write(&path, serde_json::to_string(&ranks).unwrap()).unwrap();
    path
}

/// Starts `mlxkit worker` as `rank` of the group `hosts` names, over the store in `home`.
fn spawn_worker(home: &Path, hosts: &str, rank: usize) -> Child {
    Command::new(env!("CARGO_BIN_EXE_mlxkit"))
        .args(["worker", "--hostfile", hosts, "--rank", &rank.to_string()])
        .env("MLXKIT_HOME", home)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Starts a group of `size` processes over the store in `home`, split as `parallel` says.
fn start_group(home: &Path, size: usize, parallel: &str) -> Group {
    start_group_with(home, size, parallel, &[])
}

/// [`start_group`], rank 0's server given `flags` too.
fn start_group_with(home: &Path, size: usize, parallel: &str, flags: &[&str]) -> Group {
    let hosts = hostfile(home, size);
    let path = hosts.to_str().unwrap();
    let workers = (1..size)
        .map(|rank| spawn_worker(home, path, rank))
        .collect();
    let mut args = vec!["--hostfile", path, "--parallel", parallel];
    args.extend(flags);
    let rank_0 = Served::start(home, &args);
    Group {
        rank_0,
        workers,
        hosts,
    }
}

/// One group at a time: every rank polls its sockets while it waits, so two groups on two
/// cores would take turns at a crawl, and the fault test's deadline would measure that.
fn one_group_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn home_with_model() -> Option<tempfile::TempDir> {
    let home = tempfile::tempdir().unwrap();
    pulled_into(home.path(), MODEL).then_some(home)
}

fn generate(base: &str, prompt: &str, tokens: usize) -> (u16, Value) {
    generate_from(base, MODEL, prompt, tokens)
}

/// `model`'s greedy answer to `prompt` from `base`, with its top-5 log-probabilities.
fn generate_from(base: &str, model: &str, prompt: &str, tokens: usize) -> (u16, Value) {
    let reply = client()
        .post(format!("{base}/api/generate"))
        .json(&json!({
            "model": model,
            "prompt": prompt,
            "stream": false,
            "options": { "temperature": 0, "num_predict": tokens },
            "logprobs": true,
            "top_logprobs": 5,
        }))
        .send()
        .unwrap();
    let status = reply.status().as_u16();
    (status, reply.json().unwrap_or(Value::Null))
}

/// Each prompt's greedy answer from `base`, the prompts sent `concurrent` at a time.
fn answers(base: &str, concurrent: usize) -> Vec<Value> {
    let prompts: Vec<&str> = PROMPTS
        .iter()
        .cycle()
        .take(concurrent.max(PROMPTS.len()))
        .copied()
        .collect();
    let mut out = Vec::new();
    for wave in prompts.chunks(concurrent) {
        let handles: Vec<_> = wave
            .iter()
            .map(|prompt| {
                let (base, prompt) = (base.to_string(), prompt.to_string());
                std::thread::spawn(move || generate(&base, &prompt, 16))
            })
            .collect();
        for handle in handles {
            let (status, reply) = handle.join().unwrap();
            assert_eq!(status, 200, "{reply}");
            out.push(reply);
        }
    }
    out
}

/// Checks a split model's answer against one process's (see the module docs); returns the
/// largest top-5 log-probability difference over the positions where both chose alike.
fn check_against(one: &Value, split: &Value, what: &str) -> f64 {
    let (a, b) = (
        one["logprobs"].as_array().unwrap(),
        split["logprobs"].as_array().unwrap(),
    );
    let mut worst = 0f64;
    for (position, (a, b)) in a.iter().zip(b).enumerate() {
        let top = |entry: &Value| -> Vec<(String, f64)> {
            entry["top_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    (
                        t["token"].as_str().unwrap().to_string(),
                        t["logprob"].as_f64().unwrap(),
                    )
                })
                .collect()
        };
        let (top_a, top_b) = (top(a), top(b));
        if a["token"] != b["token"] {
            let margin = top_a[0].1 - top_a[1].1;
            assert!(
                margin < MARGIN,
                "{what}: position {position} chose {} where one process chose {} by a margin of \
                 {margin}",
                b["token"],
                a["token"]
            );
            return worst;
        }
        for ((token_a, lp_a), (token_b, lp_b)) in top_a.iter().zip(&top_b) {
            if token_a == token_b {
                worst = worst.max((lp_a - lp_b).abs());
            }
        }
    }
    assert!(
        worst <= LOGPROB_BOUND,
        "{what}: top-5 log-probabilities moved by {worst}"
    );
    worst
}

#[test]
fn a_model_split_across_processes_answers_as_one_process_does() {
    let _one = one_group_at_a_time();
    let Some(home) = home_with_model() else {
        return;
    };
    // Plain decoding and no prefix reuse, as the group's: a speculative round's verification
    // forward, or a prompt evaluated after a restored prefix, sums in another order than the
    // group's forwards, so logprobs would differ by rounding.
    let one = Served::start(home.path(), &["--draft", "none", "--cache-bytes", "0"]);
    let alone = answers(&one.base, 1);
    let batched = answers(&one.base, 8);
    // Its threads would take the two cores from the group's ranks.
    let _ = Command::new("kill")
        .args(["-9", &one.pid.to_string()])
        .status();
    for (size, parallel) in [(3, "tensor"), (2, "pipeline")] {
        let group = start_group(home.path(), size, parallel);
        let what = format!("{parallel} parallel over {size} ranks");
        let split_alone = answers(&group.rank_0.base, 1);
        let split_batched = answers(&group.rank_0.base, 8);
        let mut worst_alone = 0f64;
        for (a, b) in alone.iter().zip(&split_alone) {
            worst_alone = worst_alone.max(check_against(a, b, &format!("{what}, one at a time")));
        }
        let mut worst_batched = 0f64;
        for (a, b) in batched.iter().zip(&split_batched) {
            worst_batched =
                worst_batched.max(check_against(a, b, &format!("{what}, eight at once")));
        }
        eprintln!(
            "{what}: top-5 log-probabilities within {worst_alone:e} of one process one request \
             at a time, {worst_batched:e} eight at once"
        );
        if parallel == "pipeline" {
            // Eight at once, the two servers may admit the prompts in different steps, and a
            // matrix product over other rows sums in another order.
            assert_eq!(worst_alone, 0.0, "{what}: a pipeline runs each layer whole");
        }
    }
}

/// The other real model, Gemma 3 270M (its one key/value head does not split by tensor
/// parallelism), split by pipeline: the same tokens and log-probabilities as one process.
#[test]
fn gemma_split_by_pipeline_answers_exactly_as_one_process() {
    const GEMMA: &str = "gemma3:270m";
    let _one = one_group_at_a_time();
    let Some(home) = home_with_model() else {
        return;
    };
    if !pulled_into(home.path(), GEMMA) {
        return;
    }
    let flags = ["--draft", "none", "--cache-bytes", "0"];
    let one = Served::start(home.path(), &flags);
    let alone: Vec<Value> = PROMPTS
        .iter()
        .map(|prompt| {
            let (status, reply) = generate_from(&one.base, GEMMA, prompt, 16);
            assert_eq!(status, 200, "{reply}");
            reply
        })
        .collect();
    let _ = Command::new("kill")
        .args(["-9", &one.pid.to_string()])
        .status();

    let group = start_group_with(home.path(), 2, "pipeline", &flags);
    for (prompt, alone) in PROMPTS.iter().zip(&alone) {
        let (status, split) = generate_from(&group.rank_0.base, GEMMA, prompt, 16);
        assert_eq!(status, 200, "{split}");
        assert_eq!(split["response"], alone["response"], "{split}");
        assert_eq!(
            check_against(alone, &split, "Gemma over two pipeline ranks"),
            0.0
        );
    }
}

/// A copy-heavy prompt: prompt lookup finds its continuation in it.
fn copy_prompt() -> String {
    let code = "fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n\nfn sub(a: i32, b: i32) -> i32 {\n    a - b\n}\n";
    format!("Repeat this code exactly.\n\n{code}\nRepeated:\n\n{code}")
}

/// A prompt of about 1,500 tokens.
fn long_prompt() -> String {
    let sentence = "The river ran past the mill and the miller counted the sacks of grain. ";
    format!("{}What did the miller count?", sentence.repeat(100))
}

fn generate_with(base: &str, prompt: &str, options: Value, timeout: Duration) -> Option<Value> {
    let client = reqwest::blocking::Client::builder()
        .timeout(timeout)
        .build()
        .unwrap();
    let reply = client
        .post(format!("{base}/api/generate"))
        .json(&json!({ "model": MODEL, "prompt": prompt, "stream": false, "options": options }))
        .send()
        .ok()?;
    assert_eq!(reply.status().as_u16(), 200);
    reply.json().ok()
}

#[test]
fn speculation_and_a_cancelled_prompt_across_processes_answer_as_one_process() {
    let _one = one_group_at_a_time();
    let Some(home) = home_with_model() else {
        return;
    };
    let lookup = json!({ "temperature": 0, "num_predict": 48, "draft": "ngram" });
    let plain = json!({ "temperature": 0, "num_predict": 16 });
    let long = Duration::from_secs(600);
    let one = Served::start(home.path(), &["--cache-bytes", "0"]);
    let copied = generate_with(&one.base, &copy_prompt(), lookup.clone(), long).unwrap();
    let answered = generate_with(&one.base, &long_prompt(), plain.clone(), long).unwrap();
    let _ = Command::new("kill")
        .args(["-9", &one.pid.to_string()])
        .status();

    let group = start_group(home.path(), 2, "pipeline");
    let base = &group.rank_0.base;
    let split = generate_with(base, &copy_prompt(), lookup, long).unwrap();
    assert_eq!(split["response"], copied["response"], "{split}");
    assert_eq!(split["speculation"]["drafter"], "ngram", "{split}");
    assert!(
        split["speculation"]["accepted"].as_u64() > Some(0),
        "no draft was accepted across the ranks: {split}"
    );
    // The client gives up a second into the prompt's prefill.
    let gave_up = generate_with(base, &long_prompt(), plain.clone(), Duration::from_secs(1));
    assert!(gave_up.is_none(), "the prompt was answered within a second");
    let again = generate_with(base, &long_prompt(), plain, long).unwrap();
    assert_eq!(again["response"], answered["response"], "{again}");
}

#[test]
fn every_rank_keeps_its_caches_as_the_server_is_told() {
    let _one = one_group_at_a_time();
    let Some(home) = home_with_model() else {
        return;
    };
    let flags = ["--kv-cache", "q8", "--draft", "none", "--cache-bytes", "0"];
    let one = Served::start(home.path(), &flags);
    let (status, alone) = generate(&one.base, PROMPTS[1], 16);
    assert_eq!(status, 200, "{alone}");
    let _ = Command::new("kill")
        .args(["-9", &one.pid.to_string()])
        .status();

    let group = start_group_with(home.path(), 2, "pipeline", &flags);
    let (status, split) = generate(&group.rank_0.base, PROMPTS[1], 16);
    assert_eq!(status, 200, "{split}");
    // Each stage runs its layers whole over 8-bit caches, as one process does: exactly equal
    // logprobs say the worker's caches are 8-bit too.
    assert_eq!(
        check_against(&alone, &split, "8-bit caches over two pipeline ranks"),
        0.0
    );
}

#[test]
fn bench_over_a_group_reports_every_ranks_peak_memory() {
    let _one = one_group_at_a_time();
    let Some(home) = home_with_model() else {
        return;
    };
    let hosts = hostfile(home.path(), 2);
    let hosts = hosts.to_str().unwrap();
    let mut worker = spawn_worker(home.path(), hosts, 1);
    let output = Command::new(env!("CARGO_BIN_EXE_mlxkit"))
        .args([
            "bench",
            MODEL,
            "--hostfile",
            hosts,
            "--parallel",
            "pipeline",
        ])
        .args([
            "--prompt-tokens",
            "32",
            "--generate-tokens",
            "4",
            "--runs",
            "1",
            "--json",
        ])
        .env("MLXKIT_HOME", home.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["parallel"], "pipeline", "{report}");
    let ranks = report["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{report}");
    for rank in ranks {
        assert!(rank["peak_memory_bytes"].as_u64() > Some(0), "{report}");
    }
    assert!(
        report["runs"][0]["decode_tok_s"].as_f64() > Some(0.0),
        "{report}"
    );
    // Rank 0 closing the group ends the worker, cleanly.
    let status = worker.wait().unwrap();
    assert!(status.success(), "the worker ended with {status}");
    assert!(!stderr.contains("left the group"), "{stderr}");
}

#[test]
fn a_worker_killed_mid_generation_fails_the_request_and_the_group_re_forms_when_it_returns() {
    let _one = one_group_at_a_time();
    let Some(home) = home_with_model() else {
        return;
    };
    // Three tensor-parallel ranks: every step's sums wait on every rank, so rank 0 and rank 2
    // are each left waiting on the other when rank 1 goes, and rank 2 must rejoin too.
    let mut group = start_group(home.path(), 3, "tensor");
    let base = group.rank_0.base.clone();
    let (status, reply) = generate(&base, PROMPTS[0], 4);
    assert_eq!(status, 200, "{reply}");
    let ps: Value = client()
        .get(format!("{base}/api/ps"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(ps["models"][0]["group"]["ranks"], 3, "{ps}");
    assert_eq!(ps["models"][0]["group"]["state"], "serving", "{ps}");

    // Streamed, so that the worker is killed once tokens are coming: mid-generation.
    let (decoding_tx, decoding) = std::sync::mpsc::channel();
    let long = {
        let base = base.clone();
        std::thread::spawn(move || {
            let reply = long_generation(&base, true);
            let mut last = String::new();
            for (count, line) in BufReader::new(reply).lines().enumerate() {
                let Ok(line) = line else { break };
                if count == 2 {
                    let _ = decoding_tx.send(());
                }
                last = line;
            }
            last
        })
    };
    decoding
        .recv_timeout(Duration::from_secs(300))
        .expect("no tokens came");
    let killed = Instant::now();
    group.workers[0].kill().unwrap();
    group.workers[0].wait().unwrap();
    let last = long.join().unwrap();
    let waited = killed.elapsed();
    let last: Value = serde_json::from_str(&last).unwrap_or(Value::Null);
    assert!(
        last["error"].as_str().is_some_and(|e| e.contains("rank 1")),
        "the stream did not end with an error naming the rank: {last}"
    );
    assert!(
        waited < Duration::from_secs(10),
        "the request ended {waited:?} after the kill"
    );

    let version = client().get(format!("{base}/api/version")).send().unwrap();
    assert_eq!(version.status().as_u16(), 200);
    let health: Value = client()
        .get(format!("{base}/health"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(health["group"]["state"], "lost", "{health}");
    let (status, refused) = generate(&base, PROMPTS[0], 4);
    assert_eq!(status, 503, "{refused}");
    assert!(
        refused.to_string().contains("rank 1"),
        "{status}: {refused}"
    );

    // The worker starts again: the group re-forms, and rank 0, never restarted, answers as
    // before.
    group.workers[0] = spawn_worker(home.path(), group.hosts.to_str().unwrap(), 1);
    wait_until_serving(&base);
    let (status, again) = generate(&base, PROMPTS[0], 4);
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["response"], reply["response"], "{again}");
}

#[test]
fn a_stopped_worker_is_lost_after_its_silence_and_rejoins_once_it_runs_again() {
    let _one = one_group_at_a_time();
    let Some(home) = home_with_model() else {
        return;
    };
    let group = start_group(home.path(), 2, "pipeline");
    let base = group.rank_0.base.clone();
    let (status, reply) = generate(&base, PROMPTS[0], 4);
    assert_eq!(status, 200, "{reply}");
    let worker = group.workers[0].id().to_string();

    let long = {
        let base = base.clone();
        std::thread::spawn(move || long_generation(&base, false).text().unwrap())
    };
    std::thread::sleep(Duration::from_secs(2));
    // Stopped, not killed: its connections stay open, and only its silence tells.
    let stopped = Command::new("kill").args(["-STOP", &worker]).status();
    assert!(stopped.is_ok_and(|s| s.success()));
    let reply = long.join().unwrap();
    let health: Value = client()
        .get(format!("{base}/health"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let resumed = Command::new("kill").args(["-CONT", &worker]).status();
    assert!(resumed.is_ok_and(|s| s.success()));
    for said in [
        reply.as_str(),
        health["group"]["lost"].as_str().unwrap_or_default(),
    ] {
        assert!(
            said.contains("rank 1") && said.contains("stopped answering"),
            "{said}"
        );
    }

    // Running again, the worker finds its group broken, joins again, and the group re-forms.
    wait_until_serving(&base);
    let (status, again) = generate(&base, PROMPTS[0], 4);
    assert_eq!(status, 200, "{again}");
}

/// Waits (two minutes at most) for `base`'s `/health` to say its group serves again.
fn wait_until_serving(base: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let health: Value = client()
            .get(format!("{base}/health"))
            .send()
            .unwrap()
            .json()
            .unwrap();
        if health["group"]["state"] == "serving" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the group did not re-form: {health}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A request for 4,000 tokens from `base`, streamed or not: one that a fault ends.
fn long_generation(base: &str, stream: bool) -> reqwest::blocking::Response {
    client()
        .post(format!("{base}/api/generate"))
        .json(&json!({
            "model": MODEL,
            "prompt": PROMPTS[1],
            "stream": stream,
            "options": { "temperature": 0, "num_predict": 4000, "ignore_eos": true },
        }))
        .send()
        .unwrap()
}
