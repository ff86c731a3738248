//! Schemas the compiler cannot turn into a usable grammar — references with no way out,
//! absurd nesting and breadth, compiles that run too long — are errors naming the problem,
//! returned within the compile deadline and carrying none of the parser's internal state;
//! recursion that can end still compiles and constrains.

mod support;

use std::time::Duration;

use grammar::{Error, GrammarSpec, Limits};
use serde_json::{Value, json};
use support::{smollm2, smollm2_compiler};

fn compile_error(schema: Value) -> Error {
    let compiler = smollm2_compiler().expect("checked by the caller");
    match compiler.compile(&GrammarSpec::JsonSchema(schema.clone())) {
        Ok(_) => panic!("{schema} compiled"),
        Err(e) => e,
    }
}

/// What no client may ever see in a message.
fn assert_no_internals(message: &str) {
    for leak in [
        "<state>",
        "<grammar>",
        "non-verbose",
        "Tokens:",
        "Parser:",
        "/work/",
        "/root/",
    ] {
        assert!(!message.contains(leak), "{message:?} leaks {leak:?}");
    }
}

#[test]
fn references_with_no_way_out_are_named() {
    if smollm2().is_none() {
        return;
    }
    let cases = [
        (json!({"$ref": "#"}), "`#` refers back to itself"),
        (
            json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                   "$ref": "#/$defs/a"}),
            "`#/$defs/a` and `#/$defs/b` refer back to one another",
        ),
        (
            json!({"anyOf": [{"$ref": "#"}]}),
            "`#` refers back to itself",
        ),
        (
            json!({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}),
            "`#` refers back to itself",
        ),
    ];
    for (schema, named) in cases {
        match compile_error(schema.clone()) {
            Error::Unsatisfiable { kind, reason } => {
                assert_eq!(kind, "JSON schema");
                assert!(reason.contains(named), "{schema}: {reason}");
                assert_no_internals(&reason);
            }
            other => panic!("{schema}: expected Unsatisfiable, got {other}"),
        }
    }
}

#[test]
fn a_grammar_no_token_can_start_is_refused_at_compile_time() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    // A rule that only ever derives itself, which the schema checks never see: it must be
    // refused when compiled, not fail at its first mask in the middle of a request.
    let spec = GrammarSpec::Lark("start: a\na: start".into());
    match compiler.compile(&spec) {
        Ok(_) => panic!("a grammar with no sentence compiled"),
        Err(e) => {
            assert!(
                matches!(e, Error::Unsatisfiable { .. } | Error::Invalid { .. }),
                "{e}"
            );
            assert_no_internals(&e.to_string());
        }
    }
}

#[test]
fn recursion_that_can_end_still_constrains() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    let tokenizer = smollm2().unwrap();
    let tree = json!({"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#"}}},
        "additionalProperties": false});
    let mut g = compiler.compile(&GrammarSpec::JsonSchema(tree)).unwrap();
    let text = r#"{"children": [{"children": []}, {}]}"#;
    for t in tokenizer.encode(text, false).unwrap() {
        let mask = g.mask().unwrap();
        assert!(
            mask[t as usize / 32] >> (t % 32) & 1 == 1,
            "{t} of {text:?}"
        );
        g.consume(t).unwrap();
    }
    assert!(g.is_accepting());
    // A property the schema does not have is refused.
    let mut g = compiler
        .compile(&GrammarSpec::JsonSchema(
            json!({"type": "object", "properties": {
            "children": {"type": "array", "items": {"$ref": "#"}}},
            "additionalProperties": false}),
        ))
        .unwrap();
    let tokens = tokenizer.encode(r#"{"parent": 1}"#, false).unwrap();
    let refused = tokens.iter().any(|&t| g.consume(t).is_err());
    assert!(refused, "`parent` was allowed");
}

/// A schema nested `levels` deep, built without recursion (`json!` would serialize the
/// inner value at every level).
fn nested(levels: usize) -> Value {
    (0..levels).fold(json!({"type": "string"}), |inner, _| {
        let mut properties = serde_json::Map::new();
        properties.insert("a".into(), inner);
        let mut level = serde_json::Map::new();
        level.insert("type".into(), json!("object"));
        level.insert("properties".into(), Value::Object(properties));
        Value::Object(level)
    })
}

/// Takes `value` apart level by level: dropping a 10,000-deep value recursively would
/// overflow the test's own stack, which is not what is being tested.
fn dismantle(value: Value) {
    let mut stack = vec![value];
    while let Some(mut v) = stack.pop() {
        match &mut v {
            Value::Object(map) => stack.extend(std::mem::take(map).into_iter().map(|(_, v)| v)),
            Value::Array(items) => stack.append(items),
            _ => {}
        }
    }
}

#[test]
fn absurd_nesting_and_breadth_are_refused_by_name() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    // 10,000 levels: refused before anything walks it recursively, on this thread's
    // ordinary stack.
    let deep = GrammarSpec::JsonSchema(nested(10_000));
    let outcome = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let result = compiler.compile(&deep).map(|_| ());
            if let GrammarSpec::JsonSchema(value) = deep {
                dismantle(value);
            }
            result
        })
        .unwrap()
        .join()
        .expect("no stack overflow");
    assert!(
        matches!(
            outcome,
            Err(Error::TooLarge {
                what: "schema nesting depth",
                actual: 20_001,
                ..
            })
        ),
        "{outcome:?}"
    );

    let huge_enum = json!({"enum": (0..100_000).collect::<Vec<_>>()});
    let e = compile_error(huge_enum);
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    let wide_enum = json!({"enum": (0..5_000).collect::<Vec<_>>()});
    let e = compile_error(wide_enum);
    assert!(
        e.to_string()
            .contains("alternatives of one anyOf/oneOf/allOf/enum is too large: 5000"),
        "{e}"
    );

    let patterns: serde_json::Map<_, _> = (0..200)
        .map(|i| (format!("^p{i}[a-z]*$"), json!({"type": "integer"})))
        .collect();
    let e = compile_error(json!({"type": "object", "patternProperties": patterns}));
    assert!(e.to_string().contains("pairs of patternProperties"), "{e}");
}

#[test]
fn a_compile_past_its_deadline_is_an_error_at_once() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    // 200 patterns, allowed here, cost the compiler ~20,000 regex comparisons: far more
    // than the 1 ms it is given.
    let compiler = compiler.with_limits(Limits {
        max_pattern_pairs: usize::MAX,
        max_compile_time: Duration::from_millis(1),
        ..Limits::default()
    });
    let patterns: serde_json::Map<_, _> = (0..200)
        .map(|i| (format!("^q{i}[a-z]*$"), json!({"type": "integer"})))
        .collect();
    let spec = GrammarSpec::JsonSchema(json!({"type": "object", "patternProperties": patterns}));
    match compiler.compile(&spec) {
        Err(Error::CompileTimeout { limit }) => assert_eq!(limit, Duration::from_millis(1)),
        Err(other) => panic!("expected a timeout, got {other}"),
        Ok(_) => panic!("compiled within 1 ms"),
    }
}
