//! Output parsers: every split of a stream gives the one-shot result, raw tags never reach
//! content, and a parse failure is reported once.

use serde_json::json;
use tokenizer::{Family, OutputParser, ParserConfig, ParserEvent, ToolCall, ToolCallFormat};

/// Joins adjacent content/thinking events so streams split differently compare equal.
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

fn run(config: &ParserConfig, pieces: &[&str]) -> Vec<ParserEvent> {
    let mut parser = OutputParser::new(config.clone());
    let mut events = Vec::new();
    for piece in pieces {
        events.extend(parser.push(piece));
    }
    events.extend(parser.finish());
    // Nothing after finish.
    assert!(parser.push("more").is_empty());
    coalesce(events)
}

/// Feeds `text` whole, then split at every char boundary into two and into single chars, and
/// checks every result equals the one-shot parse; returns it.
fn parse_every_split(config: &ParserConfig, text: &str) -> Vec<ParserEvent> {
    let whole = run(config, &[text]);
    for (at, _) in text.char_indices().skip(1) {
        assert_eq!(
            run(config, &[&text[..at], &text[at..]]),
            whole,
            "split at {at} of {text:?}"
        );
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(run(config, &pieces), whole, "char by char: {text:?}");
    // The tags this configuration recognises never reach content.
    let mut tags: Vec<&str> = match config.tool_calls {
        ToolCallFormat::None => vec![],
        ToolCallFormat::Hermes => vec!["<tool_call>", "</tool_call>"],
        ToolCallFormat::Llama3Json => vec!["<|python_tag|>"],
        ToolCallFormat::Mistral => vec!["[TOOL_CALLS]", "[ARGS]"],
        ToolCallFormat::Generic => vec!["\"tool_call"],
    };
    if let Some(t) = &config.thinking {
        tags.extend([t.open.as_str(), t.close.as_str()]);
    }
    for event in &whole {
        if let ParserEvent::Content(c) = event {
            for tag in &tags {
                assert!(!c.contains(tag), "raw tag {tag} leaked into content: {c:?}");
            }
        }
    }
    whole
}

fn content(s: &str) -> ParserEvent {
    ParserEvent::Content(s.into())
}
fn thinking(s: &str) -> ParserEvent {
    ParserEvent::Thinking(s.into())
}
fn call(name: &str, arguments: serde_json::Value) -> ParserEvent {
    ParserEvent::ToolCall(ToolCall {
        name: name.into(),
        arguments,
    })
}

#[test]
fn qwen3_thinking_and_content() {
    let cfg = Family::Qwen3.parser_config();
    let text = "<think>\nLet me add 2 and 2.\n</think>\n\nThe answer is 4.";
    assert_eq!(
        parse_every_split(&cfg, text),
        [thinking("Let me add 2 and 2."), content("The answer is 4.")]
    );
}

#[test]
fn think_false_drops_reasoning_and_tags() {
    let cfg = Family::Qwen3.parser_config().with_think(false);
    let text = "<think>\nsecret reasoning\n</think>\n\nVisible.";
    assert_eq!(parse_every_split(&cfg, text), [content("Visible.")]);
    // The empty block Qwen3 emits with enable_thinking=false never shows.
    assert_eq!(
        parse_every_split(&cfg, "<think>\n\n</think>\n\nHi"),
        [content("Hi")]
    );
}

#[test]
fn prompt_opened_thinking_starts_inside_the_block() {
    let cfg = Family::Qwen3.parser_config();
    assert!(cfg.prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
    let cfg = cfg.starting_in_thinking(true);
    assert_eq!(
        parse_every_split(&cfg, "hmm  \n</think>\n\nDone"),
        [thinking("hmm"), content("Done")]
    );
}

#[test]
fn hermes_tool_calls_between_content() {
    let cfg = Family::Qwen3.parser_config();
    let text = "<think>\nneed weather\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}\n</tool_call>";
    assert_eq!(
        parse_every_split(&cfg, text),
        [
            thinking("need weather"),
            content("Checking."),
            call("get_weather", json!({"city": "Paris"})),
            call("get_time", json!({"tz": "CET"})),
        ]
    );
}

#[test]
fn hermes_call_cut_by_end_of_stream_is_still_parsed() {
    let cfg = Family::ChatMl.parser_config();
    let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n";
    assert_eq!(parse_every_split(&cfg, text), [call("f", json!({}))]);
}

fn cut_off(config: &ParserConfig, text: &str) -> Vec<ParserEvent> {
    let mut parser = OutputParser::new(config.clone());
    let mut events = parser.push(text);
    events.extend(parser.finish_cut_off());
    coalesce(events)
}

#[test]
fn a_call_the_token_limit_cut_off_is_dropped_not_text_nor_an_error() {
    let cfg = Family::ChatMl.parser_config();
    let cut = "Let me check.\n<tool_call>\n{\"name\": \"f\", \"argum";
    assert_eq!(cut_off(&cfg, cut), [content("Let me check.")]);
    // A call that is complete but for its closing marker is still a call.
    assert_eq!(
        cut_off(&cfg, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}"),
        [call("f", json!({}))]
    );
    // A second call cut short: the first stands, nothing of the second shows.
    let two = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n<tool_call>{\"na";
    assert_eq!(cut_off(&cfg, two), [call("f", json!({}))]);
    // A marker cut short is not text either.
    assert_eq!(cut_off(&cfg, "Hi <tool_ca"), [content("Hi")]);
    // Without the limit, the same text is a malformed call.
    let mut parser = OutputParser::new(cfg);
    let mut events = parser.push(cut);
    events.extend(parser.finish());
    assert!(
        matches!(events.last(), Some(ParserEvent::Error(_))),
        "{events:?}"
    );
}

#[test]
fn cut_off_calls_of_every_format_are_dropped() {
    let mistral = Family::Mistral.parser_config();
    assert_eq!(
        cut_off(&mistral, "Sure.[TOOL_CALLS][{\"name\": \"a"),
        [content("Sure.")]
    );
    assert_eq!(cut_off(&mistral, "[TOOL_CALLS]get[ARGS]{\"x\": "), []);
    let llama = Family::Llama3.parser_config();
    assert_eq!(cut_off(&llama, "{\"name\": \"f\", \"para"), []);
    assert_eq!(cut_off(&llama, "<|python_tag|>{\"q"), []);
    // JSON that is not a call is the answer, cut.
    assert_eq!(
        cut_off(&llama, "{\"answer\": 4"),
        [content("{\"answer\": 4")]
    );
    let generic = generic();
    assert_eq!(cut_off(&generic, "{\"tool_call\": {\"name\": \"f\""), []);
    assert_eq!(cut_off(&generic, "{\"tool_c"), []);
    assert_eq!(cut_off(&generic, "{\"response\": \"Hel"), [content("Hel")]);
    assert_eq!(
        cut_off(
            &generic,
            "{\"tool_calls\": [{\"name\": \"f\"}, {\"name\": \"g\", \"argu"
        ),
        [call("f", json!({}))]
    );
}

#[test]
fn malformed_call_is_reported_once_and_ends_the_stream() {
    let cfg = Family::Qwen3.parser_config();
    let text = "ok <tool_call>{\"name\": \"f\", \"arguments\": {oops}}</tool_call> more <tool_call>{bad}</tool_call>";
    let events = parse_every_split(&cfg, text);
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0], content("ok"));
    assert!(
        matches!(&events[1], ParserEvent::Error(e) if e.contains("not valid JSON")),
        "{events:?}"
    );
}

#[test]
fn almost_tags_are_content() {
    let cfg = Family::Qwen3.parser_config();
    let text = "a <tool_cal b <thin c </thi";
    assert_eq!(parse_every_split(&cfg, text), [content(text)]);
    // Tags of other families are plain text here.
    assert_eq!(
        parse_every_split(&cfg, "[TOOL_CALLS] x"),
        [content("[TOOL_CALLS] x")]
    );
}

#[test]
fn without_tools_tags_stay_content() {
    let cfg = Family::ChatMl.parser_config().without_tools();
    let text = "<tool_call>{\"name\": \"f\"}</tool_call>";
    assert_eq!(parse_every_split(&cfg, text), [content(text)]);
}

#[test]
fn llama3_json_call() {
    let cfg = Family::Llama3.parser_config();
    let text = "  {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
    assert_eq!(
        parse_every_split(&cfg, text),
        [call("get_weather", json!({"city": "Paris"}))]
    );
    let text = "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"rust\"}}";
    assert_eq!(
        parse_every_split(&cfg, text),
        [call("search", json!({"q": "rust"}))]
    );
}

#[test]
fn llama3_json_that_is_not_a_call_is_content() {
    let cfg = Family::Llama3.parser_config();
    let text = "{\"answer\": 42}";
    assert_eq!(parse_every_split(&cfg, text), [content(text)]);
    let text = "{not json at all";
    assert_eq!(parse_every_split(&cfg, text), [content(text)]);
    let text = "The JSON is {\"name\": \"x\", \"parameters\": {}}";
    assert_eq!(parse_every_split(&cfg, text), [content(text)]);
}

#[test]
fn mistral_calls_both_forms() {
    let cfg = Family::Mistral.parser_config();
    let text = "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]";
    assert_eq!(
        parse_every_split(&cfg, text),
        [call("a", json!({"x": 1})), call("b", json!({}))]
    );
    let text = "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[CALL_ID]abc123[ARGS]{}";
    assert_eq!(
        parse_every_split(&cfg, text),
        [
            content("Sure."),
            call("get_weather", json!({"city": "Paris"})),
            call("get_time", json!({}))
        ]
    );
    let events = parse_every_split(&cfg, "[TOOL_CALLS][{\"name\": \"a\", \"argu");
    assert!(
        matches!(&events[..], [ParserEvent::Error(e)] if e.contains("cut off")),
        "{events:?}"
    );
}

#[test]
fn plain_family_passes_everything_through() {
    let cfg = Family::Gemma.parser_config();
    let text = "Hello <tool_call> and <think> stay as written.";
    assert_eq!(parse_every_split(&cfg, text), [content(text)]);
}

#[test]
fn unicode_survives_every_split() {
    let cfg = Family::Qwen3.parser_config();
    let text = "<think>日本語で考える 🤔</think>Résumé: 完了 ✅";
    assert_eq!(
        parse_every_split(&cfg, text),
        [thinking("日本語で考える 🤔"), content("Résumé: 完了 ✅")]
    );
}

fn generic() -> ParserConfig {
    ParserConfig {
        tool_calls: ToolCallFormat::Generic,
        ..ParserConfig::default()
    }
}

#[test]
fn generic_calls_and_answers() {
    let cfg = generic();
    let one = "{\"tool_call\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}";
    assert_eq!(
        parse_every_split(&cfg, one),
        [call("get_weather", json!({"city": "Paris"}))]
    );
    let two = " \n{\"tool_calls\": [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"x\": 1}}]}\n";
    assert_eq!(
        parse_every_split(&cfg, two),
        [call("a", json!({})), call("b", json!({"x": 1}))]
    );
    // A second object after the first is read the same way.
    let again = format!("{one}\n{one}");
    assert_eq!(parse_every_split(&cfg, &again).len(), 2);
    let answer = "{\"response\": \"Caf\\u00e9 \\\"ok\\\"\\n\\ud83d\\ude00 done\"}";
    assert_eq!(
        parse_every_split(&cfg, answer),
        [content("Café \"ok\"\n😀 done")]
    );
    // Members after the answer are skipped; a non-string response is its JSON.
    assert_eq!(
        parse_every_split(
            &cfg,
            "{\"response\": \"hi\", \"extra\": [1, {\"a\": \"}\"}]}"
        ),
        [content("hi")]
    );
    assert_eq!(
        parse_every_split(&cfg, "{\"response\": {\"n\": 1}}"),
        [content("{\"n\":1}")]
    );
}

#[test]
fn generic_text_that_is_not_a_reply_object_is_content() {
    let cfg = generic();
    for text in [
        "Plain words.",
        "{\"answer\": 42}",
        "{not json",
        "Text then {\"a\": 1}",
    ] {
        assert_eq!(parse_every_split(&cfg, text), [content(text)], "{text}");
    }
}

#[test]
fn generic_answers_stream_before_the_object_closes() {
    let mut parser = OutputParser::new(generic());
    assert_eq!(parser.push("{\"response\": \"Hel"), [content("Hel")]);
    assert_eq!(parser.push("lo\\"), [content("lo")]);
    assert_eq!(parser.push("nthere\"}"), [content("\nthere")]);
    assert_eq!(parser.finish(), []);
}

#[test]
fn generic_malformed_call_is_an_error() {
    let events = parse_every_split(&generic(), "{\"tool_call\": {\"name\": 3}}");
    assert!(matches!(&events[..], [ParserEvent::Error(_)]), "{events:?}");
    let events = parse_every_split(&generic(), "{\"tool_call\": {\"name\": \"f\"");
    assert!(
        matches!(&events[..], [ParserEvent::Error(e)] if e.contains("cut off")),
        "{events:?}"
    );
}

#[test]
fn whitespace_beside_calls_is_dropped() {
    let cfg = Family::ChatMl.parser_config();
    let text = "\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n \n";
    assert_eq!(parse_every_split(&cfg, text), [call("f", json!({}))]);
    let text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n\n<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>";
    assert_eq!(
        parse_every_split(&cfg, text),
        [call("f", json!({})), call("g", json!({}))]
    );
    // Whitespace inside text stays; trailing whitespace of an answer without calls too.
    assert_eq!(parse_every_split(&cfg, "a \n b\n"), [content("a \n b\n")]);
    let mut parser = OutputParser::new(cfg);
    assert_eq!(parser.push("Hi \n"), [content("Hi")]);
    assert_eq!(parser.push("there"), [content(" \nthere")]);
}
