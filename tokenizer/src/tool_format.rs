//! [`ToolFormat`]: how tools reach a model, and the generic format for models whose chat
//! template cannot show them.
//!
//! A template that renders a `tools` list (it shows a probe tool's name) and a family whose
//! call syntax the output parser reads ([`ToolCallFormat`] other than `None`) get tools the
//! way the model was trained ([`ToolFormat::Template`]). Where the template cannot show them,
//! the tools and an instruction go into the system turn, and earlier calls and tool results
//! are rewritten as the text turns every template accepts ([`tool_messages`]):
//!
//! - a family that writes Hermes calls (ChatML, Qwen: SmolLM2's template has no tool section)
//!   is told of them in Hermes' own words, `<tools>…</tools>` and `<tool_call>…</tool_call>`
//!   ([`ToolFormat::Hermes`]), and its calls are read and constrained as Hermes calls;
//! - every other model gets the generic format ([`ToolFormat::Generic`], llama.cpp's "generic"
//!   chat format is the precedent): the reply is one JSON object (`{"tool_call": …}`,
//!   `{"tool_calls": […]}` or `{"response": "…"}`), held to that shape by a grammar and read
//!   back by [`ToolCallFormat::Generic`].
//!
//! Tools are never silently left out of a prompt (issue 48: 24 tools of Claude Code's vanished
//! from a Gemma 3 prompt).

use serde_json::{Value, json};

use crate::chat_template::{ChatTemplate, Message, RenderOptions};
use crate::family::Family;
use crate::parser::ToolCallFormat;

/// How a model is told about tools and how its calls are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// The chat template renders the tools; calls are read in the family's syntax.
    Template,
    /// Tools in the system turn in Hermes' words; calls are Hermes `<tool_call>` calls.
    Hermes,
    /// The generic format: tools in the system turn, the reply a JSON object.
    Generic,
}

/// A tool name no real tool has, to see whether a template renders tools.
const PROBE_TOOL: &str = "mlxkit_probe_tool_5e1f";

impl ToolFormat {
    /// The format for a model with `template` whose vocabulary is of `family`.
    pub fn detect(template: &ChatTemplate, family: Option<Family>) -> ToolFormat {
        let calls = family.map_or(ToolCallFormat::None, |f| f.parser_config().tool_calls);
        if calls != ToolCallFormat::None && template.renders_tools() {
            ToolFormat::Template
        } else if calls == ToolCallFormat::Hermes {
            ToolFormat::Hermes
        } else {
            ToolFormat::Generic
        }
    }

    /// The name `/api/show` gives it: `template`, `hermes` or `generic`.
    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Template => "template",
            ToolFormat::Hermes => "hermes",
            ToolFormat::Generic => "generic",
        }
    }
}

impl ChatTemplate {
    /// Whether a request's tools reach the prompt this template renders: a one-turn
    /// conversation with a probe tool shows the tool's name. A template that fails with tools
    /// does not render them.
    pub fn renders_tools(&self) -> bool {
        let tool = json!({"type": "function", "function": {
            "name": PROBE_TOOL,
            "description": "Probe.",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
        }});
        let options = RenderOptions {
            add_generation_prompt: true,
            ..RenderOptions::default()
        };
        self.render(&[Message::new("user", "Hi")], Some(&[tool]), &options)
            .is_ok_and(|prompt| prompt.contains(PROBE_TOOL))
    }
}

/// `messages` with `tools` offered in `format` (unchanged for [`ToolFormat::Template`]): the
/// tools and how to call them appended to the leading system turn (one is added when there is
/// none), each earlier assistant turn written as the text of its calls, and each tool result
/// as a user turn (merged with user turns beside it, for templates that want roles to
/// alternate).
///
/// The instruction depends on the tools alone, not on `tool_choice` or whether parallel calls
/// are allowed (the grammar enforces those), so requests that offer the same tools share
/// their prompt's start in the prefix cache, and counting tokens needs no more than the tools.
pub fn tool_messages(format: ToolFormat, messages: &[Message], tools: &[Value]) -> Vec<Message> {
    let instruction = match format {
        ToolFormat::Template => return messages.to_vec(),
        ToolFormat::Hermes => hermes_instruction(tools),
        ToolFormat::Generic => generic_instruction(tools),
    };
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    match messages.first() {
        Some(first) if first.role == "system" || first.role == "developer" => {
            let mut system = first.clone();
            system.content = if system.content.trim().is_empty() {
                instruction
            } else {
                format!("{}\n\n{instruction}", system.content)
            };
            out.push(system);
        }
        _ => out.push(Message::new("system", instruction)),
    }
    let rest = match messages.first() {
        Some(first) if first.role == "system" || first.role == "developer" => &messages[1..],
        _ => messages,
    };
    // Whether the last turn in `out` is a user turn a tool result may merge with.
    let mut mergeable_user = false;
    for message in rest {
        match message.role.as_str() {
            "assistant" => {
                out.push(match format {
                    ToolFormat::Hermes => hermes_assistant_turn(message),
                    _ => assistant_turn(message),
                });
                mergeable_user = false;
            }
            "tool" => {
                let text = match format {
                    ToolFormat::Hermes => {
                        format!("<tool_response>\n{}\n</tool_response>", message.content)
                    }
                    _ => tool_result(message),
                };
                match out.last_mut() {
                    Some(prev) if mergeable_user => {
                        prev.content = format!("{}\n{text}", prev.content)
                    }
                    _ => out.push(Message::new("user", text)),
                }
                mergeable_user = true;
            }
            "user" if mergeable_user => {
                if let Some(prev) = out.last_mut() {
                    prev.content = format!("{}\n\n{}", prev.content, message.content);
                }
            }
            role => {
                out.push(message.clone());
                mergeable_user = role == "user";
            }
        }
    }
    out
}

/// The tools as one JSON object each, `{name, description, parameters}`, a line apiece.
fn tool_lines(tools: &[Value]) -> String {
    let mut text = String::new();
    for tool in tools {
        let function = tool.get("function").unwrap_or(tool);
        let mut entry = serde_json::Map::new();
        for key in ["name", "description", "parameters"] {
            if let Some(value) = function.get(key) {
                entry.insert(key.into(), value.clone());
            }
        }
        text.push_str(&Value::Object(entry).to_string());
        text.push('\n');
    }
    text
}

/// The system turn's account of the tools in Hermes' words (as Qwen's and Hermes' own
/// templates write it).
fn hermes_instruction(tools: &[Value]) -> String {
    format!(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n\
         {}</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>",
        tool_lines(tools)
    )
}

/// An assistant turn with its calls written after its text, one `<tool_call>` each.
fn hermes_assistant_turn(message: &Message) -> Message {
    let mut turn = message.clone();
    turn.tool_calls.clear();
    for call in &message.tool_calls {
        let object = json!({"name": call.function.name, "arguments": call.function.arguments});
        if !turn.content.is_empty() {
            turn.content.push('\n');
        }
        turn.content
            .push_str(&format!("<tool_call>\n{object}\n</tool_call>"));
    }
    turn
}

/// The system turn's account of the tools and of the reply's shape.
fn generic_instruction(tools: &[Value]) -> String {
    let mut text = String::from(
        "You can use tools. These are the tools, each with the JSON Schema of its arguments:\n",
    );
    text.push_str(&tool_lines(tools));
    text.push_str(
        "\nReply with one JSON object and nothing else:\n\
         - to call a tool: {\"tool_call\": {\"name\": \"<tool name>\", \"arguments\": {<arguments>}}}\n\
         - to call several tools at once: {\"tool_calls\": [{\"name\": \"<tool name>\", \
         \"arguments\": {<arguments>}}, …]}\n",
    );
    text.push_str(
        "- to answer: {\"response\": \"<your answer>\"}\n\
         A tool's result comes back as {\"tool_result\": {\"name\": \"<tool name>\", \
         \"content\": <result>}}.",
    );
    text
}

/// An assistant turn as the reply object it stands for: its calls (after any text it had),
/// or its answer.
fn assistant_turn(message: &Message) -> Message {
    let mut turn = message.clone();
    turn.tool_calls.clear();
    let call = |c: &crate::chat_template::MessageToolCall| json!({"name": c.function.name, "arguments": c.function.arguments});
    let reply = match &message.tool_calls[..] {
        [] if message.content.is_empty() => return turn,
        [] => json!({"response": message.content}),
        [one] => json!({"tool_call": call(one)}),
        many => json!({"tool_calls": many.iter().map(call).collect::<Vec<_>>()}),
    };
    turn.content = if message.tool_calls.is_empty() || message.content.trim().is_empty() {
        reply.to_string()
    } else {
        format!("{}\n\n{reply}", message.content.trim_end())
    };
    turn
}

/// A tool turn's text: its content (as JSON when it is JSON) under the tool's name.
fn tool_result(message: &Message) -> String {
    let content = serde_json::from_str::<Value>(&message.content)
        .unwrap_or_else(|_| Value::String(message.content.clone()));
    let mut result = serde_json::Map::new();
    if let Some(name) = &message.name {
        result.insert("name".into(), Value::String(name.clone()));
    }
    result.insert("content".into(), content);
    json!({"tool_result": result}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat_template::MessageToolCall;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
    }

    #[test]
    fn templates_with_and_without_a_tool_section() {
        let with = ChatTemplate::new(
            "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        assert!(with.renders_tools());
        assert_eq!(
            ToolFormat::detect(&with, Some(Family::ChatMl)),
            ToolFormat::Template
        );
        let bare = ChatTemplate::new("{% for m in messages %}{{ m.content }}{% endfor %}", "", "")
            .unwrap();
        assert_eq!(
            ToolFormat::detect(&bare, Some(Family::ChatMl)),
            ToolFormat::Hermes
        );
        assert_eq!(
            ToolFormat::detect(&bare, Some(Family::Llama3)),
            ToolFormat::Generic
        );
        // A family whose calls the parser cannot read gets the generic format anyway.
        assert_eq!(
            ToolFormat::detect(&with, Some(Family::Gemma)),
            ToolFormat::Generic
        );
        assert_eq!(ToolFormat::detect(&with, None), ToolFormat::Generic);
        // Mentioning `tools` is not rendering them.
        let without = ChatTemplate::new(
            "{% if tools %}Tools are on.{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        assert!(!without.renders_tools());
        let raising = ChatTemplate::new(
            "{% if tools %}{{ raise_exception('no tools') }}{% endif %}",
            "",
            "",
        )
        .unwrap();
        assert!(!raising.renders_tools());
        for family in [Family::ChatMl, Family::Qwen3, Family::Llama3] {
            let fallback = ChatTemplate::new(family.fallback_template(), "", "").unwrap();
            assert_eq!(
                ToolFormat::detect(&fallback, Some(family)),
                ToolFormat::Template
            );
        }
        // Mistral's fallback renders earlier calls and results but not the tools offered.
        let mistral = ChatTemplate::new(Family::Mistral.fallback_template(), "", "").unwrap();
        assert_eq!(
            ToolFormat::detect(&mistral, Some(Family::Mistral)),
            ToolFormat::Generic
        );
        let gemma = ChatTemplate::new(Family::Gemma.fallback_template(), "", "").unwrap();
        assert_eq!(
            ToolFormat::detect(&gemma, Some(Family::Gemma)),
            ToolFormat::Generic
        );
    }

    #[test]
    fn tools_and_history_become_text_turns() {
        let mut call = Message::new("assistant", "");
        call.tool_calls = vec![MessageToolCall::new(
            "get_weather",
            json!({"city": "Paris"}),
        )];
        let mut result = Message::new("tool", "{\"temp\": 21}");
        result.name = Some("get_weather".into());
        let messages = [
            Message::new("system", "Be brief."),
            Message::new("user", "Weather in Paris?"),
            call,
            result,
            Message::new("tool", "second result"),
            Message::new("user", "Thanks. And now?"),
        ];
        let out = tool_messages(ToolFormat::Generic, &messages, &[weather()]);
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert!(
            out[0]
                .content
                .starts_with("Be brief.\n\nYou can use tools.")
        );
        assert!(out[0].content.contains("\"name\":\"get_weather\""));
        assert!(out[0].content.contains("Weather in a city."));
        assert!(out.iter().all(|m| m.tool_calls.is_empty()));
        assert_eq!(
            out[2].content,
            r#"{"tool_call":{"name":"get_weather","arguments":{"city":"Paris"}}}"#
        );
        assert_eq!(
            out[3].content,
            "{\"tool_result\":{\"name\":\"get_weather\",\"content\":{\"temp\":21}}}\n\
             {\"tool_result\":{\"content\":\"second result\"}}\n\nThanks. And now?"
        );
        // Without a system turn, one is added; answers are written as reply objects.
        let out = tool_messages(
            ToolFormat::Generic,
            &[
                Message::new("user", "Hi"),
                Message::new("assistant", "Hello!"),
                Message::new("user", "Bye"),
            ],
            &[weather()],
        );
        assert_eq!(out[0].role, "system");
        assert!(out[0].content.contains("tool_calls"));
        assert_eq!(out[2].content, r#"{"response":"Hello!"}"#);
        assert_eq!(out.len(), 4);
    }

    #[test]
    fn hermes_turns_carry_calls_and_results_in_hermes_markup() {
        let mut call = Message::new("assistant", "Checking.");
        call.tool_calls = vec![MessageToolCall::new(
            "get_weather",
            json!({"city": "Paris"}),
        )];
        let messages = [
            Message::new("user", "Weather?"),
            call,
            Message::new("tool", "sunny"),
        ];
        let out = tool_messages(ToolFormat::Hermes, &messages, &[weather()]);
        assert_eq!(out[0].role, "system");
        assert!(out[0].content.contains("<tools>\n{"), "{}", out[0].content);
        assert_eq!(
            out[2].content,
            "Checking.\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>"
        );
        assert_eq!(out[3].role, "user");
        assert_eq!(out[3].content, "<tool_response>\nsunny\n</tool_response>");
        let unchanged = tool_messages(ToolFormat::Template, &messages, &[weather()]);
        assert_eq!(unchanged, messages);
    }

    #[test]
    fn the_gemma_template_renders_the_rewritten_conversation() {
        let gemma = ChatTemplate::new(Family::Gemma.fallback_template(), "<bos>", "<eos>").unwrap();
        let mut call = Message::new("assistant", "");
        call.tool_calls = vec![MessageToolCall::new(
            "get_weather",
            json!({"city": "Paris"}),
        )];
        let messages = [
            Message::new("user", "Weather?"),
            call,
            Message::new("tool", "sunny"),
        ];
        let options = RenderOptions {
            add_generation_prompt: true,
            ..RenderOptions::default()
        };
        let prompt = gemma
            .render(
                &tool_messages(ToolFormat::Generic, &messages, &[weather()]),
                None,
                &options,
            )
            .unwrap();
        assert!(prompt.contains("get_weather"), "{prompt}");
        assert!(
            prompt.contains("{\"tool_result\":{\"content\":\"sunny\"}}"),
            "{prompt}"
        );
        assert!(prompt.ends_with("<start_of_turn>model\n"), "{prompt}");
    }
}
