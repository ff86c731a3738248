//! The JSON inside each family's tool-call syntax.

use serde_json::Value;

use super::ToolCall;

/// One call object: `{"name": …, "arguments"|"parameters": …}`. Arguments given as a string
/// holding JSON (as some models write them) are decoded; absent arguments are `{}`.
pub(super) fn call_from_object(value: &Value) -> Result<ToolCall, String> {
    let Some(obj) = value.as_object() else {
        return Err(format!("tool call is not a JSON object: {value}"));
    };
    let name = obj
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("tool call has no string \"name\": {value}"))?
        .to_string();
    let arguments = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(Value::String(text)) => serde_json::from_str(text)
            .map_err(|e| format!("arguments of `{name}` are a string but not JSON: {e}"))?,
        Some(args) => args.clone(),
    };
    if !arguments.is_object() {
        return Err(format!(
            "arguments of `{name}` are not a JSON object: {arguments}"
        ));
    }
    Ok(ToolCall { name, arguments })
}

/// The body between `<tool_call>` and `</tool_call>`.
pub(super) fn hermes_call(body: &str) -> Result<ToolCall, String> {
    let value: Value = serde_json::from_str(body.trim())
        .map_err(|e| format!("tool call is not valid JSON ({e}): {body}"))?;
    call_from_object(&value)
}

/// Whether a complete JSON value is a Llama 3 tool call rather than an answer that happens to
/// be JSON.
pub(super) fn looks_like_llama3_call(value: &Value) -> bool {
    value.get("name").is_some_and(Value::is_string)
        && (value.get("parameters").is_some() || value.get("arguments").is_some())
}

/// A Mistral list (or single object) of calls.
pub(super) fn mistral_calls(value: &Value) -> Result<Vec<ToolCall>, String> {
    match value {
        Value::Array(items) => items.iter().map(call_from_object).collect(),
        other => call_from_object(other).map(|call| vec![call]),
    }
}

/// The outcome of reading one JSON value from the front of streamed text.
pub(super) enum JsonPrefix {
    /// A complete value and the number of bytes it took.
    Complete(Value, usize),
    /// The text so far is a valid start; more is needed.
    Incomplete,
    /// The text cannot start a JSON value.
    Invalid(String),
}

pub(super) fn json_prefix(text: &str) -> JsonPrefix {
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    match stream.next() {
        Some(Ok(value)) => JsonPrefix::Complete(value, stream.byte_offset()),
        Some(Err(err)) if err.is_eof() => JsonPrefix::Incomplete,
        Some(Err(err)) => JsonPrefix::Invalid(err.to_string()),
        None => JsonPrefix::Incomplete,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn call_shapes() {
        let call = hermes_call(r#" {"name": "f", "arguments": {"x": 1}} "#).unwrap();
        assert_eq!(
            call,
            ToolCall {
                name: "f".into(),
                arguments: json!({"x": 1})
            }
        );
        let call = call_from_object(&json!({"name": "f", "parameters": "{\"y\": 2}"})).unwrap();
        assert_eq!(call.arguments, json!({"y": 2}));
        assert_eq!(
            call_from_object(&json!({"name": "f"})).unwrap().arguments,
            json!({})
        );
        assert!(hermes_call("{\"name\": 3}").unwrap_err().contains("name"));
        assert!(hermes_call("{oops").unwrap_err().contains("not valid JSON"));
        assert!(call_from_object(&json!({"name": "f", "arguments": [1]})).is_err());
    }

    #[test]
    fn json_prefix_states() {
        assert!(matches!(
            json_prefix(r#"{"a": [1, "#),
            JsonPrefix::Incomplete
        ));
        assert!(matches!(
            json_prefix(r#"{"a": 1} tail"#),
            JsonPrefix::Complete(_, 8)
        ));
        assert!(matches!(json_prefix(r#"{"a" 1}"#), JsonPrefix::Invalid(_)));
    }
}
