//! The generic tool-call format, for models whose chat template has no tool section: the whole
//! reply is one JSON object, `{"tool_call": {"name": …, "arguments": {…}}}`,
//! `{"tool_calls": [{…}, …]}` or `{"response": "…"}` (llama.cpp's "generic" chat format is the
//! precedent). A grammar holds the model to it; this file reads it back while it streams.
//!
//! The answer inside `{"response": "…"}` is decoded as it arrives, so it streams like any
//! other content instead of waiting for the object to close.

use serde_json::Value;

use super::ToolCall;
use super::tool_call::{JsonPrefix, call_from_object, json_prefix, mistral_calls};

/// The key of a single call.
pub const CALL_KEY: &str = "tool_call";
/// The key of a list of calls.
pub const CALLS_KEY: &str = "tool_calls";
/// The key of an answer.
pub const RESPONSE_KEY: &str = "response";

/// JSON's whitespace (not Unicode's: a reply object never starts with a no-break space).
pub(super) fn skip_ws(text: &str) -> &str {
    text.trim_start_matches([' ', '\t', '\n', '\r'])
}

/// The first key of an object whose text starts at `text` (with its `{`).
enum FirstKey<'t> {
    /// The key is complete; the text after its closing quote.
    Complete(&'t str, &'t str),
    /// The key has begun; what there is of it.
    Partial(&'t str),
    /// Nothing after `{` but whitespace yet.
    NotYet,
    /// Not an object, or one that does not start with a key.
    None,
}

fn first_key(text: &str) -> FirstKey<'_> {
    let Some(rest) = text.strip_prefix('{') else {
        return FirstKey::None;
    };
    let rest = skip_ws(rest);
    if rest.is_empty() {
        return FirstKey::NotYet;
    }
    let Some(key) = rest.strip_prefix('"') else {
        return FirstKey::None;
    };
    match key.find(['"', '\\']) {
        Some(end) if key[end..].starts_with('"') => {
            FirstKey::Complete(&key[..end], &key[end + 1..])
        }
        // An escaped key is none the reply's keys are written as.
        Some(_) => FirstKey::None,
        None => FirstKey::Partial(key),
    }
}

/// What the start of a reply object says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Opening {
    /// `{"response": "`: the answer string's characters start after this many bytes.
    Response(usize),
    /// `{"tool_call"` or `{"tool_calls"`.
    Call,
    /// Another object: an answer that is JSON of its own.
    Other,
    /// Too little to tell.
    Undecided,
}

/// Reads the start of a reply object (`text` starts at its `{`).
pub(super) fn opening(text: &str) -> Opening {
    match first_key(text) {
        FirstKey::None => Opening::Other,
        FirstKey::NotYet => Opening::Undecided,
        FirstKey::Partial(key) => {
            let could_be = [RESPONSE_KEY, CALL_KEY, CALLS_KEY]
                .iter()
                .any(|k| k.starts_with(key));
            if could_be {
                Opening::Undecided
            } else {
                Opening::Other
            }
        }
        FirstKey::Complete(CALL_KEY | CALLS_KEY, _) => Opening::Call,
        FirstKey::Complete(RESPONSE_KEY, after) => {
            let after = skip_ws(after);
            let Some(value) = after.strip_prefix(':') else {
                return if after.is_empty() {
                    Opening::Undecided
                } else {
                    Opening::Other
                };
            };
            let value = skip_ws(value);
            if value.starts_with('"') {
                Opening::Response(text.len() - value.len() + 1)
            } else if value.is_empty() {
                Opening::Undecided
            } else {
                // A response that is not a string waits for the whole object.
                Opening::Other
            }
        }
        FirstKey::Complete(..) => Opening::Other,
    }
}

/// Whether an unfinished object (`text` starts at its `{`) began as a call whose first key is
/// one of `keys`, or is too short to tell: at a cut-off such text is dropped, never shown.
pub(super) fn may_open_call(text: &str, keys: &[&str]) -> bool {
    match first_key(text) {
        FirstKey::NotYet => true,
        FirstKey::Partial(key) => keys.iter().any(|k| k.starts_with(key)),
        FirstKey::Complete(key, _) => keys.contains(&key),
        FirstKey::None => false,
    }
}

/// The calls complete so far in an unfinished `{"tool_calls": [{…}, {…}, …` (`text` starts at
/// its `{`): what a cut-off list still holds whole. Nothing when the list is not of calls, or
/// one of its finished items is not a well-formed call.
pub(super) fn calls_so_far(text: &str) -> Vec<ToolCall> {
    let FirstKey::Complete(CALLS_KEY, after) = first_key(text) else {
        return Vec::new();
    };
    let Some(mut rest) = skip_ws(after)
        .strip_prefix(':')
        .and_then(|value| skip_ws(value).strip_prefix('['))
    else {
        return Vec::new();
    };
    let mut calls = Vec::new();
    loop {
        let JsonPrefix::Complete(item, used) = json_prefix(rest) else {
            return calls;
        };
        match call_from_object(&item) {
            Ok(call) => calls.push(call),
            Err(_) => return Vec::new(),
        }
        match skip_ws(&rest[used..]).strip_prefix(',') {
            Some(next) => rest = next,
            None => return calls,
        }
    }
}

/// What a complete reply object holds.
pub(super) enum Reply {
    /// Calls (or why they are malformed).
    Calls(Result<Vec<ToolCall>, String>),
    /// An answer: the `response` string, or any other `response` value as JSON text.
    Response(String),
    /// An object of another shape: the answer is the JSON as written.
    Other,
}

/// Reads a complete reply object.
pub(super) fn reply(value: &Value) -> Reply {
    let Some(object) = value.as_object() else {
        return Reply::Other;
    };
    if let Some(call) = object.get(CALL_KEY) {
        return Reply::Calls(call_from_object(call).map(|call| vec![call]));
    }
    if let Some(calls) = object.get(CALLS_KEY) {
        return Reply::Calls(mistral_calls(calls));
    }
    match object.get(RESPONSE_KEY) {
        Some(Value::String(text)) => Reply::Response(text.clone()),
        Some(other) => Reply::Response(other.to_string()),
        None => Reply::Other,
    }
}

/// Decodes as much of a JSON string's characters (`text` starts after its opening quote) as is
/// complete: the text, the bytes used, and whether the closing quote was reached. An escape
/// cut by the end of `text` is left unused, to be decoded when the rest arrives; an invalid
/// escape is kept as written.
pub(super) fn string_body(text: &str) -> (String, usize, bool) {
    let mut out = String::new();
    let mut at = 0;
    while let Some(c) = text[at..].chars().next() {
        match c {
            '"' => return (out, at + 1, true),
            '\\' => match escape(&text[at..]) {
                Escape::Char(decoded, len) => {
                    out.push(decoded);
                    at += len;
                }
                Escape::Incomplete => return (out, at, false),
            },
            other => {
                out.push(other);
                at += other.len_utf8();
            }
        }
    }
    (out, at, false)
}

enum Escape {
    /// The character and the bytes its escape took.
    Char(char, usize),
    /// The escape continues past the text.
    Incomplete,
}

/// One escape at the start of `text` (which starts with `\`).
fn escape(text: &str) -> Escape {
    let Some(kind) = text[1..].chars().next() else {
        return Escape::Incomplete;
    };
    let simple = match kind {
        '"' => '"',
        '\\' => '\\',
        '/' => '/',
        'b' => '\u{8}',
        'f' => '\u{c}',
        'n' => '\n',
        'r' => '\r',
        't' => '\t',
        'u' => return unicode_escape(text),
        // Not JSON: the backslash stays as written; the character after it is read next.
        _ => return Escape::Char('\\', 1),
    };
    Escape::Char(simple, 2)
}

/// `\uXXXX`, or a surrogate pair `\uD83D\uDE00`, at the start of `text`.
fn unicode_escape(text: &str) -> Escape {
    let all_hex = |s: &str| s.chars().all(|c| c.is_ascii_hexdigit());
    let Some(high) = hex4(text, 2) else {
        let digits = &text[2..];
        return if digits.len() < 4 && all_hex(digits) {
            Escape::Incomplete
        } else {
            Escape::Char('\\', 1)
        };
    };
    if !(0xD800..0xDC00).contains(&high) {
        // A lone low surrogate is no character: U+FFFD stands in for it.
        return Escape::Char(char::from_u32(high).unwrap_or('\u{FFFD}'), 6);
    }
    // A high surrogate wants `\uDC00`..`\uDFFF` next.
    let rest = &text[6..];
    let may_continue = rest.len() < 6
        && rest
            .get(..rest.len().min(2))
            .is_some_and(|start| "\\u".starts_with(start))
        && rest.get(2..).is_none_or(all_hex);
    if may_continue {
        return Escape::Incomplete;
    }
    match rest.strip_prefix("\\u").and_then(|_| hex4(rest, 2)) {
        Some(low) if (0xDC00..0xE000).contains(&low) => {
            let code = 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
            Escape::Char(char::from_u32(code).unwrap_or('\u{FFFD}'), 12)
        }
        _ => Escape::Char('\u{FFFD}', 6),
    }
}

/// Four hex digits at `text[from..from + 4]`.
fn hex4(text: &str, from: usize) -> Option<u32> {
    let digits = text.get(from..from + 4)?;
    if !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(digits, 16).ok()
}

/// The outcome of skipping the members left in an object after its `response` string.
pub(super) enum ObjectRest {
    /// The object ends after this many bytes.
    Ends(usize),
    /// More text is needed.
    Incomplete,
    /// The text does not continue an object.
    Invalid,
}

/// Skips `, "key": value …}` to the end of the object it continues.
pub(super) fn object_rest(text: &str) -> ObjectRest {
    // Read as the rest of an object with one member already, so serde finds where it ends.
    const HEAD: &str = "{\"_\":0";
    match json_prefix(&format!("{HEAD}{text}")) {
        JsonPrefix::Complete(_, used) => ObjectRest::Ends(used - HEAD.len()),
        JsonPrefix::Incomplete => ObjectRest::Incomplete,
        JsonPrefix::Invalid(_) => ObjectRest::Invalid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openings() {
        assert_eq!(opening("{\"response\": \"hi"), Opening::Response(14));
        assert_eq!(opening("{ \n\"response\" :\"x"), Opening::Response(16));
        assert_eq!(opening("{\"tool_call\""), Opening::Call);
        assert_eq!(opening("{\"tool_calls\": ["), Opening::Call);
        for undecided in [
            "{",
            "{ ",
            "{\"",
            "{\"resp",
            "{\"tool_c",
            "{\"response\"",
            "{\"response\": ",
        ] {
            assert_eq!(opening(undecided), Opening::Undecided, "{undecided}");
        }
        assert_eq!(opening("{\"answer\""), Opening::Other);
        assert_eq!(opening("{\"responses\""), Opening::Other);
        assert_eq!(opening("{\"response\": 42"), Opening::Other);
        assert_eq!(opening("{}"), Opening::Other);
        assert_eq!(opening("{\"a\\\"b\": 1}"), Opening::Other);
    }

    #[test]
    fn strings_decode_as_far_as_they_are_complete() {
        assert_eq!(string_body("ab\\n\"}"), ("ab\n".to_string(), 5, true));
        assert_eq!(string_body("ab\\"), ("ab".to_string(), 2, false));
        assert_eq!(string_body("\\u00e9\""), ("é".to_string(), 7, true));
        assert_eq!(string_body("\\u00"), (String::new(), 0, false));
        assert_eq!(string_body("\\ud83d"), (String::new(), 0, false));
        assert_eq!(string_body("\\ud83d\\u"), (String::new(), 0, false));
        assert_eq!(
            string_body("\\ud83d\\ude00!"),
            ("😀!".to_string(), 13, false)
        );
        assert_eq!(string_body("\\ud83dx"), ("\u{FFFD}x".to_string(), 7, false));
        assert_eq!(string_body("\\q"), ("\\q".to_string(), 2, false));
        assert_eq!(string_body("\\uzz"), ("\\uzz".to_string(), 4, false));
    }

    #[test]
    fn replies() {
        let call = serde_json::json!({"tool_call": {"name": "f", "arguments": {"x": 1}}});
        assert!(matches!(reply(&call), Reply::Calls(Ok(calls)) if calls.len() == 1));
        let calls = serde_json::json!({"tool_calls": [{"name": "f"}, {"name": "g"}]});
        assert!(matches!(reply(&calls), Reply::Calls(Ok(calls)) if calls.len() == 2));
        let answer = serde_json::json!({"response": "hi"});
        assert!(matches!(reply(&answer), Reply::Response(text) if text == "hi"));
        assert!(matches!(reply(&serde_json::json!({"a": 1})), Reply::Other));
        assert!(matches!(
            reply(&serde_json::json!({"tool_call": 3})),
            Reply::Calls(Err(_))
        ));
    }

    #[test]
    fn a_cut_list_keeps_its_whole_calls() {
        let text =
            "{\"tool_calls\": [{\"name\": \"a\"}, {\"name\": \"b\", \"arguments\": {}} , {\"na";
        let names: Vec<String> = calls_so_far(text).into_iter().map(|c| c.name).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(calls_so_far("{\"tool_calls\": [{\"name\": 3}, {\"na").is_empty());
        assert!(calls_so_far("{\"tool_call\": {\"name\": \"a\"").is_empty());
    }

    #[test]
    fn the_rest_of_an_object_is_skipped() {
        assert!(matches!(
            object_rest(", \"a\": [1]} tail"),
            ObjectRest::Ends(11)
        ));
        assert!(matches!(object_rest(", \"a\": [1"), ObjectRest::Incomplete));
        assert!(matches!(object_rest(" and text"), ObjectRest::Invalid));
    }
}
