//! [`OutputParser`]: the streaming state machine.

use super::generic::{self, ObjectRest, Opening, Reply};
use super::tool_call::{
    JsonPrefix, call_from_object, hermes_call, json_prefix, looks_like_llama3_call, mistral_calls,
};
use super::{ParserConfig, ParserEvent, ToolCall, ToolCallFormat};

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_OPEN: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const MISTRAL_CALL_ID: &str = "[CALL_ID]";
const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Content,
    Thinking,
    HermesCall,
    Llama3Json,
    MistralCalls,
    /// Inside a generic reply object, before it shows whether it is an answer or calls.
    GenericJson,
    /// Inside the string of a generic `{"response": "…"}`, streamed as content.
    GenericResponse,
    /// After that string, before the object's closing brace.
    GenericResponseEnd,
    /// A parse error was reported, or the stream finished: nothing more is emitted.
    Done,
}

/// Splits streamed model output into [`ParserEvent`]s.
///
/// Feed text with [`push`](Self::push) as it is decoded (stop strings already applied), then
/// call [`finish`](Self::finish) once. The concatenated events do not depend on how the text
/// was split into pieces.
#[derive(Debug, Clone)]
pub struct OutputParser {
    config: ParserConfig,
    state: State,
    /// Text not yet decided.
    pending: String,
    /// Drop whitespace at the start of the current segment (after `</think>`, after a call).
    trim_leading: bool,
    /// Whether non-whitespace content was emitted in this segment (a Llama 3 call, a generic
    /// reply object, must come first).
    content_started: bool,
    /// Whether the Llama 3 JSON being read followed `<|python_tag|>`, so it is surely a call.
    llama3_tagged: bool,
    /// Whether a tool call was emitted: whitespace-only content beside calls is dropped.
    calls_emitted: bool,
    events: Vec<ParserEvent>,
}

impl OutputParser {
    /// A parser for output described by `config`.
    pub fn new(config: ParserConfig) -> Self {
        let thinking = config.starts_in_thinking && config.thinking.is_some();
        OutputParser {
            state: if thinking {
                State::Thinking
            } else {
                State::Content
            },
            trim_leading: thinking,
            config,
            pending: String::new(),
            content_started: false,
            llama3_tagged: false,
            calls_emitted: false,
            events: Vec::new(),
        }
    }

    /// Feeds the next piece of output; returns what it decided.
    pub fn push(&mut self, text: &str) -> Vec<ParserEvent> {
        if self.state != State::Done {
            self.pending.push_str(text);
            while self.step(false) {}
        }
        std::mem::take(&mut self.events)
    }

    /// Ends the stream: held text is released, an unterminated tool call is parsed as it is.
    pub fn finish(&mut self) -> Vec<ParserEvent> {
        if self.state != State::Done {
            while self.step(true) {}
            self.state = State::Done;
            self.pending.clear();
        }
        std::mem::take(&mut self.events)
    }

    /// Ends a stream the token limit cut off: like [`finish`](Self::finish), except that what
    /// the limit cut inside a tool call (or inside a marker that may have opened one) is
    /// dropped, so the caller reports a `length` ending with neither a half call, nor raw
    /// markup in the content, nor an error. A call complete but for its closing marker is
    /// still a call.
    pub fn finish_cut_off(&mut self) -> Vec<ParserEvent> {
        let drop_held = match self.state {
            State::Content => {
                // A tool-call marker cut short is not text.
                let tags = self.content_tags();
                let keep = undecided_from(&self.pending, &tags);
                if keep < self.pending.len() {
                    // With the whitespace before it, as before a whole marker.
                    let kept = self.pending[..keep].trim_end().len();
                    self.pending.truncate(kept);
                }
                false
            }
            State::Llama3Json => {
                self.llama3_tagged || generic::may_open_call(&self.pending, &["name"])
            }
            State::GenericJson => {
                // The whole calls of a cut list stand.
                let calls = generic::calls_so_far(&self.pending);
                self.calls_emitted |= !calls.is_empty();
                self.events
                    .extend(calls.into_iter().map(ParserEvent::ToolCall));
                generic::opening(&self.pending) != Opening::Other
            }
            State::HermesCall | State::MistralCalls => {
                let mut attempt = self.clone();
                let events = attempt.finish();
                if !events.iter().any(|e| matches!(e, ParserEvent::Error(_))) {
                    *self = attempt;
                    return events;
                }
                true
            }
            State::Thinking | State::GenericResponse | State::GenericResponseEnd | State::Done => {
                false
            }
        };
        if drop_held {
            self.state = State::Done;
            self.pending.clear();
            return std::mem::take(&mut self.events);
        }
        self.finish()
    }

    /// One transition; false when nothing more can be decided now.
    fn step(&mut self, at_end: bool) -> bool {
        match self.state {
            State::Content => self.step_content(at_end),
            State::Thinking => self.step_thinking(at_end),
            State::HermesCall => self.step_hermes(at_end),
            State::Llama3Json => self.step_llama3(at_end),
            State::MistralCalls => self.step_mistral(at_end),
            State::GenericJson => self.step_generic_json(at_end),
            State::GenericResponse => self.step_generic_response(),
            State::GenericResponseEnd => self.step_generic_response_end(at_end),
            State::Done => false,
        }
    }

    /// Applies `trim_leading`; false while the segment is still all whitespace.
    fn trim_segment_start(&mut self) -> bool {
        if self.trim_leading {
            let kept = self.pending.trim_start().len();
            self.pending.drain(..self.pending.len() - kept);
            if self.pending.is_empty() {
                return false;
            }
            self.trim_leading = false;
        }
        true
    }

    fn content_tags(&self) -> Vec<&'static str> {
        let mut tags = Vec::new();
        match self.config.tool_calls {
            ToolCallFormat::None | ToolCallFormat::Generic => {}
            ToolCallFormat::Hermes => tags.push(HERMES_OPEN),
            ToolCallFormat::Llama3Json => tags.push(PYTHON_TAG),
            ToolCallFormat::Mistral => tags.push(MISTRAL_OPEN),
        }
        tags
    }

    /// Whether a JSON reply (a Llama 3 call, a generic reply object) may start here.
    fn json_reply_may_start(&self) -> bool {
        matches!(
            self.config.tool_calls,
            ToolCallFormat::Llama3Json | ToolCallFormat::Generic
        ) && !self.content_started
    }

    /// Whether trailing whitespace of content is held back (tools are on): it is dropped when
    /// a call follows, and released when text follows.
    fn holds_whitespace(&self) -> bool {
        self.config.tool_calls != ToolCallFormat::None
    }

    fn step_content(&mut self, at_end: bool) -> bool {
        if !self.trim_segment_start() {
            return false;
        }
        if self.json_reply_may_start() {
            let rest = self.pending.trim_start();
            if rest.starts_with('{') {
                self.pending.drain(..self.pending.len() - rest.len());
                self.state = match self.config.tool_calls {
                    ToolCallFormat::Generic => State::GenericJson,
                    _ => State::Llama3Json,
                };
                return true;
            }
            if rest.is_empty() && !at_end {
                return false;
            }
        }
        let mut tags: Vec<&str> = self.content_tags();
        if let Some(thinking) = &self.config.thinking {
            tags.push(&thinking.open);
            tags.push(&thinking.close);
        }
        if let Some((at, tag)) = earliest(&self.pending, &tags) {
            let tag = tag.to_string();
            let mut before = self.pending[..at].to_string();
            if self.holds_whitespace() {
                before.truncate(before.trim_end().len());
            }
            self.pending.drain(..at + tag.len());
            self.emit_content(before);
            let thinking = self.config.thinking.as_ref();
            if thinking.is_some_and(|t| t.open == tag) {
                self.state = State::Thinking;
                self.trim_leading = true;
            } else if thinking.is_some_and(|t| t.close == tag) {
                // A stray close tag (the prompt opened the block): drop it, never show it.
                self.trim_leading = true;
            } else {
                self.state = match tag.as_str() {
                    HERMES_OPEN => State::HermesCall,
                    MISTRAL_OPEN => State::MistralCalls,
                    _ => {
                        self.llama3_tagged = true;
                        State::Llama3Json
                    }
                };
                self.trim_leading = true;
            }
            return true;
        }
        let cut = if at_end {
            if self.holds_whitespace() && self.calls_emitted {
                self.pending.trim_end().len()
            } else {
                self.pending.len()
            }
        } else {
            let undecided = undecided_from(&self.pending, &tags);
            if self.holds_whitespace() {
                self.pending[..undecided].trim_end().len()
            } else {
                undecided
            }
        };
        let text: String = self.pending.drain(..cut).collect();
        self.emit_content(text);
        false
    }

    fn step_thinking(&mut self, at_end: bool) -> bool {
        if !self.trim_segment_start() {
            return false;
        }
        let Some(tags) = self.config.thinking.clone() else {
            self.state = State::Content;
            return true;
        };
        if let Some(at) = self.pending.find(&tags.close) {
            let text = self.pending[..at].trim_end().to_string();
            self.pending.drain(..at + tags.close.len());
            self.emit_thinking(text);
            self.state = State::Content;
            self.trim_leading = true;
            return true;
        }
        let cut = if at_end {
            self.pending.trim_end().len()
        } else {
            // Hold a possible close tag and trailing whitespace (dropped if the tag follows).
            let undecided = undecided_from(&self.pending, &[tags.close.as_str()]);
            self.pending[..undecided].trim_end().len()
        };
        let text: String = self.pending.drain(..cut).collect();
        self.emit_thinking(text);
        false
    }

    fn step_hermes(&mut self, at_end: bool) -> bool {
        let body_end = match self.pending.find(HERMES_CLOSE) {
            Some(at) => at,
            // The end came before the closing marker, or inside it.
            None if at_end => undecided_from(&self.pending, &[HERMES_CLOSE]),
            None => return false,
        };
        let body: String = self.pending[..body_end].to_string();
        let consumed = (body_end + HERMES_CLOSE.len()).min(self.pending.len());
        self.pending.drain(..consumed);
        self.finish_call(hermes_call(&body).map(|call| vec![call]))
    }

    fn step_llama3(&mut self, at_end: bool) -> bool {
        match json_prefix(&self.pending) {
            JsonPrefix::Complete(value, used) => {
                let raw: String = self.pending.drain(..used).collect();
                self.llama3_tagged = false;
                if looks_like_llama3_call(&value) {
                    return self.finish_call(call_from_object(&value).map(|call| vec![call]));
                }
                // An answer that is JSON, not a call.
                self.emit_content(raw);
                self.state = State::Content;
                true
            }
            JsonPrefix::Incomplete if !at_end => false,
            JsonPrefix::Incomplete | JsonPrefix::Invalid(_) => {
                // Not (complete) JSON: it was text after all.
                let raw = std::mem::take(&mut self.pending);
                self.llama3_tagged = false;
                self.emit_content(raw);
                self.state = State::Content;
                true
            }
        }
    }

    fn step_mistral(&mut self, at_end: bool) -> bool {
        if !self.trim_segment_start() {
            if at_end {
                return self.finish_call(Err(format!("{MISTRAL_OPEN} is followed by nothing")));
            }
            return false;
        }
        if self.pending.starts_with(['[', '{']) {
            return match json_prefix(&self.pending) {
                JsonPrefix::Complete(value, used) => {
                    self.pending.drain(..used);
                    self.finish_call(mistral_calls(&value))
                }
                JsonPrefix::Incomplete if !at_end => false,
                JsonPrefix::Incomplete => {
                    self.finish_call(Err(format!("{MISTRAL_OPEN} list is cut off")))
                }
                JsonPrefix::Invalid(err) => {
                    self.finish_call(Err(format!("{MISTRAL_OPEN} list is not JSON: {err}")))
                }
            };
        }
        // The newer form: name[ARGS]{…}, the name possibly followed by [CALL_ID]id.
        let Some(args_at) = self.pending.find(MISTRAL_ARGS) else {
            if at_end {
                return self.finish_call(Err(format!("{MISTRAL_OPEN} call has no {MISTRAL_ARGS}")));
            }
            return false;
        };
        let head = &self.pending[..args_at];
        let name = head
            .split(MISTRAL_CALL_ID)
            .next()
            .unwrap_or(head)
            .trim()
            .to_string();
        let args_start = args_at + MISTRAL_ARGS.len();
        match json_prefix(&self.pending[args_start..]) {
            JsonPrefix::Complete(arguments, used) => {
                self.pending.drain(..args_start + used);
                let call = if name.is_empty() {
                    Err(format!("{MISTRAL_OPEN} call has an empty name"))
                } else if !arguments.is_object() {
                    Err(format!(
                        "arguments of `{name}` are not a JSON object: {arguments}"
                    ))
                } else {
                    Ok(vec![ToolCall { name, arguments }])
                };
                self.finish_call(call)
            }
            JsonPrefix::Incomplete if !at_end => false,
            JsonPrefix::Incomplete => {
                self.finish_call(Err(format!("arguments of `{name}` are cut off")))
            }
            JsonPrefix::Invalid(err) => {
                self.finish_call(Err(format!("arguments of `{name}` are not JSON: {err}")))
            }
        }
    }

    fn step_generic_json(&mut self, at_end: bool) -> bool {
        let opening = generic::opening(&self.pending);
        match opening {
            Opening::Response(len) => {
                self.pending.drain(..len);
                self.state = State::GenericResponse;
                return true;
            }
            Opening::Undecided if !at_end => return false,
            Opening::Undecided | Opening::Call | Opening::Other => {}
        }
        let is_call = opening == Opening::Call;
        match json_prefix(&self.pending) {
            JsonPrefix::Complete(value, used) => {
                let raw: String = self.pending.drain(..used).collect();
                match generic::reply(&value) {
                    Reply::Calls(calls) => return self.finish_call(calls),
                    Reply::Response(text) => {
                        self.emit_content(text);
                        self.end_generic_reply();
                    }
                    Reply::Other => {
                        // An answer that is JSON of its own.
                        self.emit_content(raw);
                        self.state = State::Content;
                    }
                }
                true
            }
            JsonPrefix::Incomplete if !at_end => false,
            JsonPrefix::Incomplete if is_call => {
                self.finish_call(Err("the tool call is cut off".to_string()))
            }
            JsonPrefix::Invalid(err) if is_call => {
                self.finish_call(Err(format!("the tool call is not valid JSON: {err}")))
            }
            JsonPrefix::Incomplete | JsonPrefix::Invalid(_) => {
                // Not (complete) JSON: it was text after all.
                let raw = std::mem::take(&mut self.pending);
                self.emit_content(raw);
                self.state = State::Content;
                true
            }
        }
    }

    fn step_generic_response(&mut self) -> bool {
        let (text, used, closed) = generic::string_body(&self.pending);
        self.pending.drain(..used);
        self.emit_content(text);
        if closed {
            self.state = State::GenericResponseEnd;
            return true;
        }
        false
    }

    fn step_generic_response_end(&mut self, at_end: bool) -> bool {
        let rest = generic::skip_ws(&self.pending);
        let from = self.pending.len() - rest.len();
        if rest.is_empty() {
            if at_end {
                self.end_generic_reply();
            }
            return at_end;
        }
        let end = if rest.starts_with('}') {
            ObjectRest::Ends(1)
        } else {
            generic::object_rest(rest)
        };
        match end {
            ObjectRest::Ends(used) => {
                self.pending.drain(..from + used);
                self.end_generic_reply();
                true
            }
            ObjectRest::Incomplete if !at_end => false,
            ObjectRest::Incomplete => {
                self.pending.clear();
                self.end_generic_reply();
                true
            }
            ObjectRest::Invalid => {
                // Text after the answer, outside any object: content.
                self.pending.drain(..from);
                self.state = State::Content;
                true
            }
        }
    }

    /// A generic reply object ended: another may follow.
    fn end_generic_reply(&mut self) {
        self.state = State::Content;
        self.trim_leading = true;
        self.content_started = false;
    }

    /// Reports parsed calls and returns to content, or reports the error and stops.
    fn finish_call(&mut self, calls: Result<Vec<ToolCall>, String>) -> bool {
        match calls {
            Ok(calls) => {
                self.calls_emitted |= !calls.is_empty();
                self.events
                    .extend(calls.into_iter().map(ParserEvent::ToolCall));
                self.state = State::Content;
                self.trim_leading = true;
                true
            }
            Err(message) => {
                self.events.push(ParserEvent::Error(message));
                self.state = State::Done;
                self.pending.clear();
                false
            }
        }
    }

    fn emit_content(&mut self, text: String) {
        if text.is_empty() {
            return;
        }
        if text.chars().any(|c| !c.is_whitespace()) {
            self.content_started = true;
        }
        match self.events.last_mut() {
            Some(ParserEvent::Content(prev)) => prev.push_str(&text),
            _ => self.events.push(ParserEvent::Content(text)),
        }
    }

    fn emit_thinking(&mut self, text: String) {
        if text.is_empty() || !self.config.think {
            return;
        }
        match self.events.last_mut() {
            Some(ParserEvent::Thinking(prev)) => prev.push_str(&text),
            _ => self.events.push(ParserEvent::Thinking(text)),
        }
    }
}

/// The earliest complete occurrence of any tag: (byte offset, tag). Ties go to the longer tag.
fn earliest<'t>(text: &str, tags: &[&'t str]) -> Option<(usize, &'t str)> {
    tags.iter()
        .filter_map(|&tag| text.find(tag).map(|at| (at, tag)))
        .min_by_key(|&(at, tag)| (at, std::cmp::Reverse(tag.len())))
}

/// The first byte from which `text` could still grow into one of `tags`; `text.len()` if none.
fn undecided_from(text: &str, tags: &[&str]) -> usize {
    let longest = tags.iter().map(|t| t.len()).max().unwrap_or(0);
    let first = text.len().saturating_sub(longest);
    (first..text.len())
        .filter(|&start| text.is_char_boundary(start))
        .find(|&start| {
            let tail = &text[start..];
            tags.iter()
                .any(|tag| tag.len() > tail.len() && tag.starts_with(tail))
        })
        .unwrap_or(text.len())
}
