//! Random walks through the masks on the real SmolLM2 vocabulary: picking any allowed token,
//! seeded, until an end token is picked, must always produce JSON that validates against the
//! schema, and end tokens must be allowed exactly when the grammar says it accepts.

mod support;

use grammar::GrammarSpec;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use support::{allowed, smollm2, smollm2_compiler};

/// Walks longer than this mean the grammar does not steer toward an end.
const MAX_STEPS: usize = 4000;
const WALKS_PER_SCHEMA: u64 = 12;

fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        (
            "nested objects with required fields",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "address": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string", "maxLength": 10},
                            "zip": {"type": "integer", "minimum": 10000, "maximum": 99999}
                        },
                        "required": ["city", "zip"],
                        "additionalProperties": false
                    }
                },
                "required": ["name", "address"],
                "additionalProperties": false
            }),
        ),
        (
            "array of bounded length",
            json!({
                "type": "array",
                "items": {"type": "integer", "minimum": -50, "maximum": 50},
                "minItems": 1,
                "maxItems": 5
            }),
        ),
        (
            "enums",
            json!({
                "type": "object",
                "properties": {
                    "color": {"enum": ["red", "green", "blue"]},
                    "size": {"enum": [1, 2, 3, "large"]},
                    "ok": {"type": "boolean"}
                },
                "required": ["color", "size", "ok"],
                "additionalProperties": false
            }),
        ),
        (
            "bounded numbers",
            json!({
                "type": "object",
                "properties": {
                    "ratio": {"type": "number", "minimum": 0, "maximum": 1},
                    "temp": {"type": "number", "exclusiveMinimum": -40, "maximum": 60.5},
                    "count": {"type": "integer", "minimum": 0, "maximum": 1000}
                },
                "required": ["ratio", "temp", "count"],
                "additionalProperties": false
            }),
        ),
        (
            "string patterns in an array of objects",
            json!({
                "type": "object",
                "properties": {
                    "items": {
                        "type": "array",
                        "maxItems": 3,
                        "items": {
                            "type": "object",
                            "properties": {
                                "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"},
                                "note": {"type": ["string", "null"], "maxLength": 8}
                            },
                            "required": ["sku"],
                            "additionalProperties": false
                        }
                    }
                },
                "required": ["items"],
                "additionalProperties": false
            }),
        ),
    ]
}

#[test]
fn random_walks_produce_valid_json() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    let tokenizer = smollm2().unwrap();
    let ends = compiler.end_tokens().to_vec();
    let blank: Vec<bool> = (0..compiler.vocab_size() as u32)
        .map(|t| {
            tokenizer
                .decode(&[t], false)
                .is_ok_and(|s| !s.is_empty() && s.trim().is_empty())
        })
        .collect();
    let mut distinct = std::collections::HashSet::new();
    for (name, schema) in schemas() {
        let validator = jsonschema::validator_for(&schema).expect("test schema is valid");
        for seed in 0..WALKS_PER_SCHEMA {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut g = compiler
                .compile(&GrammarSpec::JsonSchema(schema.clone()))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut tokens = Vec::new();
            loop {
                assert!(tokens.len() < MAX_STEPS, "{name} seed {seed}: no end");
                let options = allowed(&g.mask().unwrap(), g.vocab_size());
                assert!(!options.is_empty(), "{name} seed {seed}: empty mask");
                let accepting = g.is_accepting();
                let ends_in_mask = options.iter().filter(|t| ends.contains(t)).count();
                assert_eq!(
                    ends_in_mask,
                    if accepting { ends.len() } else { 0 },
                    "{name} seed {seed}: end tokens disagree with is_accepting after {:?}",
                    tokenizer.decode(&tokens, false).unwrap()
                );
                // Most of the vocabulary's whitespace runs fit between any two JSON tokens, so
                // uniform picks would mostly pad; prefer content so walks reach deep values.
                let content: Vec<u32> = options
                    .iter()
                    .copied()
                    .filter(|&t| !blank[t as usize])
                    .collect();
                let pool = if !content.is_empty() && rng.random_bool(0.9) {
                    &content
                } else {
                    &options
                };
                let pick = pool[rng.random_range(0..pool.len())];
                if ends.contains(&pick) {
                    break;
                }
                g.consume(pick).unwrap();
                tokens.push(pick);
            }
            let text = tokenizer.decode(&tokens, false).unwrap();
            let value: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{name} seed {seed}: {text:?} does not parse: {e}"));
            if let Err(e) = validator.validate(&value) {
                panic!("{name} seed {seed}: {text:?} violates the schema: {e}");
            }
            distinct.insert(value.to_string());
        }
    }
    // The walks explore: nearly every one ends in a different value.
    assert!(
        distinct.len() as u64 > WALKS_PER_SCHEMA * 4,
        "{}",
        distinct.len()
    );
}
