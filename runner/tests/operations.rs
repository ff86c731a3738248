//! The operator endpoints on a live server: `/metrics` parses as Prometheus text and its
//! counters move as requests are served; `/health`; `/tokenize` and `/detokenize` round trip.

mod support;

use std::collections::HashMap;

use serde_json::{Value, json};
use support::{MODEL, Server, client, get, post, serial, server};

/// Every sample of `/metrics`, parsed by a Prometheus text-format parser, keyed by name and
/// sorted labels.
fn scrape(s: &Server) -> HashMap<String, f64> {
    let r = client().get(format!("{}/metrics", s.base)).send().unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().unwrap();
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let parsed = prometheus_parse::Scrape::parse(lines).expect("Prometheus text format");
    let mut samples = HashMap::new();
    for sample in parsed.samples {
        let mut labels: Vec<String> = sample
            .labels
            .iter()
            .filter(|(k, _)| k.as_str() != "le" && k.as_str() != "quantile")
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        labels.sort();
        let value = match sample.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(buckets) => {
                buckets.iter().map(|b| b.count).fold(0.0, f64::max)
            }
            prometheus_parse::Value::Summary(_) => continue,
        };
        samples.insert(format!("{}{{{}}}", sample.metric, labels.join(",")), value);
    }
    samples
}

fn sample(samples: &HashMap<String, f64>, key: &str) -> f64 {
    samples.get(key).copied().unwrap_or(0.0)
}

#[test]
fn metrics_parse_and_move_as_requests_are_served() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let model = format!("model={MODEL}");
    let requests = "mlxkit_http_requests_total{method=POST,route=/api/generate,status=200}";
    let refused = "mlxkit_http_requests_total{method=POST,route=/api/generate,status=400}";
    let generated = format!("mlxkit_generated_tokens_total{{{model}}}");
    let prompt = format!("mlxkit_prompt_tokens_total{{{model}}}");
    let first_token = format!("mlxkit_time_to_first_token_seconds{{{model}}}");

    // Warm the model so the first scrape has every family, then count from there.
    let greedy = |n: u32| {
        json!({"model": MODEL, "prompt": "Count to ten.", "stream": false,
                                 "options": {"temperature": 0, "num_predict": n}})
    };
    assert_eq!(post(s, "/api/generate", greedy(2)).0, 200);
    let before = scrape(s);
    assert_eq!(post(s, "/api/generate", greedy(5)).0, 200);
    let (status, _) = post(
        s,
        "/api/generate",
        json!({"model": MODEL, "prompt": "x",
                                                     "options": {"temperature": -1}}),
    );
    assert_eq!(status, 400);
    let after = scrape(s);

    assert_eq!(sample(&after, requests) - sample(&before, requests), 1.0);
    assert_eq!(sample(&after, refused) - sample(&before, refused), 1.0);
    assert_eq!(
        sample(&after, &generated) - sample(&before, &generated),
        5.0
    );
    assert!(sample(&after, &prompt) >= sample(&before, &prompt));
    assert_eq!(
        sample(&after, &first_token) - sample(&before, &first_token),
        1.0,
        "one more first token observed"
    );
    for gauge in [
        "mlxkit_running_sequences",
        "mlxkit_queued_requests",
        "mlxkit_prefix_cache_bytes",
    ] {
        assert!(
            after.contains_key(&format!("{gauge}{{{model}}}")),
            "{gauge} is exported"
        );
    }
    assert!(sample(&after, "mlxkit_mlx_active_memory_bytes{}") > 0.0);
}

#[test]
fn health_tokenize_and_detokenize() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let (status, health) = get(s, "/health");
    assert_eq!(status, 200);
    assert_eq!(health["status"], "ok");

    let text = "Hello, world! <|im_start|>";
    let (status, tokens) = post(s, "/tokenize", json!({"model": MODEL, "content": text}));
    assert_eq!(status, 200, "{tokens}");
    let ids: Vec<u64> = tokens["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert!(ids.len() > 3);
    let (status, back) = post(s, "/detokenize", json!({"model": MODEL, "tokens": ids}));
    assert_eq!(status, 200, "{back}");
    assert_eq!(back["content"], text);

    let (status, reply) = post(
        s,
        "/detokenize",
        json!({"model": MODEL, "tokens": [99999999]}),
    );
    assert_eq!(status, 400, "{reply}");
    let (status, _) = post(
        s,
        "/tokenize",
        json!({"model": "nosuch:1b", "content": "x"}),
    );
    assert_eq!(status, 404);
    let (status, _): (u16, Value) = post(s, "/tokenize", json!({"model": MODEL}));
    assert_eq!(status, 400);
}
