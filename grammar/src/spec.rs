//! What a request asks for: the grammar kinds, how API request fields map onto them, and the
//! caps that keep a hostile schema from costing unbounded compile time.

use std::time::Duration;

use serde_json::Value;

use crate::schema_progress::unfinishable_references;
use crate::schema_shape::{breadth, nesting_depth, reference_depth};
use crate::{Error, Result};

/// A constraint on the whole output.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object: Ollama's `format: "json"`, OpenAI's `json_object`.
    JsonObject,
    /// A JSON Schema: Ollama's `format` object, OpenAI's `json_schema.schema`.
    JsonSchema(Value),
    /// A regular expression the whole output must match (Rust `regex` syntax, anchored).
    Regex(String),
    /// A Lark grammar in llguidance's dialect (which can embed `%json` schemas and name
    /// special tokens such as `<|tool_call|>`).
    Lark(String),
    /// A reasoning region of free text, `open` … `close`, that must close before the
    /// constrained output `then` begins (a JSON kind or a regex). With `already_open` the
    /// prompt has opened the region, so the output starts inside it.
    AfterThinking {
        /// The text or special token that opens the region, such as `<think>`.
        open: String,
        /// The text or special token that closes it, such as `</think>`.
        close: String,
        /// Whether the chat template already emitted `open`.
        already_open: bool,
        /// What must follow the region.
        then: Box<GrammarSpec>,
    },
    /// Free text, then optionally (or, with `required`, necessarily) tool calls: each call is
    /// `open`, a JSON value matching one of `calls`, `close`; only a space or a newline or
    /// two between and after calls. The JSON is written compactly with `", "` and `": "` as
    /// separators and no other whitespace, so a call cannot drift into whitespace runs.
    /// Free text cannot contain `open`, so a call is never left unconstrained.
    ToolCalls {
        /// The marker that opens a call, such as `<tool_call>`.
        open: String,
        /// The marker that closes a call, such as `</tool_call>`.
        close: String,
        /// One schema per tool for the whole call object (for Hermes-style templates,
        /// `{"name": {"const": …}, "arguments": <parameters>}`). Each is a root of its own:
        /// its local `$ref`s (`#/…`) point into it (see [`crate::rebase_refs`] for embedding
        /// a tool's parameters).
        calls: Vec<Value>,
        /// Whether at least one call must be made (OpenAI `tool_choice: "required"`).
        required: bool,
        /// Whether more than one call may be made (OpenAI `parallel_tool_calls`).
        parallel: bool,
    },
}

impl GrammarSpec {
    /// Reads Ollama's `format` field: absent, `null` or `""` ask for nothing; `"json"` for any
    /// object; an object is a JSON Schema. Anything else is an error, never ignored.
    pub fn from_ollama_format(format: Option<&Value>) -> Result<Option<Self>> {
        match format {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) if s == "json" => Ok(Some(Self::JsonObject)),
            Some(Value::String(s)) => Err(Error::Unsupported(format!(
                "format {s:?}: expected \"json\" or a JSON Schema object"
            ))),
            Some(Value::Object(_)) => Ok(format.cloned().map(Self::JsonSchema)),
            Some(other) => Err(Error::Unsupported(format!(
                "format must be \"json\" or a JSON Schema object, not {}",
                json_kind(other)
            ))),
        }
    }

    /// Reads OpenAI's `response_format`: `{"type":"text"}` asks for nothing, `json_object` for
    /// any object, `json_schema` for `json_schema.schema`.
    pub fn from_openai_response_format(response_format: Option<&Value>) -> Result<Option<Self>> {
        let Some(rf) = response_format else {
            return Ok(None);
        };
        if rf.is_null() {
            return Ok(None);
        }
        let kind = rf.get("type").and_then(Value::as_str).ok_or_else(|| {
            Error::Unsupported("response_format needs a string field \"type\"".to_string())
        })?;
        match kind {
            "text" => Ok(None),
            "json_object" => Ok(Some(Self::JsonObject)),
            "json_schema" => {
                let schema = rf
                    .get("json_schema")
                    .and_then(|js| js.get("schema"))
                    .ok_or_else(|| {
                        Error::Unsupported(
                            "response_format json_schema needs json_schema.schema".to_string(),
                        )
                    })?;
                Ok(Some(Self::JsonSchema(schema.clone())))
            }
            other => Err(Error::Unsupported(format!(
                "response_format type {other:?}: expected text, json_object or json_schema"
            ))),
        }
    }

    /// The kind's name, as error messages use it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::JsonObject | Self::JsonSchema(_) => "JSON schema",
            Self::Regex(_) => "regular expression",
            Self::Lark(_) => "Lark grammar",
            Self::AfterThinking { then, .. } => then.kind(),
            Self::ToolCalls { .. } => "tool-call schema",
        }
    }

    /// Checks the caps before the compiler sees the input, and that a schema's references
    /// let a value be finished. Nesting is measured first, by a walk that never recurses:
    /// serializing the schema and the finishability check recurse through it.
    pub(crate) fn check(&self, limits: &Limits) -> Result<()> {
        let calls_array;
        let (schema, roots): (&Value, Vec<&Value>) = match self {
            Self::JsonObject => return Ok(()),
            Self::JsonSchema(schema) => (schema, vec![schema]),
            Self::Regex(text) | Self::Lark(text) => {
                return check_size(text.len(), limits);
            }
            Self::AfterThinking {
                open, close, then, ..
            } => {
                if open.is_empty() || close.is_empty() {
                    return Err(Error::Unsupported(
                        "a thinking region needs non-empty open and close markers".to_string(),
                    ));
                }
                return then.check(limits);
            }
            Self::ToolCalls {
                open, close, calls, ..
            } => {
                if open.is_empty() || close.is_empty() || calls.is_empty() {
                    return Err(Error::Unsupported(
                        "tool calls need non-empty markers and at least one schema".to_string(),
                    ));
                }
                if calls.len() > limits.max_alternatives {
                    return Err(over("tools offered", calls.len(), limits.max_alternatives));
                }
                calls_array = Value::Array(calls.clone());
                // Each call is a root of its own for its references.
                (&calls_array, calls.iter().collect())
            }
        };
        let depth = nesting_depth(schema);
        if depth > limits.max_schema_depth {
            return Err(over("schema nesting depth", depth, limits.max_schema_depth));
        }
        check_size(
            serde_json::to_string(schema).map_or(usize::MAX, |s| s.len()),
            limits,
        )?;
        let references = reference_depth(schema, limits.max_reference_depth);
        if references > limits.max_reference_depth {
            return Err(over(
                "chain of `$ref` references",
                references,
                limits.max_reference_depth,
            ));
        }
        let wide = breadth(schema);
        if wide.properties > limits.max_properties {
            return Err(over(
                "properties of one object",
                wide.properties,
                limits.max_properties,
            ));
        }
        if wide.alternatives > limits.max_alternatives {
            return Err(over(
                "alternatives of one anyOf/oneOf/allOf/enum",
                wide.alternatives,
                limits.max_alternatives,
            ));
        }
        if wide.pattern_pairs > limits.max_pattern_pairs {
            return Err(over(
                "pairs of patternProperties to compare",
                wide.pattern_pairs,
                limits.max_pattern_pairs,
            ));
        }
        for root in roots {
            let stuck = unfinishable_references(root);
            if !stuck.is_empty() {
                return Err(Error::Unsatisfiable {
                    kind: self.kind(),
                    reason: describe_stuck(&stuck),
                });
            }
        }
        Ok(())
    }
}

/// "`#/$defs/a` and `#/$defs/b` can only hold …", naming at most a few.
fn describe_stuck(stuck: &[String]) -> String {
    const NAMED: usize = 3;
    let mut names: Vec<String> = stuck
        .iter()
        .take(NAMED)
        .map(|pointer| format!("`#{pointer}`"))
        .collect();
    if stuck.len() > NAMED {
        names.push(format!("{} more", stuck.len() - NAMED));
    }
    let (list, verb) = match names.len() {
        1 => (names.remove(0), "refers back to itself"),
        _ => {
            let last = names.pop().unwrap_or_default();
            let list = format!("{} and {last}", names.join(", "));
            (list, "refer back to one another")
        }
    };
    format!(
        "{list} {verb} with no way out (a `$ref` cycle every value must follow \
         forever); make a property on the cycle optional, allow an empty array, or add an \
         `anyOf` branch without the reference"
    )
}

fn over(what: &'static str, actual: usize, limit: usize) -> Error {
    Error::TooLarge {
        what,
        actual,
        limit,
    }
}

fn check_size(bytes: usize, limits: &Limits) -> Result<()> {
    if bytes > limits.max_bytes {
        return Err(over("grammar source in bytes", bytes, limits.max_bytes));
    }
    Ok(())
}

/// Caps on what a request may compile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Size of the schema (as compact JSON) or grammar text.
    pub max_bytes: usize,
    /// Nesting of JSON values in a schema (each schema level costs about two).
    pub max_schema_depth: usize,
    /// How many `$ref`s one chain may follow (recursion back into a definition on the chain
    /// does not count): the compiler expands chains recursively.
    pub max_reference_depth: usize,
    /// Properties one object may declare: each optional property multiplies the parser's
    /// states, and llguidance refuses rows of more than 2,000 items mid-generation.
    pub max_properties: usize,
    /// Entries of one `anyOf`/`oneOf`/`allOf`/`enum`, and tools offered at once.
    pub max_alternatives: usize,
    /// Pairs of `patternProperties` the compiler proves disjoint, summed over the schema's
    /// objects: it compares every pair of one object's patterns (≈0.1 ms a pair), so 200
    /// patterns on one object cost seconds.
    pub max_pattern_pairs: usize,
    /// How long a caller waits for one compile (including its first mask). llguidance's own
    /// fuel and size limits bound the work; this bounds the wait whatever the machine's load.
    pub max_compile_time: Duration,
}

impl Default for Limits {
    /// 256 KiB, 64 levels of nesting, 64 references deep, 256 properties, 1,024
    /// alternatives and 1,024 pattern pairs (45 patterns on one object): far beyond real
    /// tool schemas, far below what would stall a request thread or overflow llguidance's
    /// limits. Compiles within them take well under a second; 10 s of waiting is a backstop.
    fn default() -> Self {
        Self {
            max_bytes: 256 * 1024,
            max_schema_depth: 64,
            max_reference_depth: 64,
            max_properties: 256,
            max_alternatives: 1024,
            max_pattern_pairs: 1024,
            max_compile_time: Duration::from_secs(10),
        }
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ollama_format_maps_each_form() {
        assert_eq!(GrammarSpec::from_ollama_format(None).unwrap(), None);
        assert_eq!(
            GrammarSpec::from_ollama_format(Some(&json!(""))).unwrap(),
            None
        );
        assert_eq!(
            GrammarSpec::from_ollama_format(Some(&json!("json"))).unwrap(),
            Some(GrammarSpec::JsonObject)
        );
        let schema = json!({"type": "object"});
        assert_eq!(
            GrammarSpec::from_ollama_format(Some(&schema)).unwrap(),
            Some(GrammarSpec::JsonSchema(schema))
        );
        assert!(matches!(
            GrammarSpec::from_ollama_format(Some(&json!("yaml"))),
            Err(Error::Unsupported(_))
        ));
        assert!(matches!(
            GrammarSpec::from_ollama_format(Some(&json!(3))),
            Err(Error::Unsupported(_))
        ));
    }

    #[test]
    fn openai_response_format_maps_each_form() {
        let text = json!({"type": "text"});
        assert_eq!(
            GrammarSpec::from_openai_response_format(Some(&text)).unwrap(),
            None
        );
        let obj = json!({"type": "json_object"});
        assert_eq!(
            GrammarSpec::from_openai_response_format(Some(&obj)).unwrap(),
            Some(GrammarSpec::JsonObject)
        );
        let schema = json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true,
            "schema": {"type": "integer"}}});
        assert_eq!(
            GrammarSpec::from_openai_response_format(Some(&schema)).unwrap(),
            Some(GrammarSpec::JsonSchema(json!({"type": "integer"})))
        );
        for bad in [
            json!({"type": "json_schema"}),
            json!({"type": "xml"}),
            json!({}),
        ] {
            assert!(matches!(
                GrammarSpec::from_openai_response_format(Some(&bad)),
                Err(Error::Unsupported(_))
            ));
        }
    }

    #[test]
    fn caps_reject_long_reference_chains_and_wide_schemas() {
        let mut defs = serde_json::Map::new();
        for i in 0..600 {
            defs.insert(
                format!("d{i}"),
                json!({"$ref": format!("#/$defs/d{}", i + 1)}),
            );
        }
        defs.insert("d600".into(), json!({"type": "string"}));
        let chain = GrammarSpec::JsonSchema(json!({"$ref": "#/$defs/d0", "$defs": defs}));
        assert!(matches!(
            chain.check(&Limits::default()),
            Err(Error::TooLarge {
                what: "chain of `$ref` references",
                ..
            })
        ));
        let limits = Limits::default();
        let wide = |n: usize| {
            let properties: serde_json::Map<_, _> = (0..n)
                .map(|i| (format!("p{i}"), json!({"type": "integer"})))
                .collect();
            GrammarSpec::JsonSchema(json!({"type": "object", "properties": properties}))
        };
        assert!(wide(limits.max_properties).check(&limits).is_ok());
        assert!(matches!(
            wide(limits.max_properties + 1).check(&limits),
            Err(Error::TooLarge {
                what: "properties of one object",
                ..
            })
        ));
        let choices =
            |n: usize| GrammarSpec::JsonSchema(json!({"enum": (0..n).collect::<Vec<_>>()}));
        assert!(choices(limits.max_alternatives).check(&limits).is_ok());
        assert!(choices(limits.max_alternatives + 1).check(&limits).is_err());
    }

    #[test]
    fn each_tool_call_is_checked_as_a_root_of_its_own() {
        let call = |parameters: Value| {
            json!({"type": "object", "required": ["name", "arguments"],
                   "properties": {"name": {"const": "f"}, "arguments": parameters}})
        };
        let mut looping = json!({"$ref": "#"});
        crate::rebase_refs(&mut looping, "/properties/arguments");
        let tools = |calls| GrammarSpec::ToolCalls {
            open: "<call>".into(),
            close: "</call>".into(),
            calls,
            required: false,
            parallel: true,
        };
        let fine = call(json!({"type": "object"}));
        assert!(tools(vec![fine.clone()]).check(&Limits::default()).is_ok());
        match tools(vec![fine, call(looping)]).check(&Limits::default()) {
            Err(Error::Unsatisfiable { kind, reason }) => {
                assert_eq!(kind, "tool-call schema");
                assert!(reason.starts_with("`#/properties/arguments` refers back to itself"));
            }
            other => panic!("expected Unsatisfiable, got {other:?}"),
        }
    }

    #[test]
    fn caps_reject_many_pattern_properties() {
        let patterns = |n: usize| {
            let map: serde_json::Map<_, _> =
                (0..n).map(|i| (format!("^p{i}"), json!({}))).collect();
            GrammarSpec::JsonSchema(json!({"type": "object", "patternProperties": map}))
        };
        let limits = Limits::default();
        // 46 patterns make 1,035 pairs, 45 make 990.
        assert!(patterns(45).check(&limits).is_ok());
        assert!(matches!(
            patterns(46).check(&limits),
            Err(Error::TooLarge {
                what: "pairs of patternProperties to compare",
                actual: 1035,
                ..
            })
        ));
    }

    #[test]
    fn caps_reject_deep_and_large_inputs() {
        let mut deep = json!({"type": "string"});
        for _ in 0..40 {
            deep = json!({"type": "object", "properties": {"x": deep}});
        }
        let err = GrammarSpec::JsonSchema(deep)
            .check(&Limits::default())
            .unwrap_err();
        assert!(matches!(
            err,
            Error::TooLarge {
                what: "schema nesting depth",
                actual: 81,
                limit: 64
            }
        ));
        let big = GrammarSpec::Regex("a".repeat(300 * 1024));
        assert!(matches!(
            big.check(&Limits::default()),
            Err(Error::TooLarge { .. })
        ));
        assert!(
            GrammarSpec::Regex("[a-z]+".into())
                .check(&Limits::default())
                .is_ok()
        );
    }
}
