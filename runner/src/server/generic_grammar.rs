//! The grammar of the generic tool format (see [`tokenizer::ToolFormat`]): the whole reply is
//! one JSON object, a call `{"tool_call": {"name", "arguments"}}`, several calls
//! `{"tool_calls": [...]}` when parallel calls are allowed, or, unless a call is required, an
//! answer `{"response": "..."}`. Each call's `name` is one tool's and its `arguments` that
//! tool's schema. The shape follows llama.cpp's "generic" chat format.

use grammar::GrammarSpec;
use serde_json::{Value, json};
use tokenizer::ThinkingTags;

use crate::server::request_error::RequestError;
use crate::server::requested_shape::{Requested, ToolChoice, fitted_tool};

/// The constraint for `requested`'s tools in the generic format; `thinking` (the tags, and
/// whether the prompt opened the region) puts a reasoning region first.
pub fn spec(
    requested: &Requested,
    thinking: Option<(&ThinkingTags, bool)>,
    loosened: &mut Vec<String>,
) -> Result<GrammarSpec, RequestError> {
    let mut defs = serde_json::Map::new();
    let mut calls = Vec::new();
    for (i, tool) in requested.tools.iter().enumerate() {
        let Some((name, mut parameters)) = fitted_tool(requested, i, tool, loosened)? else {
            continue;
        };
        // Each tool's parameters once, under `$defs`, with their own `$ref`s rebased there.
        let def = format!("tool{i}");
        grammar::rebase_refs(&mut parameters, &format!("/$defs/{def}"));
        defs.insert(def.clone(), parameters);
        calls.push(json!({
            "type": "object",
            "properties": {
                "name": {"const": name},
                "arguments": {"$ref": format!("#/$defs/{def}")},
            },
            "required": ["name", "arguments"],
            "additionalProperties": false,
        }));
    }
    if calls.is_empty() {
        let named = match &requested.choice {
            ToolChoice::Named(name) => name.as_str(),
            _ => "",
        };
        return Err(RequestError::invalid(format!(
            "`tool_choice` names {named:?}, which is not among `tools`"
        )));
    }
    let call = match <[Value; 1]>::try_from(calls) {
        Ok([one]) => one,
        Err(calls) => json!({"anyOf": calls}),
    };
    let mut replies = vec![object_of("tool_call", call.clone())];
    if requested.parallel_calls {
        replies.push(object_of(
            "tool_calls",
            json!({"type": "array", "items": call, "minItems": 1}),
        ));
    }
    let must_call = matches!(
        requested.choice,
        ToolChoice::Required | ToolChoice::Named(_)
    );
    if !must_call {
        replies.push(object_of("response", json!({"type": "string"})));
    }
    let mut schema = match <[Value; 1]>::try_from(replies) {
        Ok([one]) => one,
        Err(replies) => json!({"anyOf": replies}),
    };
    schema["$defs"] = Value::Object(defs);
    let reply = GrammarSpec::JsonSchema(schema);
    Ok(match thinking {
        Some((tags, already_open)) => GrammarSpec::AfterThinking {
            open: tags.open.clone(),
            close: tags.close.clone(),
            already_open,
            then: Box::new(reply),
        },
        None => reply,
    })
}

/// `{key: value}`, that key alone.
fn object_of(key: &str, value: Value) -> Value {
    json!({
        "type": "object",
        "properties": { key: value },
        "required": [key],
        "additionalProperties": false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Value {
        json!({"type": "function", "function": {"name": name,
            "parameters": {"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}},
                           "$defs": {"X": {"type": "string"}}}}})
    }

    fn requested(choice: ToolChoice, parallel: bool) -> Requested {
        Requested {
            format: None,
            tools: vec![tool("a"), tool("b")],
            choice,
            parallel_calls: parallel,
        }
    }

    fn schema(spec: GrammarSpec) -> Value {
        match spec {
            GrammarSpec::JsonSchema(schema) => schema,
            other => panic!("expected a schema, got {other:?}"),
        }
    }

    #[test]
    fn auto_allows_an_answer_or_calls() {
        let s = schema(spec(&requested(ToolChoice::Auto, true), None, &mut Vec::new()).unwrap());
        let keys: Vec<&str> = s["anyOf"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["required"][0].as_str().unwrap())
            .collect();
        assert_eq!(keys, ["tool_call", "tool_calls", "response"]);
        let call = &s["anyOf"][0]["properties"]["tool_call"]["anyOf"][1];
        assert_eq!(call["properties"]["name"]["const"], "b");
        assert_eq!(call["properties"]["arguments"]["$ref"], "#/$defs/tool1");
        assert_eq!(
            s["$defs"]["tool1"]["properties"]["x"]["$ref"],
            "#/$defs/tool1/$defs/X"
        );
    }

    #[test]
    fn required_and_named_calls_leave_no_answer() {
        let s = schema(
            spec(
                &requested(ToolChoice::Required, false),
                None,
                &mut Vec::new(),
            )
            .unwrap(),
        );
        assert_eq!(s["required"][0], "tool_call");
        assert!(s.get("anyOf").is_none());
        let s = schema(
            spec(
                &requested(ToolChoice::Named("b".into()), false),
                None,
                &mut Vec::new(),
            )
            .unwrap(),
        );
        assert_eq!(
            s["properties"]["tool_call"]["properties"]["name"]["const"],
            "b"
        );
        assert!(
            spec(
                &requested(ToolChoice::Named("c".into()), false),
                None,
                &mut Vec::new()
            )
            .is_err()
        );
    }

    #[test]
    fn thinking_comes_first() {
        let tags = ThinkingTags {
            open: "<think>".into(),
            close: "</think>".into(),
        };
        let spec = spec(
            &requested(ToolChoice::Auto, true),
            Some((&tags, true)),
            &mut Vec::new(),
        )
        .unwrap();
        assert!(matches!(
            spec,
            GrammarSpec::AfterThinking {
                already_open: true,
                ..
            }
        ));
    }
}
