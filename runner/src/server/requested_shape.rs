//! What a request asks of its output's shape, read from each API's fields: a format for the
//! whole answer, the tools offered, which must be called and whether several may be, and
//! each tool's parameters fitted to what the grammar engine compiles. `structured` turns
//! this into one grammar for the model's output syntax; `generic_grammar` is one such syntax.

use grammar::GrammarSpec;
use serde_json::{Value, json};

use crate::server::request_error::RequestError;

/// OpenAI's `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (the default, and Ollama's only behaviour).
    Auto,
    /// No tool may be called: tools are not offered at all.
    None,
    /// At least one call must be made.
    Required,
    /// This tool must be called.
    Named(String),
}

impl ToolChoice {
    /// Reads OpenAI's `tool_choice`: `"auto"`, `"none"`, `"required"` or
    /// `{"type": "function", "function": {"name": …}}`.
    pub fn from_openai(value: Option<&Value>) -> Result<ToolChoice, RequestError> {
        match value {
            None | Some(Value::Null) => Ok(ToolChoice::Auto),
            Some(Value::String(s)) => match s.as_str() {
                "auto" => Ok(ToolChoice::Auto),
                "none" => Ok(ToolChoice::None),
                "required" => Ok(ToolChoice::Required),
                other => Err(RequestError::invalid(format!(
                    "`tool_choice` {other:?}: expected \"auto\", \"none\", \"required\" or a function"
                ))),
            },
            Some(object @ Value::Object(_)) => object
                .pointer("/function/name")
                .and_then(Value::as_str)
                .map(|name| ToolChoice::Named(name.to_string()))
                .ok_or_else(|| RequestError::invalid("`tool_choice` object needs `function.name`")),
            Some(other) => Err(RequestError::invalid(format!(
                "`tool_choice` must be a string or an object, got {other}"
            ))),
        }
    }
}

/// A tool in the chat shape templates and [`Requested::tools`] take,
/// `{"type": "function", "function": {name, description, parameters}}`, from the parts other
/// APIs spell differently (Anthropic's `input_schema`, the Responses API's flat tools). No
/// parameters means any object.
pub fn function_tool(name: &str, parameters: Option<&Value>, description: Option<&Value>) -> Value {
    let mut function = json!({
        "name": name,
        "parameters": parameters.cloned().unwrap_or_else(|| json!({"type": "object"})),
    });
    if let Some(description) = description {
        function["description"] = description.clone();
    }
    json!({"type": "function", "function": function})
}

/// What a request asked of its output's shape.
#[derive(Debug, Clone)]
pub struct Requested {
    /// A JSON object, schema, regex or grammar for the whole answer.
    pub format: Option<GrammarSpec>,
    /// The tools offered (OpenAI/Ollama `tools` entries).
    pub tools: Vec<Value>,
    /// Whether and which tool must be called.
    pub choice: ToolChoice,
    /// Whether several calls may be made in one answer (OpenAI `parallel_tool_calls`).
    pub parallel_calls: bool,
}

impl Requested {
    /// Nothing asked.
    pub fn none() -> Requested {
        Requested {
            format: None,
            tools: Vec::new(),
            choice: ToolChoice::Auto,
            parallel_calls: true,
        }
    }
}

/// Reads Ollama's `format`.
pub fn ollama_format(format: Option<&Value>) -> Result<Option<GrammarSpec>, RequestError> {
    GrammarSpec::from_ollama_format(format).map_err(|e| RequestError::invalid(e.to_string()))
}

/// Reads OpenAI's `response_format`.
pub fn openai_response_format(
    response_format: Option<&Value>,
) -> Result<Option<GrammarSpec>, RequestError> {
    GrammarSpec::from_openai_response_format(response_format)
        .map_err(|e| RequestError::invalid(e.to_string()))
}

/// A client's name as quoted in a message: at most 64 characters.
fn quoted(name: &str) -> String {
    match name.char_indices().nth(64) {
        Some((cut, _)) => format!("{}…", &name[..cut]),
        None => name.to_string(),
    }
}

/// Tool `i` of `requested`, unless `tool_choice` names another: its name and its parameters'
/// schema, closed (see [`grammar::close_objects`]) and fitted to what the grammar engine
/// compiles, with what was loosened logged and added to `loosened`. An invalid schema, or a
/// tool without a name, is a 400.
pub fn fitted_tool<'a>(
    requested: &Requested,
    i: usize,
    tool: &'a Value,
    loosened: &mut Vec<String>,
) -> Result<Option<(&'a str, Value)>, RequestError> {
    let (name, mut parameters) = tool_signature(tool)
        .ok_or_else(|| RequestError::invalid(format!("`tools[{i}]` needs `function.name`")))?;
    if let ToolChoice::Named(wanted) = &requested.choice
        && wanted != name
    {
        return Ok(None);
    }
    grammar::close_objects(&mut parameters);
    let notes = grammar::fit_schema(&mut parameters).map_err(|e| {
        RequestError::invalid(format!("`tools[{i}]` ({}) parameters: {e}", quoted(name)))
    })?;
    for note in notes {
        tracing::warn!(
            tool = name,
            index = i,
            pointer = %note.pointer,
            loosened = %note.what,
            "tool schema loosened: the grammar engine cannot enforce this part"
        );
        loosened.push(format!("tools[{i}] {note}"));
    }
    Ok(Some((name, parameters)))
}

/// A tool's name and its parameters' schema (any object when it declares none), as given:
/// its local `$ref`s still point into it.
fn tool_signature(tool: &Value) -> Option<(&str, Value)> {
    let function = tool.get("function").unwrap_or(tool);
    let name = function.get("name")?.as_str()?;
    let parameters = function
        .get("parameters")
        .filter(|p| p.is_object())
        .cloned()
        .unwrap_or_else(|| json!({"type": "object"}));
    Some((name, parameters))
}
