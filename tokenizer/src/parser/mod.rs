//! Splitting model output into content, thinking and tool calls while it streams.
//!
//! - `output_parser.rs`: the [`OutputParser`] state machine. Text that might be the start of a
//!   tag is held back until the next piece decides it, so raw tags never reach `content`, and
//!   the events are the same however the stream was split.
//! - `tool_call.rs`: the JSON shapes of each family's tool calls.
//! - `generic.rs`: the generic format's reply objects, for templates without a tool section.
//!
//! With tools on, trailing whitespace of content is held back until text follows: whitespace
//! beside a tool call (`"\n"` before `<tool_call>`) is never sent as content of its own.
//!
//! A malformed tool call yields one [`ParserEvent::Error`]; the parser then ignores the rest of
//! the stream, so the caller can end the request cleanly instead of re-reporting (or blocking
//! on) the same failure for every later piece.

mod generic;
mod output_parser;
mod tool_call;

pub use output_parser::OutputParser;

/// A parsed tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Function name.
    pub name: String,
    /// Arguments; an object for every well-formed call.
    pub arguments: serde_json::Value,
}

/// What the parser recognised in the stream.
#[derive(Debug, Clone, PartialEq)]
pub enum ParserEvent {
    /// Text for the user.
    Content(String),
    /// Reasoning text (only when thinking is requested).
    Thinking(String),
    /// A complete tool call.
    ToolCall(ToolCall),
    /// The output could not be parsed; nothing follows this event.
    Error(String),
}

/// The tags around a reasoning block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinkingTags {
    /// Opening tag, e.g. `<think>`.
    pub open: String,
    /// Closing tag, e.g. `</think>`.
    pub close: String,
}

/// How a family writes tool calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// Tool calls are not parsed; everything is content.
    #[default]
    None,
    /// Hermes / Qwen: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`.
    Hermes,
    /// Llama 3: the reply is a JSON object `{"name": …, "parameters": {…}}`, optionally after
    /// `<|python_tag|>`.
    Llama3Json,
    /// Mistral: `[TOOL_CALLS][{"name": …, "arguments": {…}}]` or
    /// `[TOOL_CALLS]name[ARGS]{…}`.
    Mistral,
    /// The generic format, for templates that cannot show tools (see `generic.rs`): the reply
    /// is one JSON object, `{"tool_call": {"name": …, "arguments": {…}}}`,
    /// `{"tool_calls": [{…}, …]}`, or `{"response": "…"}` whose string is the answer.
    Generic,
}

/// What to look for in one model's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParserConfig {
    /// Reasoning tags, for models that think.
    pub thinking: Option<ThinkingTags>,
    /// Tool-call syntax.
    pub tool_calls: ToolCallFormat,
    /// Whether the request wants reasoning (`think`); when false, reasoning is dropped, not
    /// turned into content.
    pub think: bool,
    /// Whether the prompt already opened the reasoning block (templates that end in `<think>`),
    /// so output starts inside it.
    pub starts_in_thinking: bool,
}

impl Default for ParserConfig {
    fn default() -> Self {
        ParserConfig {
            thinking: None,
            tool_calls: ToolCallFormat::None,
            think: true,
            starts_in_thinking: false,
        }
    }
}

impl ParserConfig {
    /// Sets whether reasoning is returned.
    pub fn with_think(mut self, think: bool) -> Self {
        self.think = think;
        self
    }

    /// Sets whether output starts inside a reasoning block; see
    /// [`ParserConfig::prompt_opens_thinking`].
    pub fn starting_in_thinking(mut self, yes: bool) -> Self {
        self.starts_in_thinking = yes;
        self
    }

    /// Turns tool-call parsing off (a request without tools).
    pub fn without_tools(mut self) -> Self {
        self.tool_calls = ToolCallFormat::None;
        self
    }

    /// Whether a rendered prompt leaves a reasoning block open (ends with the open tag after
    /// trimming whitespace), so generation starts inside it.
    pub fn prompt_opens_thinking(&self, prompt: &str) -> bool {
        self.thinking.as_ref().is_some_and(|tags| {
            let prompt = prompt.trim_end();
            prompt.ends_with(&tags.open)
        })
    }
}
