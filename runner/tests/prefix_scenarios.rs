//! The prefix trie behind every request, through the HTTP API with real models: alternating
//! conversations, forks, a long prompt given up mid-prefill, a Gemma 3 conversation past its
//! sliding window, and many conversations under a small cache budget compared with a server
//! that keeps nothing. `prompt_eval_count` is what the engine evaluated; `prompt_cached_count`
//! what it restored.

use crate::support;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use runner::engine::LoopConfig;
use serde_json::{Value, json};
use support::{MODEL, Server, client, post, serial, start_server};

const GEMMA: &str = "gemma3:270m";

/// One server with both models and the default budgets.
fn server() -> Option<&'static Server> {
    static SERVER: OnceLock<Option<Server>> = OnceLock::new();
    SERVER
        .get_or_init(|| start_server(&[MODEL, GEMMA], LoopConfig::from_env()))
        .as_ref()
}

fn greedy(n: u32) -> Value {
    json!({ "temperature": 0, "num_predict": n })
}

/// `(prompt tokens, evaluated, cached)` of a finished response.
fn counts(response: &Value) -> (u64, u64, u64) {
    let evaluated = response["prompt_eval_count"].as_u64().unwrap();
    let cached = response["prompt_cached_count"].as_u64().unwrap();
    (evaluated + cached, evaluated, cached)
}

fn chat(s: &Server, model: &str, messages: &[Value], n: u32) -> Value {
    let (status, response) = post(
        s,
        "/api/chat",
        json!({ "model": model, "messages": messages, "stream": false, "options": greedy(n) }),
    );
    assert_eq!(status, 200, "{response}");
    response
}

fn system(topic: &str) -> Value {
    let text = format!(
        "You are a careful assistant for questions about {topic}. Answer in one short sentence. "
    )
    .repeat(12);
    json!({ "role": "system", "content": text })
}

fn user(text: &str) -> Value {
    json!({ "role": "user", "content": text })
}

#[test]
fn alternating_conversations_both_stay_cached_and_grow() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let a = vec![system("lighthouses"), user("What is a lighthouse?")];
    let b = vec![system("volcanoes"), user("What is a volcano?")];
    let first_a = chat(s, MODEL, &a, 8);
    let first_b = chat(s, MODEL, &b, 8);
    assert!(counts(&first_a).0 > 200, "a long system prompt");
    for round in 0..2 {
        for (messages, first) in [(&a, &first_a), (&b, &first_b)] {
            let again = chat(s, MODEL, messages, 8);
            assert_eq!(again["message"], first["message"]);
            let (_, evaluated, _) = counts(&again);
            assert!(
                evaluated <= 1,
                "round {round}: a repeat evaluated {evaluated} tokens"
            );
        }
    }
    // The next turns evaluate at most what they add.
    for (mut messages, first) in [(a, first_a), (b, first_b)] {
        let (before, _, _) = counts(&first);
        messages.push(first["message"].clone());
        messages.push(user("Tell me one more fact."));
        let next = chat(s, MODEL, &messages, 8);
        let (total, evaluated, cached) = counts(&next);
        assert!(
            cached >= before,
            "cached {cached} of the {before} tokens seen before"
        );
        assert!(
            evaluated <= total - before + 1,
            "evaluated {evaluated} of {total}"
        );
    }
}

#[test]
fn two_forks_of_one_conversation_both_reuse_it() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let base = vec![system("rivers"), user("Name a long river.")];
    let first = chat(s, MODEL, &base, 8);
    let (before, _, _) = counts(&first);
    for question in ["How long is it?", "Which sea does it reach?"] {
        let mut fork = base.clone();
        fork.push(first["message"].clone());
        fork.push(user(question));
        let (_, _, cached) = counts(&chat(s, MODEL, &fork, 8));
        assert!(
            cached >= before,
            "the fork reused {cached} of {before} tokens"
        );
    }
}

#[test]
fn a_long_prompt_given_up_mid_prefill_resumes_on_retry() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let prompt = "Notes on the history of mapmaking, chapter by chapter. ".repeat(250);
    {
        let stream = client()
            .post(format!("{}/api/generate", s.base))
            .json(&json!({ "model": MODEL, "prompt": prompt, "options": greedy(8) }))
            .send()
            .unwrap();
        // Give up once a chunk of the ~3,000-token prompt is evaluated, before any token.
        let mut waited = 0;
        loop {
            let (_, ps) = support::get(s, "/api/ps");
            let done = ps["models"][0]["prefilled_tokens"].as_u64().unwrap_or(0);
            if done >= 512 {
                break;
            }
            waited += 1;
            assert!(waited < 6000, "the prefill never progressed");
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(stream); // The client goes away mid-prompt.
    }
    let short_sent = Instant::now();
    let (status, short) = post(
        s,
        "/api/generate",
        json!({ "model": MODEL, "prompt": "Hi", "stream": false, "options": greedy(2) }),
    );
    assert_eq!(status, 200, "{short}");
    // Reported, not asserted: tests do not judge wall-clock time.
    println!(
        "a short request after the cancel answered in {:.2} s",
        short_sent.elapsed().as_secs_f64()
    );
    let (status, retry) = post(
        s,
        "/api/generate",
        json!({ "model": MODEL, "prompt": prompt, "stream": false, "options": greedy(4) }),
    );
    assert_eq!(status, 200, "{retry}");
    let (total, evaluated, cached) = counts(&retry);
    assert!(total > 2500, "{total} prompt tokens");
    assert!(
        cached > 0,
        "the retry reused nothing of the cancelled prefill"
    );
    println!("the retry restored {cached} of {total} prompt tokens and evaluated {evaluated}");
}

#[test]
fn a_gemma_conversation_past_its_window_evaluates_only_new_turns() {
    let Some(s) = server() else { return };
    let _serial = serial();
    // Gemma 3's local layers see 512 tokens; the system prompt alone is longer.
    let mut messages = vec![
        json!({ "role": "system", "content": "Answer briefly and plainly. ".repeat(130) }),
        user("Hello!"),
    ];
    let mut before = 0;
    for turn in 0..3 {
        let response = chat(s, GEMMA, &messages, 12);
        let (total, evaluated, _) = counts(&response);
        assert!(total > 512, "{total} tokens");
        if turn > 0 {
            assert!(
                evaluated <= total - before + 1,
                "turn {turn}: evaluated {evaluated} of {total}, {before} seen before"
            );
        }
        before = total;
        messages.push(response["message"].clone());
        messages.push(user(&format!("And what about number {turn}?")));
    }
}

/// 50 requests over 8 conversations on a server whose prefix cache holds 24 MB, each compared
/// with a server that keeps nothing; the small cache's bytes never exceed its budget.
#[test]
fn many_conversations_under_a_small_budget_equal_cold_runs() {
    let budget: u64 = 24 << 20;
    let mut small = LoopConfig::from_env();
    small.memory.cache_bytes = Some(budget as usize);
    let mut none = LoopConfig::from_env();
    none.memory.cache_bytes = Some(0);
    let (Some(cached), Some(cold)) = (start_server(&[MODEL], small), start_server(&[MODEL], none))
    else {
        return;
    };
    let mut conversations: Vec<Vec<Value>> = (0..8)
        .map(|c| vec![system(&format!("topic number {c}")), user("Start.")])
        .collect();
    let mut state = 12345u64;
    for request in 0..50 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let c = (state >> 33) as usize % conversations.len();
        // The two servers answer at once: they share nothing but the machine.
        let (warm, reference) = std::thread::scope(|scope| {
            let reference = scope.spawn(|| chat(&cold, MODEL, &conversations[c], 6));
            let warm = chat(&cached, MODEL, &conversations[c], 6);
            (warm, reference.join().expect("the cold client panicked"))
        });
        assert_eq!(warm["message"], reference["message"], "request {request}");
        let (_, ps) = support::get(&cached, "/api/ps");
        let bytes = ps["models"][0]["prefix_cache_bytes"].as_u64().unwrap();
        assert!(
            bytes <= budget,
            "request {request}: {bytes} bytes over {budget}"
        );
        if (state >> 40).is_multiple_of(3) || conversations[c].len() > 9 {
            conversations[c].truncate(2); // Start over: a repeat of the first turn.
        } else {
            conversations[c].push(warm["message"].clone());
            conversations[c].push(user(&format!("Go on ({request}).")));
        }
    }
}
