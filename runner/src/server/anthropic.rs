//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`, which
//! coding agents (Claude Code and others) speak to local servers.
//!
//! A conversation's content blocks map onto template messages: text joins a turn's content,
//! `tool_use` blocks become the assistant turn's tool calls, each `tool_result` a `tool` turn
//! (named by the call it answers), `thinking` the turn's reasoning. Messages render in the
//! order sent, so a system reminder an agent inserts after every tool result stays where it
//! was and the prompt's prefix is the previous turn's (the prefix cache hits).
//!
//! A `system` message inside `messages` (Claude Code's `mid-conversation-system` beta) is a
//! system turn at its place when the model's template renders it there; where the template
//! raises on it or leaves it out, it is folded into the user turn beside it
//! ([`tokenizer::LateSystem`]; the log says which).
//!
//! What Claude's API does on Anthropic's side and a local server cannot (server tools such as
//! web search, the MCP connector) is accepted and left undone with a warning (the
//! `x-mlxkit-warning` header and the log, see [`crate::server::warnings`]), never refused: an
//! agent sends these by default.

use std::collections::HashMap;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokenizer::{Message, MessageToolCall};
use tokio::sync::mpsc::Receiver;

use crate::engine::DoneReason;
use crate::server::error::ApiError;
use crate::server::generation::{Output, Summary};
use crate::server::options::GenerationOptions;
use crate::server::prompt::{self, Attachments};
use crate::server::request::{self, GenerationRequest, PromptSource};
use crate::server::requested_shape::{self, Requested, ToolChoice};
use crate::server::sse::{SseShape, sse};
use crate::server::warnings::Warnings;
use crate::server::{AppState, JsonBody, item_id, push_str, stored_model};

/// `/v1/messages`' body. Beside the fields read here, the API's others are accepted:
///
/// - `cache_control` on any block, the system prompt or a tool: nothing to do, the prefix
///   cache reuses whatever prefix a prompt shares with an earlier one.
/// - `metadata`, `service_tier`, `container`, `inference_geo`, and the `anthropic-beta` and
///   `anthropic-version` headers: they steer Anthropic's service, not a local model; ignored.
/// - `output_config.effort` and `output_config.task_budget`: advisory spending levels a local
///   model has no switch for (`thinking` is its reasoning switch); ignored.
/// - `context_management`: server-side editing of old tool results and thinking is not done,
///   the conversation renders as sent; the reply's `context_management.applied_edits` is empty.
/// - `mcp_servers` (the MCP connector) and server tools: dropped with a warning.
#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    model: String,
    #[serde(default)]
    max_tokens: Option<Value>,
    messages: Vec<InputMessage>,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    stop_sequences: Option<Value>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    temperature: Option<Value>,
    #[serde(default)]
    top_p: Option<Value>,
    #[serde(default)]
    top_k: Option<Value>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    thinking: Option<Value>,
    /// `effort`, `task_budget` (ignored, see above) and `format`, a JSON schema the answer
    /// follows.
    #[serde(default)]
    output_config: Option<Value>,
    /// The structured-outputs beta's spelling of `output_config.format`.
    #[serde(default)]
    output_format: Option<Value>,
    #[serde(default)]
    context_management: Option<Value>,
    #[serde(default)]
    mcp_servers: Option<Value>,
}

/// `/v1/messages/count_tokens`' body.
#[derive(Debug, Deserialize)]
pub struct CountTokensRequest {
    model: String,
    messages: Vec<InputMessage>,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    thinking: Option<Value>,
}

/// One message: a role and a string or a list of content blocks.
#[derive(Debug, Deserialize)]
pub struct InputMessage {
    role: String,
    content: Value,
}

/// The conversation as the template sees it.
struct Conversation {
    messages: Vec<Message>,
    /// Tools in the OpenAI function shape the templates and the grammar take.
    tools: Vec<Value>,
    attachments: Attachments,
    /// What of the request is left undone.
    warnings: Warnings,
}

/// A failure on Anthropic's endpoints (`/v1/messages`, token counting), answered in Anthropic's
/// shape: this is where every error they meet is put in their wire format.
#[derive(Debug)]
pub struct AnthropicError(ApiError);

impl<E: Into<ApiError>> From<E> for AnthropicError {
    fn from(e: E) -> AnthropicError {
        AnthropicError(e.into().anthropic())
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        self.0.into_response()
    }
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message)
}

/// The conversation of a request: its system prompt, its messages block by block, its tools.
fn conversation(
    system: Option<&Value>,
    input: &[InputMessage],
    tools: Option<&[Value]>,
) -> Result<Conversation, ApiError> {
    let mut messages = Vec::with_capacity(input.len() + 1);
    let mut attachments = Attachments::default();
    let mut warnings = Warnings::default();
    if let Some(system) = system {
        let text = system_text(system, "`system`")?;
        if !text.is_empty() {
            messages.push(Message::new("system", text));
        }
    }
    // Tool results name the call they answer by id; templates want the tool's name.
    let mut call_names: HashMap<String, String> = HashMap::new();
    let mut server_blocks = Vec::new();
    for (i, message) in input.iter().enumerate() {
        match message.role.as_str() {
            "user" | "assistant" => {}
            // A system turn where it stands; the template places it (see the module docs).
            "system" => {
                let text = system_text(&message.content, &format!("messages[{i}]"))?;
                messages.push(Message::new("system", text));
                continue;
            }
            other => {
                return Err(bad(format!(
                    "messages[{i}].role is {other:?}: expected \"user\", \"assistant\" or \
                     \"system\""
                )));
            }
        }
        let blocks = match &message.content {
            Value::String(text) => vec![json!({"type": "text", "text": text})],
            Value::Array(blocks) => blocks.clone(),
            other => {
                return Err(bad(format!(
                    "messages[{i}].content must be a string or a list of content blocks, \
                     got {other}"
                )));
            }
        };
        let mut turn = Message::new(message.role.clone(), "");
        for (j, block) in blocks.iter().enumerate() {
            let at = || format!("messages[{i}].content[{j}]");
            let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
            match kind {
                "text" => {
                    let text = block
                        .get("text")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(format!("{} is a text block without `text`", at())))?;
                    turn.content.push_str(text);
                }
                "image" => {
                    // The image's place among the turn's text.
                    let bytes = image_block(block, &at)?;
                    turn.content.push_str(&attachments.add_image(bytes));
                }
                "thinking" => {
                    let thought = block.get("thinking").and_then(Value::as_str).unwrap_or("");
                    let reasoning = turn.reasoning_content.get_or_insert_with(String::new);
                    reasoning.push_str(thought);
                }
                // Encrypted reasoning from Anthropic's own models: nothing a local model reads.
                "redacted_thinking" => {}
                "document" => turn.content.push_str(&document_text(block, &at)?),
                // A server tool's call or result, in a history carried over from Claude's API:
                // no local tool made it and none can continue it.
                kind if server_tool_block(kind) => {
                    server_blocks.push(format!("{kind} ({})", at()));
                }
                "tool_use" if message.role == "assistant" => {
                    let name = block
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(format!("{} is a tool_use without `name`", at())))?;
                    if let Some(id) = block.get("id").and_then(Value::as_str) {
                        call_names.insert(id.to_string(), name.to_string());
                    }
                    let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                    turn.tool_calls.push(MessageToolCall::new(name, input));
                }
                "tool_result" if message.role == "user" => {
                    // Text before a result belongs to the user turn it came in.
                    flush(&mut messages, &mut turn);
                    let id = block.get("tool_use_id").and_then(Value::as_str);
                    let mut result =
                        Message::new("tool", tool_result_text(block, &at, &mut attachments)?);
                    result.tool_call_id = id.map(str::to_string);
                    result.name = id.and_then(|id| call_names.get(id).cloned());
                    messages.push(result);
                }
                other => {
                    return Err(bad(format!(
                        "{}: content block type {other:?} is not supported in a {} message",
                        at(),
                        message.role
                    )));
                }
            }
        }
        flush(&mut messages, &mut turn);
    }
    if !server_blocks.is_empty() {
        warnings.push(format!(
            "blocks of Anthropic's server tools, which no local tool continues, are left out: \
             {}",
            server_blocks.join(", ")
        ));
    }
    let mut offered = Vec::new();
    let mut built_in = Vec::new();
    for (i, tool) in tools.unwrap_or_default().iter().enumerate() {
        match function_tool(i, tool)? {
            Ok(tool) => offered.push(tool),
            Err(kind) => built_in.push(kind),
        }
    }
    if !built_in.is_empty() {
        warnings.push(format!(
            "Anthropic's built-in tools, which a local model cannot run, are left out: {}",
            built_in.join(", ")
        ));
    }
    Ok(Conversation {
        messages,
        tools: offered,
        attachments,
        warnings,
    })
}

/// Whether a content block is a server tool's call or result (`server_tool_use`,
/// `web_search_tool_result`, `mcp_tool_use`, …), which only Anthropic's servers make.
fn server_tool_block(kind: &str) -> bool {
    matches!(
        kind,
        "server_tool_use" | "mcp_tool_use" | "mcp_tool_result" | "container_upload"
    ) || (kind.ends_with("_tool_result") && kind != "tool_result")
}

/// A document block's text: a plain-text source, or a `content` source of text blocks. PDFs,
/// URLs and file ids are not read.
fn document_text(block: &Value, at: &dyn Fn() -> String) -> Result<String, ApiError> {
    let source = block.get("source").unwrap_or(&Value::Null);
    let text = match source.get("type").and_then(Value::as_str) {
        Some("text") => source
            .get("data")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        Some("content") => match source.get("content") {
            Some(content) => system_text(content, &format!("{}.source", at()))?,
            None => String::new(),
        },
        kind => {
            return Err(bad(format!(
                "{}: documents of source type {} are not read here; send plain text",
                at(),
                type_name(kind)
            )));
        }
    };
    Ok(match block.get("title").and_then(Value::as_str) {
        Some(title) if !title.is_empty() => format!("{title}\n\n{text}"),
        _ => text,
    })
}

/// A `type` field as a message names it: quoted, or "(none)" when missing.
fn type_name(kind: Option<&str>) -> String {
    match kind {
        Some(kind) => format!("{kind:?}"),
        None => "(none)".to_string(),
    }
}

/// Ends the turn built so far, if it holds anything.
fn flush(messages: &mut Vec<Message>, turn: &mut Message) {
    let empty =
        turn.content.is_empty() && turn.tool_calls.is_empty() && turn.reasoning_content.is_none();
    let next = Message::new(turn.role.clone(), "");
    let done = std::mem::replace(turn, next);
    if !empty {
        messages.push(done);
    }
}

/// System text (`what` names where it came from): a string or a list of text blocks.
fn system_text(system: &Value, what: &str) -> Result<String, ApiError> {
    match system {
        Value::Null => Ok(String::new()),
        Value::String(text) => Ok(text.clone()),
        Value::Array(blocks) => blocks
            .iter()
            .map(|block| {
                block
                    .get("text")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| bad(format!("{what}: system blocks must be text blocks")))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|parts| parts.join("\n\n")),
        _ => Err(bad(format!(
            "{what} must be a string or a list of text blocks"
        ))),
    }
}

/// An image block's bytes: base64 data (a `url` source is not fetched on a client's behalf),
/// checked to be an image by its signature whatever `media_type` says.
fn image_block(block: &Value, at: &dyn Fn() -> String) -> Result<Vec<u8>, ApiError> {
    let source = block.get("source").unwrap_or(&Value::Null);
    match source.get("type").and_then(Value::as_str) {
        Some("base64") => {
            let data = source.get("data").and_then(Value::as_str).unwrap_or("");
            Ok(prompt::image_base64(data)?)
        }
        Some(other) => Err(bad(format!(
            "{}: image sources of type {other:?} are not fetched; send base64 data",
            at()
        ))),
        None => Err(bad(format!("{}: an image needs a source", at()))),
    }
}

/// A tool result's content: a string or a list of text and image blocks (a screenshot a tool
/// took), each image placed where it stands; an error result says so.
fn tool_result_text(
    block: &Value,
    at: &dyn Fn() -> String,
    attachments: &mut Attachments,
) -> Result<String, ApiError> {
    let mut text = match block.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        text.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    Some("image") => text.push_str(&attachments.add_image(image_block(part, at)?)),
                    Some("document") => text.push_str(&document_text(part, at)?),
                    other => {
                        return Err(bad(format!(
                            "{}: tool result part type {} is not supported",
                            at(),
                            type_name(other)
                        )));
                    }
                }
            }
            text
        }
        Some(_) => {
            return Err(bad(format!(
                "{}: tool result content must be a string or a list of blocks",
                at()
            )));
        }
    };
    if block.get("is_error").and_then(Value::as_bool) == Some(true) {
        text.insert_str(0, "Error: ");
    }
    Ok(text)
}

/// An Anthropic tool (`name`, `description`, `input_schema`) in the function shape; or, for
/// Anthropic's own tools (`web_search_20250305`, `bash_20250124`, `text_editor_…`,
/// `code_execution_…`), the tool named with its type and place, to be left out: their schemas
/// live inside Claude or Anthropic's servers run them, so a local model can neither know nor
/// call them. They are left out with a warning rather than refused, as agents offer them by
/// default and work without them.
fn function_tool(i: usize, tool: &Value) -> Result<Result<Value, String>, ApiError> {
    let name = tool
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("tools[{i}] needs a `name`")))?;
    if let Some(kind) = tool.get("type").and_then(Value::as_str)
        && kind != "custom"
    {
        return Ok(Err(format!("{name} ({kind}, tools[{i}])")));
    }
    Ok(Ok(requested_shape::function_tool(
        name,
        tool.get("input_schema"),
        tool.get("description"),
    )))
}

/// `output_config.format` (or the beta's `output_format`): `{"type": "json_schema", "schema"}`
/// makes the answer follow the schema.
fn output_format(req: &MessagesRequest) -> Result<Option<grammar::GrammarSpec>, ApiError> {
    let format = req
        .output_config
        .as_ref()
        .and_then(|config| config.get("format"))
        .or(req.output_format.as_ref())
        .filter(|format| !format.is_null());
    let Some(format) = format else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            let schema = format.get("schema").cloned().unwrap_or_else(|| json!({}));
            let response_format = json!({"type": "json_schema", "json_schema": {"schema": schema}});
            Ok(requested_shape::openai_response_format(Some(
                &response_format,
            ))?)
        }
        other => Err(bad(format!(
            "`output_config.format.type` must be \"json_schema\", got {}",
            type_name(other)
        ))),
    }
}

/// `tool_choice`: `{"type": "auto" | "any" | "tool" | "none"}`, with `name` for `tool` and
/// `disable_parallel_tool_use`. Returns the choice and whether parallel calls are allowed.
fn tool_choice(value: Option<&Value>) -> Result<(ToolChoice, bool), ApiError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok((ToolChoice::Auto, true));
    };
    let parallel = value
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        != Some(true);
    let choice = match value.get("type").and_then(Value::as_str) {
        Some("auto") => ToolChoice::Auto,
        Some("any") => ToolChoice::Required,
        Some("none") => ToolChoice::None,
        Some("tool") => ToolChoice::Named(
            value
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("`tool_choice` of type \"tool\" needs a `name`"))?
                .to_string(),
        ),
        _ => {
            return Err(bad(format!(
                "`tool_choice` {value}: expected type \"auto\", \"any\", \"tool\" or \"none\""
            )));
        }
    };
    Ok((choice, parallel))
}

/// `thinking`: `{"type": "enabled", "budget_tokens": …}`, `{"type": "disabled"}`, or
/// `{"type": "adaptive"}` (the model decides, as when absent). The budget is not enforced: a
/// local model's reasoning ends when it closes its block.
fn thinking(value: Option<&Value>) -> Result<Option<bool>, ApiError> {
    match value
        .filter(|v| !v.is_null())
        .map(|v| v.get("type").and_then(Value::as_str))
    {
        None | Some(Some("adaptive")) => Ok(None),
        Some(Some("enabled")) => Ok(Some(true)),
        Some(Some("disabled")) => Ok(Some(false)),
        Some(_) => Err(bad(
            "`thinking.type` must be \"enabled\", \"disabled\" or \"adaptive\"",
        )),
    }
}

/// The request's sampling and length, over the model's stored defaults.
fn options(
    req: &MessagesRequest,
    defaults: &Map<String, Value>,
) -> Result<GenerationOptions, ApiError> {
    let max_tokens = req
        .max_tokens
        .as_ref()
        .ok_or_else(|| bad("`max_tokens` is required"))?;
    Ok(GenerationOptions::layered(
        defaults,
        &[
            ("num_predict", Some(max_tokens)),
            ("temperature", req.temperature.as_ref()),
            ("top_p", req.top_p.as_ref()),
            ("top_k", req.top_k.as_ref()),
            ("stop", req.stop_sequences.as_ref()),
        ],
    )?)
}

/// `POST /v1/messages`.
pub async fn messages(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<MessagesRequest>,
) -> Result<Response, AnthropicError> {
    let started = Instant::now();
    let (name, defaults) = stored_model(&state, &req.model)?;
    let options = options(&req, &defaults)?;
    let think = thinking(req.thinking.as_ref())?;
    let (choice, parallel) = tool_choice(req.tool_choice.as_ref())?;
    let format = output_format(&req)?;
    let mut conversation = conversation(req.system.as_ref(), &req.messages, req.tools.as_deref())?;
    if req
        .mcp_servers
        .as_ref()
        .is_some_and(|servers| servers.as_array().is_none_or(|servers| !servers.is_empty()))
    {
        conversation.warnings.push(
            "`mcp_servers`: the MCP connector runs on Anthropic's servers, not here; \
             its tools are not offered",
        );
    }
    conversation
        .attachments
        .require_supported(&state.store, &name)?;
    if conversation.messages.is_empty() {
        return Err(bad("`messages` must not be empty").into());
    }
    let lease = state
        .keeper
        .acquire_drafted(&name, options.draft_model.as_ref(), None)
        .await?;
    let load = started.elapsed();
    // `none` withholds the tools from the model altogether.
    let tools = match choice {
        ToolChoice::None => Vec::new(),
        _ => conversation.tools,
    };
    let request = GenerationRequest {
        source: PromptSource::Chat {
            messages: conversation.messages,
            think,
        },
        media: conversation.attachments.media,
        requested: Requested {
            format,
            tools,
            choice,
            parallel_calls: parallel,
        },
        options,
        logprobs: None,
        started,
        load,
    };
    let started = request::start(lease, request).await?;
    let mut message = MessageShape::new(name.to_string(), started.prompt_tokens);
    // No edits are made here: the conversation renders as the client sent it.
    message.context_management = req
        .context_management
        .as_ref()
        .map(|_| json!({"applied_edits": []}));
    let mut response = if req.stream {
        sse(started.outputs, message)
    } else {
        collect(started.outputs, message).await?
    };
    conversation.warnings.attach(&mut response);
    Ok(response)
}

/// `POST /v1/messages/count_tokens`: the prompt's length as this model's template renders
/// and tokenizes it.
pub async fn count_tokens(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<CountTokensRequest>,
) -> Result<Response, AnthropicError> {
    let (name, _) = stored_model(&state, &req.model)?;
    let think = thinking(req.thinking.as_ref())?;
    let conversation = conversation(req.system.as_ref(), &req.messages, req.tools.as_deref())?;
    let lease = state.keeper.acquire(&name, None).await?;
    let source = PromptSource::Chat {
        messages: conversation.messages,
        think,
    };
    let rendered = request::render(&lease.info, source, &conversation.tools, Vec::new()).await?;
    let mut response = Json(json!({ "input_tokens": rendered.tokens.len() })).into_response();
    conversation.warnings.attach(&mut response);
    Ok(response)
}

/// What Anthropic's API calls a stop reason. A limit reached wins over the calls made before
/// it: the reply was cut (a second call's half is dropped, issue 48).
fn stop_reason(summary: &Summary, tool_calls: bool) -> &'static str {
    match (summary.reason, &summary.stop_sequence) {
        (DoneReason::Length, _) => "max_tokens",
        _ if tool_calls => "tool_use",
        (_, Some(_)) => "stop_sequence",
        (DoneReason::Stop | DoneReason::Cancelled, None) => "end_turn",
    }
}

/// Usage: `input_tokens` are the prompt tokens evaluated, `cache_read_input_tokens` those the
/// prefix cache had (together the whole prompt).
fn usage(summary: &Summary) -> Value {
    let s = &summary.stats;
    let mut usage = json!({
        "input_tokens": s.prompt_tokens.saturating_sub(s.cached_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": s.cached_tokens,
        "output_tokens": s.generated_tokens,
    });
    super::generation::insert_images_encoded(&mut usage, s);
    usage
}

fn tool_use_block(call: &tokenizer::ToolCall) -> Value {
    json!({
        "type": "tool_use",
        "id": item_id("toolu"),
        "name": call.name,
        "input": call.arguments,
    })
}

/// Appends text to the last block when it is of `kind`, else starts a block: adjacent pieces of
/// one kind make one block.
fn append(content: &mut Vec<Value>, kind: &str, field: &str, text: &str) {
    match content.last_mut() {
        Some(last) if last["type"] == kind => push_str(&mut last[field], text),
        _ => {
            let mut block = json!({"type": kind, field: text});
            if kind == "thinking" {
                block["signature"] = json!("");
            }
            content.push(block);
        }
    }
}

async fn collect(mut outputs: Receiver<Output>, shape: MessageShape) -> Result<Response, ApiError> {
    let mut content: Vec<Value> = Vec::new();
    let mut summary = None;
    let mut tool_calls = false;
    while let Some(output) = outputs.recv().await {
        match output {
            Output::Content(text, _) => append(&mut content, "text", "text", &text),
            Output::Thinking(text) => append(&mut content, "thinking", "thinking", &text),
            Output::ToolCall(call) => {
                tool_calls = true;
                content.push(tool_use_block(&call));
            }
            Output::Done(s) => summary = Some(s),
            Output::Error(message) => return Err(ApiError::internal(message)),
        }
    }
    let summary = summary.ok_or_else(|| ApiError::internal("generation ended without a result"))?;
    let mut message = json!({
        "id": shape.id,
        "type": "message",
        "role": "assistant",
        "model": shape.model,
        "content": content,
        "stop_reason": stop_reason(&summary, tool_calls),
        "stop_sequence": summary.stop_sequence,
        "usage": usage(&summary),
    });
    if let Some(context_management) = shape.context_management {
        message["context_management"] = context_management;
    }
    Ok(Json(message).into_response())
}

/// The kind of content block open in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Thinking,
}

/// A message streamed as Anthropic's events: `message_start`, `ping`, then per block
/// `content_block_start`, deltas and `content_block_stop`, then `message_delta` with the
/// stop reason and usage, and `message_stop`.
struct MessageShape {
    id: String,
    model: String,
    input_tokens: usize,
    /// The block open now and its index.
    open: Option<(Block, usize)>,
    /// Blocks started so far.
    blocks: usize,
    tool_calls: bool,
    /// What the reply says of context editing, when the request asked for it.
    context_management: Option<Value>,
}

impl MessageShape {
    fn new(model: String, input_tokens: usize) -> Self {
        Self {
            id: item_id("msg"),
            model,
            input_tokens,
            open: None,
            blocks: 0,
            tool_calls: false,
            context_management: None,
        }
    }

    /// Closes the open block, if any.
    fn close(&mut self, events: &mut Vec<Value>) {
        if let Some((kind, index)) = self.open.take() {
            if kind == Block::Thinking {
                events.push(json!({"type": "content_block_delta", "index": index,
                                   "delta": {"type": "signature_delta", "signature": ""}}));
            }
            events.push(json!({"type": "content_block_stop", "index": index}));
        }
    }

    /// Opens a block with `start` as its initial form; returns its index.
    fn start(&mut self, events: &mut Vec<Value>, start: Value) -> usize {
        self.close(events);
        let index = self.blocks;
        self.blocks += 1;
        events.push(json!({"type": "content_block_start", "index": index, "content_block": start}));
        index
    }

    /// A delta for a text or thinking block, opening it first when another kind is open.
    fn delta(&mut self, kind: Block, delta: Value) -> Vec<Value> {
        let mut events = Vec::new();
        let index = match self.open {
            Some((open, index)) if open == kind => index,
            _ => {
                let start = match kind {
                    Block::Text => json!({"type": "text", "text": ""}),
                    Block::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
                };
                let index = self.start(&mut events, start);
                self.open = Some((kind, index));
                index
            }
        };
        events.push(json!({"type": "content_block_delta", "index": index, "delta": delta}));
        events
    }
}

impl SseShape for MessageShape {
    fn opening(&mut self) -> Vec<Value> {
        vec![
            json!({"type": "message_start", "message": {
                "id": self.id,
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
            }}),
            json!({"type": "ping"}),
        ]
    }

    /// Anthropic's own keep-alive event, which its SDKs and Claude Code read and skip.
    fn heartbeat(&mut self) -> Option<Value> {
        Some(json!({"type": "ping"}))
    }

    fn chunks(&mut self, output: &Output) -> Vec<Value> {
        match output {
            Output::Content(text, _) => {
                self.delta(Block::Text, json!({"type": "text_delta", "text": text}))
            }
            Output::Thinking(text) => self.delta(
                Block::Thinking,
                json!({"type": "thinking_delta", "thinking": text}),
            ),
            Output::ToolCall(call) => {
                self.tool_calls = true;
                let mut events = Vec::new();
                let mut start = tool_use_block(call);
                start["input"] = json!({});
                let index = self.start(&mut events, start);
                let partial = serde_json::to_string(&call.arguments).unwrap_or_default();
                events.push(json!({"type": "content_block_delta", "index": index,
                                   "delta": {"type": "input_json_delta", "partial_json": partial}}));
                events.push(json!({"type": "content_block_stop", "index": index}));
                events
            }
            Output::Done(summary) => {
                let mut events = Vec::new();
                self.close(&mut events);
                let mut delta = json!({
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": stop_reason(summary, self.tool_calls),
                        "stop_sequence": summary.stop_sequence,
                    },
                    "usage": usage(summary),
                });
                if let Some(context_management) = &self.context_management {
                    delta["context_management"] = context_management.clone();
                }
                events.push(delta);
                events.push(json!({"type": "message_stop"}));
                events
            }
            Output::Error(message) => vec![json!({
                "type": "error",
                "error": {"type": "api_error", "message": message},
            })],
        }
    }

    fn named_events(&self) -> bool {
        true
    }

    fn done_marker(&self) -> Option<&'static str> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::openai::tests::ended;

    #[test]
    fn a_limit_reached_after_a_call_is_max_tokens() {
        assert_eq!(stop_reason(&ended(DoneReason::Length), true), "max_tokens");
        assert_eq!(stop_reason(&ended(DoneReason::Stop), true), "tool_use");
        assert_eq!(stop_reason(&ended(DoneReason::Stop), false), "end_turn");
    }
}
