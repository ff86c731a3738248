//! Every kind of work gets its turn on `smollm2:135m`: an embedding sent while generations run
//! is answered while they still run, and a prompt dropped in the middle of its prefill stops
//! there and leaves what it evaluated to its retry.

use crate::support;

use std::io::Read;
use std::time::Duration;

use serde_json::{Value, json};
use support::{MODEL, client, get, post, ps_when_idle, serial, server};

fn greedy(num_predict: u32) -> Value {
    json!({ "temperature": 0, "num_predict": num_predict })
}

/// Opens a streaming generation and returns the response, its headers read.
fn stream(base: &str, prompt: &str, num_predict: u32) -> reqwest::blocking::Response {
    let response = client()
        .post(format!("{base}/api/generate"))
        .json(&json!({ "model": MODEL, "prompt": prompt, "options": greedy(num_predict) }))
        .send()
        .unwrap();
    assert_eq!(response.status(), 200);
    response
}

/// Reads streamed NDJSON lines until `count` have come; false if the stream ended first.
fn read_lines(response: &mut reqwest::blocking::Response, count: usize) -> bool {
    let mut buffer = [0u8; 512];
    let mut seen = 0;
    while seen < count {
        match response.read(&mut buffer) {
            Ok(0) | Err(_) => return false,
            Ok(n) => seen += buffer[..n].iter().filter(|&&b| b == b'\n').count(),
        }
    }
    true
}

/// The loaded model's entry of `/api/ps`.
fn loop_status(base: &support::Server) -> Value {
    get(base, "/api/ps").1["models"][0].clone()
}

#[test]
fn an_embedding_is_answered_while_generations_run() {
    let Some(s) = server() else { return };
    let _serial = serial();
    // Four long generations, each streaming before the embedding is sent.
    let mut generations: Vec<_> = (0..4)
        .map(|i| {
            let mut response = stream(&s.base, &format!("Story {i}: once upon a time"), 4000);
            assert!(read_lines(&mut response, 2), "generation {i} ended early");
            response
        })
        .collect();
    let (status, reply) = post(
        s,
        "/api/embed",
        json!({ "model": MODEL, "input": ["The cat sat on the mat.", "A second text."] }),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["embeddings"].as_array().unwrap().len(), 2);
    // Every generation is still streaming: the embedding ran between their steps, not after
    // them (4,000 tokens each are minutes of decoding on any machine this runs on).
    for (i, generation) in generations.iter_mut().enumerate() {
        assert!(
            read_lines(generation, 2),
            "generation {i} ended before the embedding was answered"
        );
    }
    drop(generations);
    ps_when_idle(s);
}

#[test]
fn a_prompt_dropped_mid_prefill_stops_there_and_its_retry_resumes() {
    let Some(s) = server() else { return };
    let _serial = serial();
    ps_when_idle(s);
    // About 3,000 tokens, unseen by the cache: seconds of prefill on a 2-core CPU.
    let prompt: String = (0..400)
        .map(|i| format!("item {i} is {}; ", i * 7919 % 1000))
        .collect();
    let started = stream(&s.base, &prompt, 8);
    // Dropped once some of the prompt is evaluated.
    let mut prefilled_at_drop = 0;
    for _ in 0..2000 {
        let status = loop_status(s);
        prefilled_at_drop = status["prefilled_tokens"].as_u64().unwrap_or(0) as usize;
        if prefilled_at_drop >= 512 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(started);
    assert!(prefilled_at_drop >= 512, "the prefill never got going");

    // Retried at once, as a client that timed out does.

    let (status, retry) = post(
        s,
        "/api/generate",
        json!({ "model": MODEL, "prompt": prompt, "stream": false, "options": greedy(8) }),
    );
    assert_eq!(status, 200, "{retry}");
    let evaluated = retry["prompt_eval_count"].as_u64().unwrap() as usize;
    let cached = retry["prompt_cached_count"].as_u64().unwrap() as usize;
    let prompt_tokens = evaluated + cached;
    // Nothing the dropped attempt evaluated is lost: the retry evaluates at most what it
    // never reached and one chunk (256 tokens) ...
    assert!(
        cached >= prefilled_at_drop && evaluated <= prompt_tokens - prefilled_at_drop + 256,
        "the retry evaluated {evaluated} of {prompt_tokens} tokens; the dropped attempt had \
         evaluated {prefilled_at_drop}"
    );
    // ... and it stopped soon after the client left, not at the end of its prompt: within a
    // few steps' chunks (256 tokens each), far from the prompt's end.
    let slack = 4 * 256;
    assert!(
        cached <= prefilled_at_drop + slack && cached + 256 < prompt_tokens,
        "the dropped attempt went on to {cached} of {prompt_tokens} tokens after the client \
         left at {prefilled_at_drop}"
    );
}
