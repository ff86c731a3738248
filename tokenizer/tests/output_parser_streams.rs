//! Output parsers over generated streams of every tool-call format: the events do not depend
//! on how the text was split into pieces, no content ever carries a format's opening marker,
//! every call written comes back, and a stream cut anywhere by a token limit ends with neither
//! an error, nor a half call, nor markup.

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Value, json};
use tokenizer::{Family, OutputParser, ParserConfig, ParserEvent, ToolCall, ToolCallFormat};

/// One thing a model may write.
#[derive(Debug, Clone)]
enum Part {
    Text(String),
    Call(ToolCall),
    /// Several calls the format writes in one go (a Mistral list, generic `tool_calls`).
    Calls(Vec<ToolCall>),
    /// A generic `{"response": …}` answer; `ascii` writes non-ASCII as `\u` escapes.
    Response {
        text: String,
        ascii: bool,
    },
}

fn tool_call() -> impl Strategy<Value = ToolCall> {
    ("[a-z_]{1,8}", "[a-z]{0,4}", "\\PC{0,6}").prop_map(|(name, key, value)| ToolCall {
        name,
        arguments: if key.is_empty() {
            json!({})
        } else {
            json!({ key: value, "n": [1, {"deep": true}] })
        },
    })
}

/// Plain text: no character that could open any format's markup.
fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 .,!?\n\té日😀]{1,12}"
}

fn ws() -> impl Strategy<Value = String> {
    "[ \n]{0,3}"
}

fn call_json(call: &ToolCall) -> Value {
    json!({"name": call.name, "arguments": call.arguments})
}

/// A JSON string literal, its non-ASCII characters escaped (surrogate pairs beyond the BMP)
/// when `ascii`.
fn string_literal(text: &str, ascii: bool) -> String {
    let plain = Value::String(text.to_string()).to_string();
    if !ascii {
        return plain;
    }
    let mut out = String::new();
    for c in plain.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

fn render(format: ToolCallFormat, parts: &[(Part, String)]) -> String {
    let mut out = String::new();
    for (part, space) in parts {
        match (format, part) {
            (_, Part::Text(text)) => out.push_str(text),
            (ToolCallFormat::Hermes, Part::Call(call)) => {
                out.push_str(&format!("<tool_call>\n{}\n</tool_call>", call_json(call)));
            }
            (ToolCallFormat::Mistral, Part::Calls(calls)) => {
                let list: Vec<Value> = calls.iter().map(call_json).collect();
                out.push_str(&format!("[TOOL_CALLS]{}", Value::Array(list)));
            }
            (ToolCallFormat::Mistral, Part::Call(call)) => {
                out.push_str(&format!(
                    "[TOOL_CALLS]{}[ARGS]{}",
                    call.name, call.arguments
                ));
            }
            (ToolCallFormat::Llama3Json, Part::Call(call)) => {
                out.push_str(&json!({"name": call.name, "parameters": call.arguments}).to_string());
            }
            (ToolCallFormat::Generic, Part::Call(call)) => {
                out.push_str(&json!({"tool_call": call_json(call)}).to_string());
            }
            (ToolCallFormat::Generic, Part::Calls(calls)) => {
                let list: Vec<Value> = calls.iter().map(call_json).collect();
                out.push_str(&json!({"tool_calls": list}).to_string());
            }
            (ToolCallFormat::Generic, Part::Response { text, ascii }) => {
                out.push_str(&format!(
                    "{{\"response\": {}}}",
                    string_literal(text, *ascii)
                ));
            }
            (format, part) => unreachable!("{part:?} is not generated for {format:?}"),
        }
        out.push_str(space);
    }
    out
}

fn calls_of(parts: &[(Part, String)]) -> Vec<ToolCall> {
    parts
        .iter()
        .flat_map(|(part, _)| match part {
            Part::Call(call) => vec![call.clone()],
            Part::Calls(calls) => calls.clone(),
            _ => Vec::new(),
        })
        .collect()
}

/// A stream as each format's model writes one.
fn stream(format: ToolCallFormat) -> BoxedStrategy<Vec<(Part, String)>> {
    let text_part = text().prop_map(Part::Text);
    let call = tool_call().prop_map(Part::Call);
    let calls = prop::collection::vec(tool_call(), 1..3).prop_map(Part::Calls);
    let response =
        ("\\PC{0,10}", any::<bool>()).prop_map(|(text, ascii)| Part::Response { text, ascii });
    match format {
        // Text and calls in any order.
        ToolCallFormat::Hermes => {
            prop::collection::vec((prop_oneof![text_part, call], ws()), 0..5).boxed()
        }
        ToolCallFormat::Mistral => prop::collection::vec(
            (prop_oneof![text_part, call, calls], Just(String::new())),
            0..5,
        )
        .boxed(),
        // A Llama 3 reply is a call or an answer.
        ToolCallFormat::Llama3Json => prop_oneof![call, text_part]
            .prop_map(|part| vec![(part, String::new())])
            .boxed(),
        // Reply objects, then possibly plain text (a model that left the format).
        ToolCallFormat::Generic => (
            prop::collection::vec((prop_oneof![call, calls, response], ws()), 0..4),
            prop::option::of(text()),
        )
            .prop_map(|(mut parts, tail)| {
                parts.extend(tail.map(|t| (Part::Text(t), String::new())));
                parts
            })
            .boxed(),
        ToolCallFormat::None => prop::collection::vec((text_part, ws()), 0..3).boxed(),
    }
}

fn config(format: ToolCallFormat) -> ParserConfig {
    match format {
        ToolCallFormat::Hermes => Family::ChatMl.parser_config(),
        ToolCallFormat::Mistral => Family::Mistral.parser_config(),
        ToolCallFormat::Llama3Json => Family::Llama3.parser_config(),
        ToolCallFormat::Generic | ToolCallFormat::None => ParserConfig {
            tool_calls: format,
            ..ParserConfig::default()
        },
    }
}

/// The opening markers of `format`: none may ever reach content.
fn markers(format: ToolCallFormat) -> &'static [&'static str] {
    match format {
        ToolCallFormat::None => &[],
        ToolCallFormat::Hermes => &["<tool_call>", "</tool_call>"],
        ToolCallFormat::Llama3Json => &["<|python_tag|>", "\"name\""],
        ToolCallFormat::Mistral => &["[TOOL_CALLS]", "[ARGS]"],
        ToolCallFormat::Generic => &["\"tool_call", "\"response\""],
    }
}

/// Joins adjacent content so streams split differently compare equal.
fn coalesce(events: Vec<ParserEvent>) -> Vec<ParserEvent> {
    let mut out: Vec<ParserEvent> = Vec::new();
    for event in events {
        match (out.last_mut(), event) {
            (Some(ParserEvent::Content(a)), ParserEvent::Content(b)) => a.push_str(&b),
            (Some(ParserEvent::Thinking(a)), ParserEvent::Thinking(b)) => a.push_str(&b),
            (_, event) => out.push(event),
        }
    }
    out
}

/// `text` cut at `cuts` (snapped to character boundaries).
fn pieces<'t>(text: &'t str, cuts: &[Index]) -> Vec<&'t str> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|i| {
            let mut at = i.index(text.len() + 1);
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            at
        })
        .collect();
    at.sort_unstable();
    at.dedup();
    let mut out = Vec::new();
    let mut from = 0;
    for to in at.into_iter().chain([text.len()]) {
        out.push(&text[from..to]);
        from = to;
    }
    out
}

/// Every event of `pieces` fed in order, then `finish` (or `finish_cut_off`), checked to carry
/// no marker in content.
fn parse(format: ToolCallFormat, pieces: &[&str], cut_off: bool) -> Vec<ParserEvent> {
    let mut parser = OutputParser::new(config(format));
    let mut events = Vec::new();
    for piece in pieces {
        events.extend(parser.push(piece));
    }
    events.extend(if cut_off {
        parser.finish_cut_off()
    } else {
        parser.finish()
    });
    for event in &events {
        if let ParserEvent::Content(content) = event {
            for marker in markers(format) {
                assert!(
                    !content.contains(marker),
                    "{marker} reached content {content:?} from {pieces:?}"
                );
            }
        }
    }
    coalesce(events)
}

fn calls(events: &[ParserEvent]) -> Vec<ToolCall> {
    events
        .iter()
        .filter_map(|e| match e {
            ParserEvent::ToolCall(call) => Some(call.clone()),
            _ => None,
        })
        .collect()
}

fn check(format: ToolCallFormat, parts: &[(Part, String)], cuts: &[Index], end: Index) {
    let text = render(format, parts);
    let whole = parse(format, &[&text], false);
    assert!(
        !whole.iter().any(|e| matches!(e, ParserEvent::Error(_))),
        "{whole:?} from {text:?}"
    );
    assert_eq!(calls(&whole), calls_of(parts), "from {text:?}");
    assert_eq!(
        parse(format, &pieces(&text, cuts), false),
        whole,
        "{text:?}"
    );
    // Whitespace-only content never sits beside calls (a generic answer streams before a
    // later object could show it sits beside one; under a grammar there is one object).
    let answers = parts
        .iter()
        .any(|(p, _)| matches!(p, Part::Response { .. }));
    if !calls(&whole).is_empty() && !answers {
        for event in &whole {
            if let ParserEvent::Content(c) = event {
                assert!(!c.trim().is_empty(), "{whole:?} from {text:?}");
            }
        }
    }
    // Cut by a token limit anywhere: calls so far (a prefix of all), never an error.
    let mut at = end.index(text.len() + 1);
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let cut = parse(format, &pieces(&text[..at], cuts), true);
    assert!(
        !cut.iter().any(|e| matches!(e, ParserEvent::Error(_))),
        "{cut:?} from {:?}",
        &text[..at]
    );
    let so_far = calls(&cut);
    assert_eq!(
        so_far[..],
        calls_of(parts)[..so_far.len()],
        "{:?}",
        &text[..at]
    );
}

fn splits() -> impl Strategy<Value = (Vec<Index>, Index)> {
    (prop::collection::vec(any::<Index>(), 0..10), any::<Index>())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn hermes_streams(parts in stream(ToolCallFormat::Hermes), (cuts, end) in splits()) {
        check(ToolCallFormat::Hermes, &parts, &cuts, end);
    }

    #[test]
    fn mistral_streams(parts in stream(ToolCallFormat::Mistral), (cuts, end) in splits()) {
        check(ToolCallFormat::Mistral, &parts, &cuts, end);
    }

    #[test]
    fn llama3_streams(parts in stream(ToolCallFormat::Llama3Json), (cuts, end) in splits()) {
        check(ToolCallFormat::Llama3Json, &parts, &cuts, end);
    }

    #[test]
    fn generic_streams(parts in stream(ToolCallFormat::Generic), (cuts, end) in splits()) {
        check(ToolCallFormat::Generic, &parts, &cuts, end);
    }

    #[test]
    fn plain_streams(parts in stream(ToolCallFormat::None), (cuts, end) in splits()) {
        check(ToolCallFormat::None, &parts, &cuts, end);
    }

    /// A generic answer comes back exactly, however it was escaped and split.
    #[test]
    fn generic_answers_are_decoded(text in "\\PC{0,16}", ascii: bool, (cuts, _) in splits()) {
        let parts = [(Part::Response { text: text.clone(), ascii }, String::new())];
        let rendered = render(ToolCallFormat::Generic, &parts);
        let events = parse(ToolCallFormat::Generic, &pieces(&rendered, &cuts), false);
        let expected = if text.is_empty() { vec![] } else { vec![ParserEvent::Content(text)] };
        prop_assert_eq!(events, expected);
    }
}
