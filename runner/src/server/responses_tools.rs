//! The Responses API's tools as a local model is offered them, and its calls as the client
//! expects them back.
//!
//! - `function` tools are offered as they are.
//! - Tools come in the request's `tools`, and in `additional_tools` input items (Codex's
//!   default "responses-lite" request declares all its tools so, `{"type":
//!   "additional_tools", "role": "developer", "tools": [...]}`, and sends no `tools`).
//! - `namespace` tools (Codex groups its MCP and app tools so: `{"type": "namespace", "name",
//!   "description", "tools": [functions…]}`) are flattened into their functions. The model
//!   sees each by its own name, or `namespace.name` where two namespaces share a name; its
//!   calls go back as `function_call` items with the function's `name` and its `namespace`,
//!   which is how Codex routes them.
//! - `custom` (freeform) tools, whose input is free text (Codex's `apply_patch` in its patch
//!   grammar), are offered as a function of one string, `input`, with the grammar quoted in
//!   the description; their calls go back as `custom_tool_call` items carrying that string.
//! - OpenAI's built-in tools (`web_search`, `file_search`, `code_interpreter`, `computer_use`,
//!   `image_generation`, `local_shell`, `mcp`, …) run on OpenAI's servers or are trained into
//!   OpenAI's models: a local model can call none of them. They are left out with a warning
//!   (the response's `metadata` and the log, see [`crate::server::warnings`]) rather than
//!   refused, since agents offer them by default and work without them.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::server::error::ApiError;
use crate::server::requested_shape;
use crate::server::warnings::Warnings;

/// How the client declared a tool the model may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolKind {
    /// A `function` tool: JSON arguments.
    Function,
    /// A `custom` tool: one free-text input.
    Custom,
}

/// A tool as the client knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTool {
    /// Its name inside its namespace.
    pub name: String,
    /// The `namespace` tool it came in, if any.
    pub namespace: Option<String>,
    /// How its calls are written.
    pub kind: ToolKind,
}

/// A request's tools: what the model is offered, and how to name its calls for the client.
#[derive(Debug, Default)]
pub struct Tools {
    /// The tools in the chat shape the template and the grammar take.
    pub functions: Vec<Value>,
    /// The tools as the response reports them: flat functions and custom tools.
    pub echo: Vec<Value>,
    /// Each offered tool by the name the model calls it.
    by_model_name: HashMap<String, ClientTool>,
}

/// One tool found in the request, before names are settled.
struct Found {
    tool: ClientTool,
    description: Option<Value>,
    parameters: Option<Value>,
    original: Value,
}

impl Tools {
    /// Reads a request's tools: its `tools` and those its `input` declares in
    /// `additional_tools` items. What cannot be offered is left out with a warning. Fails only
    /// on a malformed tool (no `type`, a function without a `name`).
    pub fn read(
        tools: &[Value],
        input: Option<&Value>,
        warnings: &mut Warnings,
    ) -> Result<Tools, ApiError> {
        let mut declared: Vec<(String, &Value)> = tools
            .iter()
            .enumerate()
            .map(|(i, tool)| (format!("tools[{i}]"), tool))
            .collect();
        let items = input.and_then(Value::as_array).into_iter().flatten();
        for (i, item) in items.enumerate() {
            if item.get("type").and_then(Value::as_str) == Some("additional_tools") {
                let tools = item.get("tools").and_then(Value::as_array);
                for (j, tool) in tools.into_iter().flatten().enumerate() {
                    declared.push((format!("input[{i}].tools[{j}]"), tool));
                }
            }
        }
        let mut found = Vec::new();
        let mut built_in = Vec::new();
        for (at, tool) in declared {
            match tool.get("type").and_then(Value::as_str) {
                Some("namespace") => {
                    let namespace = name_of(tool, &at)?;
                    let children = tool.get("tools").and_then(Value::as_array);
                    for (j, child) in children.into_iter().flatten().enumerate() {
                        let at = format!("{at}.tools[{j}]");
                        found.extend(one_tool(child, Some(&namespace), &at, &mut built_in)?);
                    }
                }
                _ => found.extend(one_tool(tool, None, &at, &mut built_in)?),
            }
        }
        if !built_in.is_empty() {
            warnings.push(format!(
                "OpenAI's built-in tools, which a local model cannot call, are left out: {}",
                built_in.join(", ")
            ));
        }
        // A function keeps its own name unless another offered tool has it too.
        let mut uses: HashMap<&str, usize> = HashMap::new();
        for f in &found {
            *uses.entry(f.tool.name.as_str()).or_default() += 1;
        }
        let model_names: Vec<String> = found
            .iter()
            .map(|f| match &f.tool.namespace {
                Some(namespace) if uses[f.tool.name.as_str()] > 1 => {
                    format!("{namespace}.{}", f.tool.name)
                }
                _ => f.tool.name.clone(),
            })
            .collect();
        let mut offered = Tools::default();
        for (f, model_name) in found.into_iter().zip(model_names) {
            let (parameters, description) = match f.tool.kind {
                ToolKind::Function => (f.parameters, f.description),
                ToolKind::Custom => custom_as_function(&f.original),
            };
            offered.functions.push(requested_shape::function_tool(
                &model_name,
                parameters.as_ref(),
                description.as_ref(),
            ));
            let mut echo = f.original;
            if f.tool.kind == ToolKind::Function {
                echo["name"] = json!(model_name);
            }
            offered.echo.push(echo);
            offered.by_model_name.insert(model_name, f.tool);
        }
        Ok(offered)
    }

    /// The name the model knows a client's tool by (a call in the conversation so far); a tool
    /// no longer offered keeps its own name.
    pub fn model_name(&self, namespace: Option<&str>, name: &str) -> String {
        self.by_model_name
            .iter()
            .find(|(_, tool)| tool.name == name && tool.namespace.as_deref() == namespace)
            .map_or_else(|| name.to_string(), |(model_name, _)| model_name.clone())
    }

    /// The client's tool the model called by `model_name`; a name not offered (the model
    /// free to call under `tool_choice: auto` without a grammar) is taken as a function.
    pub fn client_tool(&self, model_name: &str) -> ClientTool {
        self.by_model_name
            .get(model_name)
            .cloned()
            .unwrap_or_else(|| ClientTool {
                name: model_name.to_string(),
                namespace: None,
                kind: ToolKind::Function,
            })
    }
}

/// A tool's `name`, required.
fn name_of(tool: &Value, at: &str) -> Result<String, ApiError> {
    tool.get("name")
        .and_then(Value::as_str)
        .filter(|name| !name.is_empty())
        .map(str::to_string)
        .ok_or_else(|| ApiError::bad_request(format!("{at} needs a `name`")))
}

/// A function or custom tool, or `None` for one of OpenAI's built-in tools (named, with where
/// it was, in `built_in`).
fn one_tool(
    tool: &Value,
    namespace: Option<&str>,
    at: &str,
    built_in: &mut Vec<String>,
) -> Result<Option<Found>, ApiError> {
    let kind = match tool.get("type").and_then(Value::as_str) {
        Some("function") => ToolKind::Function,
        Some("custom") => ToolKind::Custom,
        Some(builtin) => {
            built_in.push(format!("{builtin} ({at})"));
            return Ok(None);
        }
        None => {
            return Err(ApiError::bad_request(format!(
                "{at} needs a `type` (\"function\", \"custom\" or \"namespace\")"
            )));
        }
    };
    Ok(Some(Found {
        tool: ClientTool {
            name: name_of(tool, at)?,
            namespace: namespace.map(str::to_string),
            kind,
        },
        description: tool.get("description").cloned(),
        parameters: tool.get("parameters").cloned(),
        original: tool.clone(),
    }))
}

/// A custom tool as a function of one string, `input`: `(parameters, description)`, the
/// description carrying the input's grammar when it has one.
fn custom_as_function(tool: &Value) -> (Option<Value>, Option<Value>) {
    let mut description = tool
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let format = tool.get("format").unwrap_or(&Value::Null);
    if format.get("type").and_then(Value::as_str) == Some("grammar")
        && let Some(definition) = format.get("definition").and_then(Value::as_str)
    {
        let syntax = format.get("syntax").and_then(Value::as_str).unwrap_or("");
        description.push_str(&format!(
            "\n\n`input` follows this {syntax} grammar:\n{definition}"
        ));
    }
    let parameters = json!({
        "type": "object",
        "properties": {"input": {"type": "string", "description": "The tool's input, as free text."}},
        "required": ["input"],
        "additionalProperties": false,
    });
    (Some(parameters), Some(json!(description.trim_start())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn function(name: &str) -> Value {
        json!({"type": "function", "name": name, "description": format!("{name} it"),
               "parameters": {"type": "object", "properties": {}}})
    }

    #[test]
    fn namespaces_flatten_and_builtin_tools_are_left_out_with_a_warning() {
        let tools = [
            function("exec_command"),
            json!({"type": "namespace", "name": "collaboration", "description": "Agents.",
                   "tools": [function("spawn_agent"), function("exec_command")]}),
            json!({"type": "web_search"}),
            json!({"type": "custom", "name": "apply_patch", "description": "Edit files.",
                   "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"}}),
        ];
        let mut warnings = Warnings::default();
        let offered = Tools::read(&tools, None, &mut warnings).unwrap();
        let names: Vec<&str> = offered
            .functions
            .iter()
            .map(|f| f["function"]["name"].as_str().unwrap())
            .collect();
        // A name two tools share is qualified by its namespace.
        assert_eq!(
            names,
            [
                "exec_command",
                "spawn_agent",
                "collaboration.exec_command",
                "apply_patch"
            ]
        );
        assert_eq!(
            warnings.joined(),
            "OpenAI's built-in tools, which a local model cannot call, are left out: \
             web_search (tools[2])"
        );

        let spawn = offered.client_tool("spawn_agent");
        assert_eq!(spawn.namespace.as_deref(), Some("collaboration"));
        assert_eq!(spawn.kind, ToolKind::Function);
        assert_eq!(
            offered.model_name(Some("collaboration"), "exec_command"),
            "collaboration.exec_command"
        );
        assert_eq!(offered.model_name(None, "exec_command"), "exec_command");

        let patch = &offered.functions[3]["function"];
        assert_eq!(patch["parameters"]["required"], json!(["input"]));
        assert!(
            patch["description"]
                .as_str()
                .unwrap()
                .ends_with("lark grammar:\nstart: x")
        );
        assert_eq!(offered.client_tool("apply_patch").kind, ToolKind::Custom);
        // The response reports the flat tools, not the namespace or the dropped tool.
        let echoed: Vec<&str> = offered
            .echo
            .iter()
            .map(|t| t["type"].as_str().unwrap())
            .collect();
        assert_eq!(echoed, ["function", "function", "function", "custom"]);
    }

    #[test]
    fn tools_declared_in_the_input_are_offered_too() {
        let input = json!([
            {"type": "additional_tools", "role": "developer", "tools": [
                {"type": "namespace", "name": "functions", "tools": [
                    {"type": "custom", "name": "exec", "description": "Run code."},
                    function("wait")]},
                {"type": "web_search"}]},
            {"type": "message", "role": "user", "content": "hi"}
        ]);
        let mut warnings = Warnings::default();
        let offered = Tools::read(&[function("ask")], Some(&input), &mut warnings).unwrap();
        let names: Vec<&str> = offered
            .functions
            .iter()
            .map(|f| f["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["ask", "exec", "wait"]);
        assert_eq!(offered.client_tool("exec").kind, ToolKind::Custom);
        assert_eq!(
            offered.client_tool("wait").namespace.as_deref(),
            Some("functions")
        );
        assert!(
            warnings
                .joined()
                .ends_with("web_search (input[0].tools[1])")
        );
    }

    #[test]
    fn a_tool_without_a_type_is_refused_in_plain_words() {
        let err = Tools::read(&[json!({"name": "x"})], None, &mut Warnings::default()).unwrap_err();
        assert_eq!(
            err.message,
            "tools[0] needs a `type` (\"function\", \"custom\" or \"namespace\")"
        );
    }
}
