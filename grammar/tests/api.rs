//! The public API on the real SmolLM2 vocabulary: each grammar kind, end-token placement,
//! errors, and the state a rejected token leaves behind.

mod support;

use grammar::{Error, Grammar, GrammarSpec, Limits};
use serde_json::json;
use support::{allowed, smollm2, smollm2_compiler};

fn ids(text: &str) -> Vec<u32> {
    smollm2().unwrap().encode(text, false).unwrap()
}

fn ends_allowed(g: &mut Grammar, ends: &[u32]) -> bool {
    let mask = g.mask().unwrap();
    let set: Vec<bool> = ends
        .iter()
        .map(|&e| mask[e as usize / 32] >> (e % 32) & 1 == 1)
        .collect();
    assert!(set.iter().all(|&b| b == set[0]), "end tokens disagree");
    set[0]
}

/// Feeds `text`'s tokens, checking each is allowed and, when no proper prefix of `text` is a
/// complete output (`no_early_end`), that no end token is allowed before the last one.
fn feed(g: &mut Grammar, ends: &[u32], text: &str, no_early_end: bool) {
    let tokens = ids(text);
    for (i, &t) in tokens.iter().enumerate() {
        let mask = g.mask().unwrap();
        assert!(
            mask[t as usize / 32] >> (t % 32) & 1 == 1,
            "token {i} ({t}) of {text:?} not allowed"
        );
        if i > 0 && no_early_end {
            assert!(!ends_allowed(g, ends), "end allowed inside {text:?} at {i}");
        }
        g.consume(t).unwrap();
    }
}

#[test]
fn json_object_ends_only_when_complete() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    let ends = compiler.end_tokens().to_vec();
    assert!(!ends.is_empty());
    let mut g = compiler.compile(&GrammarSpec::JsonObject).unwrap();
    assert!(!g.is_accepting());
    feed(
        &mut g,
        &ends,
        r#"{"a": [1, 2.5, {"b": null}], "c": "x\n"}"#,
        true,
    );
    assert!(g.is_accepting());
    assert!(ends_allowed(&mut g, &ends));
    g.consume(ends[0]).unwrap();
    assert!(g.is_finished());
    assert_eq!(allowed(&g.mask().unwrap(), g.vocab_size()), ends);
}

#[test]
fn json_object_rejects_top_level_scalars_and_special_tokens() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    let mut g = compiler.compile(&GrammarSpec::JsonObject).unwrap();
    let quote = ids("\"")[0];
    assert!(matches!(g.consume(quote), Err(Error::TokenRejected { .. })));
    let im_start = smollm2().unwrap().token_to_id("<|im_start|>").unwrap();
    feed(&mut g, compiler.end_tokens(), "{\"k\": \"", true);
    let inside_string = g.mask().unwrap();
    assert_eq!(
        inside_string[im_start as usize / 32] >> (im_start % 32) & 1,
        0
    );
}

#[test]
fn whitespace_between_tokens_is_bounded() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    let mut g = compiler.compile(&GrammarSpec::JsonObject).unwrap();
    g.consume(ids("{")[0]).unwrap();
    let space = smollm2().unwrap().token_to_id("Ġ").unwrap();
    for i in 0..32 {
        g.consume(space)
            .unwrap_or_else(|e| panic!("space {i} rejected: {e}"));
    }
    assert!(matches!(g.consume(space), Err(Error::TokenRejected { .. })));
}

#[test]
fn rejected_token_leaves_state_unchanged() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    let ends = compiler.end_tokens().to_vec();
    let mut g = compiler
        .compile(&GrammarSpec::JsonSchema(json!({"type": "integer"})))
        .unwrap();
    let before = g.mask().unwrap();
    assert!(matches!(
        g.consume(ids("a")[0]),
        Err(Error::TokenRejected { token: _, .. })
    ));
    assert!(matches!(
        g.consume(u32::MAX),
        Err(Error::TokenRejected { .. })
    ));
    assert!(matches!(
        g.consume(ends[0]),
        Err(Error::TokenRejected { .. })
    ));
    assert_eq!(g.mask().unwrap(), before);
    feed(&mut g, &ends, "42", false);
    assert!(g.is_accepting());
}

#[test]
fn regex_and_lark_grammars_constrain_the_whole_output() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    let ends = compiler.end_tokens().to_vec();
    let mut g = compiler
        .compile(&GrammarSpec::Regex("[0-9]{3}-[a-z]{2}".into()))
        .unwrap();
    feed(&mut g, &ends, "123-ab", true);
    assert!(g.is_accepting());
    assert_eq!(allowed(&g.mask().unwrap(), g.vocab_size()), ends);

    let lark = r#"start: answer " because " reason
answer: "yes" | "no"
reason: /[a-z ]{1,20}/"#;
    let mut g = compiler.compile(&GrammarSpec::Lark(lark.into())).unwrap();
    assert!(matches!(
        g.consume(ids("maybe")[0]),
        Err(Error::TokenRejected { .. })
    ));
    feed(&mut g, &ends, "yes because it is", false);
    assert!(g.is_accepting());
}

#[test]
fn end_token_after_finish_rolls_back() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    let ends = compiler.end_tokens().to_vec();
    let mut g = compiler
        .compile(&GrammarSpec::JsonSchema(json!({"enum": ["red", "green"]})))
        .unwrap();
    let start = g.mask().unwrap();
    let tokens = ids("\"red\"");
    for &t in &tokens {
        g.consume(t).unwrap();
    }
    let done = g.mask().unwrap();
    g.consume(ends[0]).unwrap();
    assert!(g.is_finished());
    assert_eq!(g.validate(&[ends[0], tokens[0]]).unwrap(), 1);
    g.rollback(1).unwrap();
    assert_eq!(g.mask().unwrap(), done);
    g.rollback(tokens.len()).unwrap();
    assert_eq!(g.mask().unwrap(), start);
    assert!(matches!(g.rollback(1), Err(Error::Rollback { .. })));
}

#[test]
fn invalid_and_unsupported_schemas_are_errors_with_the_compiler_message() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    let invalid = [
        json!({"type": "strin"}),
        json!({"type": "string", "pattern": "(unclosed"}),
        json!({"type": "integer", "minimum": 5, "maximum": 1}),
    ];
    for schema in invalid {
        match compiler.compile(&GrammarSpec::JsonSchema(schema.clone())) {
            Err(Error::Invalid { kind, message }) => {
                assert_eq!(kind, "JSON schema");
                assert!(!message.is_empty());
            }
            Err(other) => panic!("{schema}: expected Invalid, got {other}"),
            Ok(_) => panic!("{schema}: compiled"),
        }
    }
    let unsupported = [
        json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true}),
        json!({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}),
    ];
    for schema in unsupported {
        match compiler.compile(&GrammarSpec::JsonSchema(schema.clone())) {
            Err(Error::Unsupported(message)) => assert!(message.starts_with("JSON schema: ")),
            Err(other) => panic!("{schema}: expected Unsupported, got {other}"),
            Ok(_) => panic!("{schema}: compiled"),
        }
    }
    assert!(matches!(
        compiler.compile(&GrammarSpec::Regex("(".into())),
        Err(Error::Invalid {
            kind: "regular expression",
            ..
        })
    ));
    assert!(matches!(
        compiler.compile(&GrammarSpec::Lark("start: undefined_rule".into())),
        Err(Error::Invalid {
            kind: "Lark grammar",
            ..
        })
    ));
}

#[test]
fn cached_compiles_start_fresh_and_independent() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    let spec = GrammarSpec::JsonSchema(json!({"type": "array", "items": {"type": "integer"}}));
    let mut first = compiler.compile(&spec).unwrap();
    let start = first.mask().unwrap();
    first.consume(ids("[")[0]).unwrap();
    let mut second = compiler.compile(&spec).unwrap();
    assert_eq!(second.mask().unwrap(), start);
    let again = grammar::GrammarCompiler::new(smollm2().unwrap()).unwrap();
    assert_eq!(again.compile(&spec).unwrap().mask().unwrap(), start);
    let mut fork = first.fork();
    fork.consume(ids("1")[0]).unwrap();
    assert_ne!(fork.mask().unwrap(), first.mask().unwrap());
}

#[test]
fn thinking_region_must_close_before_the_constrained_output() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    let ends = compiler.end_tokens().to_vec();
    let spec = GrammarSpec::AfterThinking {
        open: "<think>".into(),
        close: "</think>".into(),
        already_open: false,
        then: Box::new(GrammarSpec::JsonSchema(json!({"enum": ["red", "green"]}))),
    };
    let mut g = compiler.compile(&spec).unwrap();
    assert!(matches!(
        g.consume(ids("\"")[0]),
        Err(Error::TokenRejected { .. })
    ));
    // Inside the region anything goes, JSON-looking text included, but the output may not end.
    feed(
        &mut g,
        &ends,
        "<think>maybe {\"red\"} or \"green\"? </thin k> hmm</think>\n\"green\"",
        true,
    );
    assert!(g.is_accepting());

    let opened = GrammarSpec::AfterThinking {
        open: "<think>".into(),
        close: "</think>".into(),
        already_open: true,
        then: Box::new(GrammarSpec::Regex("[0-9]+".into())),
    };
    let mut g = compiler.compile(&opened).unwrap();
    feed(&mut g, &ends, "7 is it</think>", true);
    assert!(!g.is_accepting());
    feed(&mut g, &ends, "42", false);
    assert!(g.is_accepting());

    // SmolLM2 holds these markers as special tokens: they are matched as those tokens.
    let tokenizer = smollm2().unwrap();
    let open_id = tokenizer.token_to_id("<filename>").unwrap();
    let close_id = tokenizer.token_to_id("<file_sep>").unwrap();
    let special = GrammarSpec::AfterThinking {
        open: "<filename>".into(),
        close: "<file_sep>".into(),
        already_open: false,
        then: Box::new(GrammarSpec::JsonObject),
    };
    let mut g = compiler.compile(&special).unwrap();
    assert_eq!(allowed(&g.mask().unwrap(), g.vocab_size()), vec![open_id]);
    g.consume(open_id).unwrap();
    feed(&mut g, &ends, "a.txt", true);
    g.consume(close_id).unwrap();
    feed(&mut g, &ends, "{}", true);
    assert!(g.is_accepting());

    let lark_after = GrammarSpec::AfterThinking {
        open: "<think>".into(),
        close: "</think>".into(),
        already_open: false,
        then: Box::new(GrammarSpec::Lark("start: \"x\"".into())),
    };
    assert!(matches!(
        compiler.compile(&lark_after),
        Err(Error::Unsupported(_))
    ));
}

fn weather_call() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "arguments": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                "required": ["city", "days"],
                "additionalProperties": false
            }
        },
        "required": ["name", "arguments"],
        "additionalProperties": false
    })
}

#[test]
fn tool_calls_are_pinned_to_their_schemas() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    let ends = compiler.end_tokens().to_vec();
    let spec = |required, parallel| GrammarSpec::ToolCalls {
        open: "<tool_call>".into(),
        close: "</tool_call>".into(),
        calls: vec![
            weather_call(),
            json!({"type": "object", "properties": {"name": {"const": "now"}}, "required": ["name"], "additionalProperties": false}),
        ],
        required,
        parallel,
    };
    // Optional calls: plain text may end the output.
    let mut g = compiler.compile(&spec(false, true)).unwrap();
    feed(&mut g, &ends, "Sure, no tools needed.", false);
    assert!(g.is_accepting());

    // Text, then a call whose body must match one schema, then another call.
    let mut g = compiler.compile(&spec(false, true)).unwrap();
    feed(&mut g, &ends, "Checking.\n<tool_call>\n", false);
    assert!(!g.is_accepting());
    let before_body = g.mask().unwrap();
    assert!(matches!(
        g.consume(ids("hello")[0]),
        Err(Error::TokenRejected { .. })
    ));
    assert_eq!(g.mask().unwrap(), before_body);
    feed(
        &mut g,
        &ends,
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 3}}\n</tool_call>",
        true,
    );
    assert!(g.is_accepting());
    // After a call only another call (or whitespace) may follow, never free text.
    let mut after = g.fork();
    assert!(matches!(
        after.consume(ids("Done")[0]),
        Err(Error::TokenRejected { .. })
    ));
    feed(&mut g, &ends, "\n", false);
    feed(
        &mut g,
        &ends,
        "<tool_call>{\"name\": \"now\"}</tool_call>",
        true,
    );
    assert!(g.is_accepting());

    // A call whose arguments break the schema is cut off where it breaks.
    let mut g = compiler.compile(&spec(false, true)).unwrap();
    feed(
        &mut g,
        &ends,
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": ",
        false,
    );
    assert!(matches!(
        g.consume(ids("9")[0]),
        Err(Error::TokenRejected { .. })
    ));

    // Required: the output opens with a call; no text, not even whitespace, comes first.
    let mut g = compiler.compile(&spec(true, true)).unwrap();
    assert!(!g.is_accepting());
    for early in ["Sure", "\n", " "] {
        assert!(matches!(
            g.consume(ids(early)[0]),
            Err(Error::TokenRejected { .. })
        ));
    }
    feed(
        &mut g,
        &ends,
        "<tool_call>{\"name\": \"now\"}</tool_call>",
        true,
    );
    assert!(g.is_accepting());

    // Not parallel: one call, then only whitespace and the end.
    let mut g = compiler.compile(&spec(false, false)).unwrap();
    feed(
        &mut g,
        &ends,
        "<tool_call>{\"name\": \"now\"}</tool_call>\n",
        false,
    );
    assert!(g.is_accepting());
    assert!(matches!(
        g.consume(ids("<")[0]),
        Err(Error::TokenRejected { .. })
    ));
}

/// A tool's parameters as Pydantic writes them: nested models in local `$defs`.
fn pydantic_call(name: &str) -> serde_json::Value {
    let mut parameters = json!({
        "$defs": {"Inner": {"type": "object", "properties": {"x": {"type": "integer"}},
                            "required": ["x"], "additionalProperties": false}},
        "type": "object",
        "properties": {"inner": {"$ref": "#/$defs/Inner"}},
        "required": ["inner"],
        "additionalProperties": false
    });
    grammar::rebase_refs(&mut parameters, "/properties/arguments");
    json!({
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": false
    })
}

#[test]
fn tools_with_local_definitions_compile_and_constrain() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    let ends = compiler.end_tokens().to_vec();
    let spec = GrammarSpec::ToolCalls {
        open: "<tool_call>".into(),
        close: "</tool_call>".into(),
        calls: vec![pydantic_call("first"), pydantic_call("second")],
        required: true,
        parallel: false,
    };
    let mut g = compiler.compile(&spec).unwrap();
    feed(
        &mut g,
        &ends,
        "<tool_call>\n{\"name\": \"second\", \"arguments\": {\"inner\": {\"x\": 4}}}\n</tool_call>",
        true,
    );
    assert!(g.is_accepting());
    // The definition is enforced, not merely resolved.
    let mut g = compiler.compile(&spec).unwrap();
    feed(
        &mut g,
        &ends,
        "<tool_call>\n{\"name\": \"first\", \"arguments\": {\"inner\": {\"x\": ",
        true,
    );
    assert!(g.consume(ids("\"")[0]).is_err(), "x is an integer");
}

/// A chain of definitions, each only a reference to the next.
fn reference_chain(n: usize) -> serde_json::Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        defs.insert(
            format!("d{i}"),
            json!({"$ref": format!("#/$defs/d{}", i + 1)}),
        );
    }
    defs.insert(format!("d{n}"), json!({"type": "string"}));
    json!({"$ref": "#/$defs/d0", "$defs": defs})
}

#[test]
fn long_reference_chains_are_refused_and_never_overflow_the_callers_stack() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    let chain = GrammarSpec::JsonSchema(reference_chain(600));
    assert!(matches!(
        compiler.compile(&chain),
        Err(Error::TooLarge {
            what: "chain of `$ref` references",
            ..
        })
    ));
    // With the cap lifted, the compile runs on a stack of its own: this test's thread has
    // the default 2 MiB, on which the same compile used to abort the process.
    let Some(uncapped) = smollm2_compiler() else {
        return;
    };
    let uncapped = uncapped.with_limits(Limits {
        max_reference_depth: usize::MAX,
        ..Limits::default()
    });
    let outcome = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || uncapped.compile(&chain).map(|_| ()))
        .unwrap()
        .join()
        .expect("the compile thread survives");
    if let Err(e) = outcome {
        assert!(!e.to_string().is_empty());
    }
}

#[test]
fn the_widest_object_allowed_walks_within_the_parsers_row_limit() {
    let Some(compiler) = smollm2_compiler() else {
        return;
    };
    let ends = compiler.end_tokens().to_vec();
    let n = Limits::default().max_properties;
    let properties: serde_json::Map<_, _> = (0..n)
        .map(|i| (format!("p{i}"), json!({"type": "integer"})))
        .collect();
    // Every property optional: the case whose parser rows grow with the property count.
    let spec = GrammarSpec::JsonSchema(json!({"type": "object", "properties": properties}));
    let mut g = compiler.compile(&spec).unwrap();
    feed(
        &mut g,
        &ends,
        &format!("{{\"p0\": 1, \"p{}\": 2}}", n - 1),
        true,
    );
    assert!(g.is_accepting());
}
