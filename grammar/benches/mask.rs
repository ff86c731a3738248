//! Mask time per token on the SmolLM2 vocabulary (49 152 tokens): each benchmark replays a
//! fixed, seeded random walk through a grammar, computing the mask before every token and
//! consuming it, so the time per item is one generation step's grammar cost.
//!
//! Run: `cargo bench -p mlxkit-grammar --bench mask`.

#[path = "../tests/support/mod.rs"]
mod support;

use divan::Bencher;
use divan::counter::ItemsCount;
use grammar::{GrammarCompiler, GrammarSpec};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

fn main() {
    divan::main();
}

fn compiler() -> &'static GrammarCompiler {
    static COMPILER: std::sync::OnceLock<GrammarCompiler> = std::sync::OnceLock::new();
    COMPILER.get_or_init(|| support::smollm2_compiler().expect("SmolLM2 fixture for benchmarks"))
}

fn spec(name: &str) -> GrammarSpec {
    match name {
        "json_object" => GrammarSpec::JsonObject,
        "schema" => GrammarSpec::JsonSchema(json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 8},
                "address": {"type": "object", "properties": {
                    "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
                }, "required": ["city", "zip"], "additionalProperties": false}
            },
            "required": ["name", "age", "tags", "address"],
            "additionalProperties": false
        })),
        "lark_free_text" => GrammarSpec::Lark(r#"start: "Answer: " /[^\n]{0,300}/"#.into()),
        other => unreachable!("unknown bench grammar {other}"),
    }
}

/// A seeded walk of up to 200 tokens that never picks an end token and mostly avoids
/// completing the output.
fn path(spec: &GrammarSpec) -> Vec<u32> {
    let compiler = compiler();
    let mut g = compiler.compile(spec).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let mut tokens = Vec::new();
    while tokens.len() < 200 {
        let options: Vec<u32> = support::allowed(&g.mask().unwrap(), g.vocab_size())
            .into_iter()
            .filter(|t| !compiler.end_tokens().contains(t))
            .collect();
        if options.is_empty() {
            break;
        }
        // Prefer tokens that keep the grammar open (a `{}` token would end a JSON object at
        // once); after a few tries take what comes.
        let mut pick = options[rng.random_range(0..options.len())];
        for _ in 0..32 {
            let mut probe = g.fork();
            probe.consume(pick).unwrap();
            if !probe.is_accepting() {
                break;
            }
            pick = options[rng.random_range(0..options.len())];
        }
        g.consume(pick).unwrap();
        tokens.push(pick);
    }
    tokens
}

#[divan::bench(args = ["json_object", "schema", "lark_free_text"], sample_count = 20)]
fn mask_and_consume(bencher: Bencher, name: &str) {
    let spec = spec(name);
    let tokens = path(&spec);
    bencher
        .counter(ItemsCount::new(tokens.len()))
        .with_inputs(|| compiler().compile(&spec).unwrap())
        .bench_local_values(|mut g| {
            for &t in &tokens {
                divan::black_box(g.mask().unwrap());
                g.consume(t).unwrap();
            }
        });
}

#[divan::bench(args = ["json_object", "schema", "lark_free_text"], sample_count = 20)]
fn compile_cached(bencher: Bencher, name: &str) {
    let spec = spec(name);
    compiler().compile(&spec).unwrap();
    bencher.bench(|| compiler().compile(&spec).unwrap());
}
