//! Structured output: what a request asks of the shape of its output (`format`,
//! `response_format`, tools with `tool_choice`), fitted to the model's output syntax (a
//! thinking region first, Hermes tool-call markers) and compiled against its vocabulary.
//!
//! A request that asks for a shape gets that shape or a 400 naming why it cannot: never
//! silently unconstrained text. A valid JSON Schema is never refused for a keyword the grammar
//! engine lacks: that keyword is dropped from its subschema, logged, and reported to the
//! client (`x-mlxkit-schema-loosened`, see `server::loosened`); only an invalid schema is a
//! 400 (issue 48).
//!
//! Tool calls, forced or not, are held tighter than JSON Schema's letter: their JSON is
//! written compactly (no free whitespace), and an object in a tool's parameters that lists
//! its properties takes no others unless it says so (`grammar::close_objects`). A model that
//! must call pads open objects with invented keys until its budget runs out; a tool cannot
//! use keys it never declared. Auto mode is held the same way: a call it makes has the same
//! tool to satisfy.

use std::sync::Arc;

use grammar::{Grammar, GrammarCompiler, GrammarSpec, Loosened};
use serde_json::json;
use tokenizer::{ParserConfig, ToolCallFormat};

use crate::engine::ModelInfo;
use crate::server::request_error::RequestError;
use crate::server::requested_shape::{Requested, ToolChoice, fitted_tool};

/// Hermes-style tool-call markers (ChatML and Qwen families).
const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";

/// A request's whole-output constraint, fitted to what the grammar engine compiles.
#[derive(Debug, Clone, PartialEq)]
pub struct Constraint {
    /// What to compile.
    pub spec: GrammarSpec,
    /// Where the client's schemas were loosened to compile, each as `tools[3] #/pointer:
    /// keyword` or `format #/pointer: keyword`.
    pub loosened: Vec<String>,
}

/// The whole-output constraint for `requested`, given how this model writes its answer
/// (`parser`: `None` for raw completions, which have no thinking or tool syntax).
///
/// - A format becomes the answer's shape; when the model is thinking, a reasoning region
///   must close first.
/// - Otherwise, tools offered to a model with Hermes tool calls pin every call to its tool's
///   schema, with free text allowed before the calls unless a call is required.
/// - A format with tools constrains the answer only; calls stay free (the two cannot both
///   hold for one output).
///
/// Schemas are fitted on the way (see the module docs); an invalid one is a 400.
pub fn spec_for(
    requested: &Requested,
    parser: Option<&ParserConfig>,
) -> Result<Option<Constraint>, RequestError> {
    let thinking = parser.and_then(|p| {
        let active = p.think || p.starts_in_thinking;
        p.thinking
            .as_ref()
            .filter(|_| active)
            .map(|tags| (tags, p.starts_in_thinking))
    });
    if let Some(format) = &requested.format {
        let mut loosened = Vec::new();
        let format = fit_format(format, &mut loosened)?;
        let spec = match thinking {
            Some((tags, already_open)) => GrammarSpec::AfterThinking {
                open: tags.open.clone(),
                close: tags.close.clone(),
                already_open,
                then: Box::new(format),
            },
            None => format,
        };
        return Ok(Some(Constraint { spec, loosened }));
    }
    let must_call = matches!(
        requested.choice,
        ToolChoice::Required | ToolChoice::Named(_)
    );
    if requested.tools.is_empty() || requested.choice == ToolChoice::None {
        if must_call {
            return Err(RequestError::invalid(
                "`tool_choice` asks for a tool call but no `tools` were given",
            ));
        }
        return Ok(None);
    }
    // A template without a tool section: the generic format's reply object.
    if parser.is_some_and(|p| p.tool_calls == ToolCallFormat::Generic) {
        let mut loosened = Vec::new();
        let spec = crate::server::generic_grammar::spec(requested, thinking, &mut loosened)?;
        return Ok(Some(Constraint { spec, loosened }));
    }
    let hermes = parser.is_some_and(|p| p.tool_calls == ToolCallFormat::Hermes);
    if !hermes || thinking.is_some() {
        if must_call {
            let why = if hermes {
                "while the model is thinking (set `think`/`reasoning_effort` off)"
            } else {
                "for this model's tool-call syntax"
            };
            return Err(RequestError::invalid(format!(
                "a required tool call cannot be enforced {why}"
            )));
        }
        // Auto: calls are parsed from free output, as without structured output.
        return Ok(None);
    }
    let mut calls = Vec::with_capacity(requested.tools.len());
    let mut loosened = Vec::new();
    for (i, tool) in requested.tools.iter().enumerate() {
        let Some((name, mut parameters)) = fitted_tool(requested, i, tool, &mut loosened)? else {
            continue;
        };
        grammar::rebase_refs(&mut parameters, "/properties/arguments");
        calls.push(json!({
            "type": "object",
            "properties": { "name": { "const": name }, "arguments": parameters },
            "required": ["name", "arguments"],
            "additionalProperties": false,
        }));
    }
    if calls.is_empty() {
        return Err(RequestError::invalid(format!(
            "`tool_choice` names {:?}, which is not among `tools`",
            match &requested.choice {
                ToolChoice::Named(name) => name.as_str(),
                _ => "",
            }
        )));
    }
    Ok(Some(Constraint {
        spec: GrammarSpec::ToolCalls {
            open: HERMES_OPEN.to_string(),
            close: HERMES_CLOSE.to_string(),
            calls,
            required: must_call,
            parallel: requested.parallel_calls,
        },
        loosened,
    }))
}

/// `format` with its schema fitted, notes added to `loosened` and logged.
fn fit_format(
    format: &GrammarSpec,
    loosened: &mut Vec<String>,
) -> Result<GrammarSpec, RequestError> {
    let GrammarSpec::JsonSchema(schema) = format else {
        return Ok(format.clone());
    };
    let mut schema = schema.clone();
    let notes: Vec<Loosened> =
        grammar::fit_schema(&mut schema).map_err(|e| RequestError::invalid(e.to_string()))?;
    for note in notes {
        tracing::warn!(
            pointer = %note.pointer,
            loosened = %note.what,
            "output schema loosened: the grammar engine cannot enforce this part"
        );
        loosened.push(format!("format {note}"));
    }
    Ok(GrammarSpec::JsonSchema(schema))
}

/// Compiles `spec` for the loaded model on a blocking thread (the first use builds the
/// vocabulary's parser factory, ≈0.2 s; a schema compiles in milliseconds).
pub async fn compile(info: &Arc<ModelInfo>, spec: GrammarSpec) -> Result<Grammar, RequestError> {
    let info = Arc::clone(info);
    tokio::task::spawn_blocking(move || {
        let compiler = info
            .grammar_compiler
            .get_or_init(|| GrammarCompiler::new(&info.tokenizer).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| {
                RequestError::refused(format!(
                    "structured output is not available for `{}`: {e}",
                    info.name
                ))
            })?;
        compiler.compile(&spec).map_err(|e| match e {
            grammar::Error::Unsupported(_)
            | grammar::Error::Invalid { .. }
            | grammar::Error::TooLarge { .. }
            | grammar::Error::Unsatisfiable { .. }
            | grammar::Error::CompileTimeout { .. } => RequestError::invalid(e.to_string()),
            grammar::Error::Busy { .. } => RequestError::Busy(e.to_string()),
            other => RequestError::refused(format!(
                "structured output is not available for `{}`: {other}",
                info.name
            )),
        })
    })
    .await
    .map_err(|e| RequestError::task_failed("compiling the output constraint", &e))?
}

/// The compiled constraint for `requested`, if it asks for one, and where its schemas were
/// loosened to compile.
pub async fn prepare(
    info: &Arc<ModelInfo>,
    requested: &Requested,
    parser: Option<&ParserConfig>,
) -> Result<(Option<Grammar>, Vec<String>), RequestError> {
    match spec_for(requested, parser)? {
        Some(Constraint { spec, loosened }) => Ok((Some(compile(info, spec).await?), loosened)),
        None => Ok((None, Vec::new())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use tokenizer::Family;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}})
    }

    fn spec(
        r: &Requested,
        parser: Option<&ParserConfig>,
    ) -> Result<Option<GrammarSpec>, RequestError> {
        spec_for(r, parser).map(|c| c.map(|c| c.spec))
    }

    fn requested(format: Option<GrammarSpec>, tools: Vec<Value>, choice: ToolChoice) -> Requested {
        Requested {
            format,
            tools,
            choice,
            parallel_calls: true,
        }
    }

    #[test]
    fn a_format_passes_through_without_thinking() {
        let chatml = Family::ChatMl.parser_config();
        let r = requested(Some(GrammarSpec::JsonObject), vec![], ToolChoice::Auto);
        assert_eq!(
            spec(&r, Some(&chatml)).unwrap(),
            Some(GrammarSpec::JsonObject)
        );
        assert_eq!(spec(&r, None).unwrap(), Some(GrammarSpec::JsonObject));
    }

    #[test]
    fn a_thinking_model_closes_its_region_before_the_format() {
        let qwen3 = Family::Qwen3.parser_config().starting_in_thinking(true);
        let r = requested(Some(GrammarSpec::JsonObject), vec![], ToolChoice::Auto);
        match spec(&r, Some(&qwen3)).unwrap() {
            Some(GrammarSpec::AfterThinking {
                open,
                close,
                already_open,
                then,
            }) => {
                assert_eq!((open.as_str(), close.as_str()), ("<think>", "</think>"));
                assert!(already_open);
                assert_eq!(*then, GrammarSpec::JsonObject);
            }
            other => panic!("expected a thinking region, got {other:?}"),
        }
        // Thinking switched off: the format alone.
        let off = Family::Qwen3.parser_config().with_think(false);
        assert_eq!(spec(&r, Some(&off)).unwrap(), Some(GrammarSpec::JsonObject));
    }

    #[test]
    fn hermes_tools_are_pinned_to_their_schemas() {
        let chatml = Family::ChatMl.parser_config();
        let r = requested(None, vec![weather()], ToolChoice::Required);
        match spec(&r, Some(&chatml)).unwrap() {
            Some(GrammarSpec::ToolCalls {
                open,
                close,
                calls,
                required,
                parallel,
            }) => {
                assert_eq!((open.as_str(), close.as_str()), (HERMES_OPEN, HERMES_CLOSE));
                assert!(required);
                assert!(parallel);
                assert_eq!(calls.len(), 1);
                assert_eq!(calls[0]["properties"]["name"]["const"], "weather");
                assert_eq!(calls[0]["properties"]["arguments"]["required"][0], "city");
            }
            other => panic!("expected tool calls, got {other:?}"),
        }
        let auto = requested(None, vec![weather()], ToolChoice::Auto);
        assert!(matches!(
            spec(&auto, Some(&chatml)).unwrap(),
            Some(GrammarSpec::ToolCalls {
                required: false,
                ..
            })
        ));
    }

    #[test]
    fn impossible_tool_choices_are_errors() {
        let chatml = Family::ChatMl.parser_config();
        let llama = Family::Llama3.parser_config();
        let named = |n: &str| requested(None, vec![weather()], ToolChoice::Named(n.into()));
        assert!(spec(&named("stocks"), Some(&chatml)).is_err());
        assert!(spec(&named("weather"), Some(&chatml)).unwrap().is_some());
        assert!(spec(&named("weather"), Some(&llama)).is_err());
        let no_tools = requested(None, vec![], ToolChoice::Required);
        assert!(spec(&no_tools, Some(&chatml)).is_err());
        // Auto on a model whose calls cannot be constrained stays free, as before.
        let auto = requested(None, vec![weather()], ToolChoice::Auto);
        assert_eq!(spec(&auto, Some(&llama)).unwrap(), None);
        let nameless = requested(None, vec![json!({"type": "function"})], ToolChoice::Auto);
        assert!(spec(&nameless, Some(&chatml)).is_err());
    }

    #[test]
    fn unsupported_keywords_are_loosened_and_named() {
        let chatml = Family::ChatMl.parser_config();
        let bash = json!({"type": "function", "function": {"name": "Bash", "parameters": {
            "type": "object",
            "properties": {"env": {"type": "object", "propertyNames": {"pattern": "^[A-Z]+$"},
                                   "additionalProperties": {"type": "string"}}},
            "required": ["env"]}}});
        let r = requested(None, vec![weather(), bash], ToolChoice::Auto);
        let constraint = spec_for(&r, Some(&chatml)).unwrap().unwrap();
        assert_eq!(
            constraint.loosened,
            ["tools[1] #/properties/env: propertyNames"]
        );
        let GrammarSpec::ToolCalls { calls, .. } = &constraint.spec else {
            panic!("expected tool calls, got {:?}", constraint.spec);
        };
        let env = &calls[1]["properties"]["arguments"]["properties"]["env"];
        assert_eq!(
            env,
            &json!({"type": "object", "additionalProperties": {"type": "string"}})
        );

        let format = GrammarSpec::JsonSchema(json!({"type": "array", "uniqueItems": true}));
        let r = requested(Some(format), vec![], ToolChoice::Auto);
        let constraint = spec_for(&r, Some(&chatml)).unwrap().unwrap();
        assert_eq!(constraint.loosened, ["format #: uniqueItems"]);
        assert_eq!(
            constraint.spec,
            GrammarSpec::JsonSchema(json!({"type": "array"}))
        );
    }

    #[test]
    fn tool_arguments_take_only_their_listed_properties() {
        let chatml = Family::ChatMl.parser_config();
        let open = json!({"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "string"},
                                             "m": {"type": "object", "additionalProperties": true}}}}});
        let r = requested(None, vec![open], ToolChoice::Required);
        let Some(GrammarSpec::ToolCalls { calls, .. }) = spec(&r, Some(&chatml)).unwrap() else {
            panic!("expected tool calls");
        };
        let arguments = &calls[0]["properties"]["arguments"];
        assert_eq!(arguments["additionalProperties"], false);
        assert_eq!(arguments["properties"]["m"]["additionalProperties"], true);
    }

    #[test]
    fn an_invalid_tool_schema_is_a_short_error_naming_the_tool() {
        let chatml = Family::ChatMl.parser_config();
        let description = "d".repeat(20_000);
        let bad = json!({"type": "function", "function": {"name": "g", "parameters": {
            "type": "object", "description": description,
            "properties": {"x": {"type": "strin"}}}}});
        let r = requested(None, vec![weather(), bad], ToolChoice::Auto);
        let message = match spec_for(&r, Some(&chatml)) {
            Err(RequestError::Invalid(message)) => message,
            other => panic!("expected a 400, got {other:?}"),
        };
        assert!(
            message.starts_with("`tools[1]` (g) parameters: invalid JSON schema"),
            "{message}"
        );
        assert!(message.contains("#/properties/x/type"), "{message}");
        assert!(message.len() < 500, "{} chars", message.len());
    }

    #[test]
    fn tool_choice_is_read_strictly() {
        assert_eq!(ToolChoice::from_openai(None).unwrap(), ToolChoice::Auto);
        assert_eq!(
            ToolChoice::from_openai(Some(&json!("required"))).unwrap(),
            ToolChoice::Required
        );
        assert_eq!(
            ToolChoice::from_openai(Some(
                &json!({"type": "function", "function": {"name": "f"}})
            ))
            .unwrap(),
            ToolChoice::Named("f".into())
        );
        assert!(ToolChoice::from_openai(Some(&json!("always"))).is_err());
        assert!(ToolChoice::from_openai(Some(&json!(3))).is_err());
    }
}
