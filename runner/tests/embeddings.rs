//! Embeddings on `smollm2:135m` through Ollama's and OpenAI's endpoints: unit vectors, a
//! batch equal to its inputs alone, `dimensions`, `truncate`, the legacy raw vector, errors.

use crate::support;

use serde_json::{Value, json};
use support::{MODEL, post, serial, server};

fn vectors(reply: &Value, key: &str) -> Vec<Vec<f64>> {
    reply[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn ollama_embed_gives_unit_vectors_that_do_not_depend_on_the_batch() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let texts = [
        "The cat sat on the mat.",
        "A feline rested on the rug.",
        "Quarterly revenue grew five percent.",
    ];
    let (status, batch) = post(s, "/api/embed", json!({"model": MODEL, "input": texts}));
    assert_eq!(status, 200, "{batch}");
    let batch = vectors(&batch, "embeddings");
    assert_eq!(batch.len(), 3);
    for v in &batch {
        assert_eq!(v.len(), 576, "SmolLM2's hidden size");
        assert!((dot(v, v) - 1.0).abs() < 1e-5);
    }
    // Each input is evaluated on caches of its own: alone, it has the same bits.
    for (text, in_batch) in texts.iter().zip(&batch) {
        let (_, alone) = post(s, "/api/embed", json!({"model": MODEL, "input": text}));
        assert_eq!(&vectors(&alone, "embeddings")[0], in_batch);
    }
    // A paraphrase is nearer than an unrelated sentence.
    assert!(dot(&batch[0], &batch[1]) > dot(&batch[0], &batch[2]));

    let (_, cut) = post(
        s,
        "/api/embed",
        json!({"model": MODEL, "input": texts[0], "dimensions": 64}),
    );
    let cut = vectors(&cut, "embeddings");
    assert_eq!(cut[0].len(), 64);
    assert!((dot(&cut[0], &cut[0]) - 1.0).abs() < 1e-5);

    let long = "word ".repeat(9000);
    let (status, reply) = post(
        s,
        "/api/embed",
        json!({"model": MODEL, "input": long, "truncate": false}),
    );
    assert_eq!(status, 400, "{reply}");
    assert!(reply["error"].as_str().unwrap().contains("truncate"));
    // (With `truncate` left on, the same input is cut to 8,192 tokens and embedded: about a
    // minute of prefill on a 2-core CPU, so not repeated here.)

    // The legacy endpoint returns the raw hidden state: the same direction, not unit length.
    let (status, legacy) = post(
        s,
        "/api/embeddings",
        json!({"model": MODEL, "prompt": texts[0]}),
    );
    assert_eq!(status, 200, "{legacy}");
    let raw: Vec<f64> = legacy["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let norm = dot(&raw, &raw).sqrt();
    assert!((norm - 1.0).abs() > 1e-3);
    let cosine = dot(&raw, &batch[0]) / norm;
    assert!((cosine - 1.0).abs() < 1e-5, "{cosine}");

    for (body, needle) in [
        (json!({"model": MODEL, "input": []}), "empty"),
        (json!({"model": MODEL, "input": [""]}), "empty"),
        (
            json!({"model": MODEL, "input": "x", "dimensions": 100000}),
            "dimensions",
        ),
        (json!({"model": MODEL, "input": {"a": 1}}), "input"),
    ] {
        let (status, reply) = post(s, "/api/embed", body.clone());
        assert_eq!(status, 400, "{body}: {reply}");
        assert!(reply["error"].as_str().unwrap().contains(needle), "{reply}");
    }
}

#[test]
fn openai_embeddings_take_text_and_token_ids() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let (status, reply) = post(
        s,
        "/v1/embeddings",
        json!({"model": MODEL, "input": ["The cat sat on the mat.", [1, 504, 2468]]}),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["object"], "list");
    let data = reply["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    assert_eq!(data[1]["index"], 1);
    assert!(reply["usage"]["prompt_tokens"].as_u64().unwrap() > 3);
    let (_, ollama) = post(
        s,
        "/api/embed",
        json!({"model": MODEL, "input": "The cat sat on the mat."}),
    );
    assert_eq!(data[0]["embedding"], ollama["embeddings"][0]);

    let (status, encoded) = post(
        s,
        "/v1/embeddings",
        json!({"model": MODEL, "input": "The cat sat on the mat.", "encoding_format": "base64"}),
    );
    assert_eq!(status, 200, "{encoded}");
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    assert_eq!(bytes.len(), 576 * 4);
    let (status, reply) = post(
        s,
        "/v1/embeddings",
        json!({"model": MODEL, "input": [[99999999]]}),
    );
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["error"]["type"], "invalid_request_error");
}
