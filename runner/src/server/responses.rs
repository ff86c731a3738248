//! OpenAI's Responses API: `POST /v1/responses`, which newer agents (Codex and others) speak.
//!
//! `instructions` and `input` (a string, or items: messages, `function_call`s and their
//! `function_call_output`s, reasoning) become template messages; the output is a list of
//! items (reasoning, a message, function calls) built as the generation streams, so the
//! stream's events and the final response are made by one [`ResponseBuilder`]. A response is
//! kept (unless `store: false`) in a bounded in-memory store so that `previous_response_id`
//! can continue its conversation.
//!
//! Tools are read by [`crate::server::responses_tools`]: namespaces flattened, custom tools
//! offered as one-string functions, OpenAI's built-in tools left out with a warning in the
//! response's `metadata` (key [`WARNING_KEY`]), the `x-mlxkit-warning` header and the log.
//!
//! The response object carries every field the Open Responses schema requires
//! (<https://www.openresponses.org>), the sampling numbers being the ones used.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

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
use crate::server::openai::OpenAiError;
use crate::server::options::GenerationOptions;
use crate::server::prompt::{self, Attachments};
use crate::server::request::{self, GenerationRequest, PromptSource};
use crate::server::requested_shape::{self, Requested, ToolChoice};
use crate::server::responses_tools::{ToolKind, Tools};
use crate::server::sse::{SseShape, sse};
use crate::server::warnings::Warnings;
use crate::server::{AppState, JsonBody, item_id, push_str, stored_model};

/// How many responses `previous_response_id` can reach back to; the oldest go first.
pub const STORED_RESPONSES: usize = 256;

/// The image bytes all stored conversations may hold together; the oldest conversations go
/// first beyond it (an image shared by several counts for each).
pub const STORED_IMAGE_BYTES: usize = 256 << 20;

/// Conversations of recent responses, by response id: what a follow-up continues.
#[derive(Default)]
pub struct ResponseStore {
    inner: Mutex<StoreInner>,
}

/// A stored conversation: its messages and the images their `[img-N]` tags name.
#[derive(Clone, Default)]
struct Stored {
    messages: Vec<Message>,
    images: Vec<Arc<[u8]>>,
}

impl Stored {
    fn image_bytes(&self) -> usize {
        self.images.iter().map(|image| image.len()).sum()
    }
}

#[derive(Default)]
struct StoreInner {
    conversations: HashMap<String, Stored>,
    order: VecDeque<String>,
    image_bytes: usize,
}

impl ResponseStore {
    fn get(&self, id: &str) -> Option<Stored> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.conversations.get(id).cloned()
    }

    fn put(&self, id: String, conversation: Stored) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let adding = conversation.image_bytes();
        while inner.order.len() >= STORED_RESPONSES
            || (!inner.order.is_empty() && inner.image_bytes + adding > STORED_IMAGE_BYTES)
        {
            if let Some(oldest) = inner.order.pop_front()
                && let Some(gone) = inner.conversations.remove(&oldest)
            {
                inner.image_bytes -= gone.image_bytes();
            }
        }
        inner.order.push_back(id.clone());
        inner.image_bytes += adding;
        inner.conversations.insert(id, conversation);
    }
}

/// The `metadata` key under which a response lists what of its request was left undone.
pub const WARNING_KEY: &str = "mlxkit_warning";

/// `/v1/responses`' body. Beside the fields read here:
///
/// - `include` (`reasoning.encrypted_content`, …): reasoning comes back as summary text, which
///   is all a follow-up needs here; there is nothing encrypted to include. Accepted.
/// - `client_metadata`, `stream_options`, `prompt_cache_retention`: accepted and ignored;
///   `prompt_cache_key`, `safety_identifier`, `user`: echoed. The prefix cache reuses any
///   shared prefix whatever the key.
/// - `text.verbosity`: echoed; a local model has no verbosity switch.
/// - `service_tier`: the response says `"default"`, the only tier there is.
/// - `truncation`: echoed; the input is never truncated, an input longer than the context is
///   refused either way.
/// - `max_tool_calls`: 0 offers no tools, 1 allows no parallel calls; echoed.
/// - `top_logprobs`: echoed; output text carries no logprobs on this API (`logprobs: []`).
/// - `background: true` is refused: there is no queue to poll.
#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    model: String,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    #[serde(default)]
    text: Option<Value>,
    #[serde(default)]
    reasoning: Option<Value>,
    #[serde(default)]
    max_output_tokens: Option<Value>,
    #[serde(default)]
    temperature: Option<Value>,
    #[serde(default)]
    top_p: Option<Value>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    store: Option<bool>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    presence_penalty: Option<Value>,
    #[serde(default)]
    frequency_penalty: Option<Value>,
    #[serde(default)]
    top_logprobs: Option<Value>,
    #[serde(default)]
    max_tool_calls: Option<Value>,
    #[serde(default)]
    truncation: Option<String>,
    #[serde(default)]
    background: Option<bool>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    safety_identifier: Option<String>,
    #[serde(default)]
    prompt_cache_key: Option<String>,
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message)
}

/// The text of a message item's content: a string or a list of text parts.
fn content_text(
    content: &Value,
    at: &str,
    attachments: &mut Attachments,
) -> Result<String, ApiError> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        text.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""));
                    }
                    Some("input_image") => {
                        let bytes = match (part.get("image_url"), part.get("file_id")) {
                            (Some(Value::String(url)), _) => prompt::image_url(url)?,
                            (_, Some(_)) => {
                                return Err(bad(format!(
                                    "{at}: images by `file_id` are not stored here; send \
                                     `image_url` as a base64 data URL"
                                )));
                            }
                            _ => {
                                return Err(bad(format!("{at}: an input_image needs `image_url`")));
                            }
                        };
                        // The image's place among the text parts.
                        text.push_str(&attachments.add_image(bytes));
                    }
                    Some("input_audio") => {
                        let bytes = prompt::input_audio(part)?;
                        text.push_str(&attachments.add_audio(bytes));
                    }
                    other => {
                        return Err(bad(format!(
                            "{at}: content part type {} is not supported",
                            type_name(other)
                        )));
                    }
                }
            }
            Ok(text)
        }
        _ => Err(bad(format!(
            "{at}: content must be a string or a list of parts"
        ))),
    }
}

/// A `type` field as a message names it: quoted, or "(none)" when missing.
fn type_name(kind: Option<&str>) -> String {
    match kind {
        Some(kind) => format!("{kind:?}"),
        None => "(none)".to_string(),
    }
}

/// Input items only OpenAI's built-in tools make (their calls and outputs) or only OpenAI
/// keeps (references to stored items, compactions): a conversation carried over from OpenAI
/// may hold them, and no local tool can continue them.
fn hosted_item(kind: &str) -> bool {
    matches!(
        kind,
        "web_search_call"
            | "file_search_call"
            | "computer_call"
            | "computer_call_output"
            | "code_interpreter_call"
            | "image_generation_call"
            | "local_shell_call"
            | "local_shell_call_output"
            | "shell_call"
            | "shell_call_output"
            | "apply_patch_call"
            | "apply_patch_call_output"
            | "mcp_call"
            | "mcp_list_tools"
            | "mcp_approval_request"
            | "mcp_approval_response"
            | "tool_search_call"
            | "tool_search_output"
            | "item_reference"
            | "compaction"
    )
}

/// A tool call's arguments: JSON text (a function's), parsed when it parses.
fn call_arguments(item: &Value) -> Value {
    match item.get("arguments") {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
        Some(other) => other.clone(),
        None => json!({}),
    }
}

/// Adds a call to the assistant turn at the end of `messages`, or starts one: consecutive
/// calls belong to one turn.
fn push_call(messages: &mut Vec<Message>, reasoning: &mut Option<String>, call: MessageToolCall) {
    match messages.last_mut() {
        Some(last) if last.role == "assistant" && !last.tool_calls.is_empty() => {
            last.tool_calls.push(call);
        }
        _ => {
            let mut turn = Message::new("assistant", "");
            turn.reasoning_content = reasoning.take();
            turn.tool_calls.push(call);
            messages.push(turn);
        }
    }
}

/// Appends the request's input items to `messages`; calls name their tools as `tools` offers
/// them to the model.
fn read_input(
    input: &Value,
    messages: &mut Vec<Message>,
    attachments: &mut Attachments,
    tools: &Tools,
    warnings: &mut Warnings,
) -> Result<(), ApiError> {
    let items = match input {
        Value::Null => return Ok(()),
        Value::String(text) => {
            messages.push(Message::new("user", text.clone()));
            return Ok(());
        }
        Value::Array(items) => items,
        _ => return Err(bad("`input` must be a string or a list of items")),
    };
    // Tool outputs name their call by id; templates want the function's name.
    let mut call_names: HashMap<String, String> = messages
        .iter()
        .filter_map(|m| m.tool_call_id.clone().zip(m.name.clone()))
        .collect();
    let mut reasoning: Option<String> = None;
    let mut hosted = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("");
                if !matches!(role, "user" | "assistant" | "system" | "developer") {
                    return Err(bad(format!("{at}.role {role:?} is not a message role")));
                }
                let content = item.get("content").unwrap_or(&Value::Null);
                let mut message = Message::new(role, content_text(content, &at, attachments)?);
                if role == "assistant" {
                    message.reasoning_content = reasoning.take();
                }
                messages.push(message);
            }
            "function_call" | "custom_tool_call" => {
                let name = item
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at} is a {kind} without `name`")))?;
                let namespace = item.get("namespace").and_then(Value::as_str);
                let name = tools.model_name(namespace, name);
                // A custom tool's call is its one string, as the model was offered it.
                let arguments = match kind {
                    "custom_tool_call" => json!({"input": item.get("input").unwrap_or(&json!(""))}),
                    _ => call_arguments(item),
                };
                if let Some(id) = item.get("call_id").and_then(Value::as_str) {
                    call_names.insert(id.to_string(), name.clone());
                }
                push_call(
                    messages,
                    &mut reasoning,
                    MessageToolCall::new(name, arguments),
                );
            }
            kind if hosted_item(kind) => hosted.push(format!("{kind} ({at})")),
            // Its tools were read with the request's (`Tools::read`).
            "additional_tools" => {}
            "function_call_output" | "custom_tool_call_output" => {
                let id = item.get("call_id").and_then(Value::as_str);
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => content_text(other, &at, attachments)?,
                    None => String::new(),
                };
                let mut result = Message::new("tool", output);
                result.tool_call_id = id.map(str::to_string);
                result.name = id.and_then(|id| call_names.get(id).cloned());
                messages.push(result);
            }
            "reasoning" => {
                let text: Vec<&str> = item
                    .get("summary")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.get("text").and_then(Value::as_str))
                    .collect();
                reasoning = Some(text.join("\n"));
            }
            other => return Err(bad(format!("{at}: item type {other:?} is not supported"))),
        }
    }
    if !hosted.is_empty() {
        warnings.push(format!(
            "items of OpenAI's built-in tools and store, which no local tool continues, are \
             left out: {}",
            hosted.join(", ")
        ));
    }
    Ok(())
}

/// `tool_choice`: `"auto"`, `"none"`, `"required"` or `{"type": "function", "name": …}`.
fn tool_choice(value: Option<&Value>) -> Result<ToolChoice, ApiError> {
    match value {
        Some(Value::Object(object)) => object
            .get("name")
            .and_then(Value::as_str)
            .map(|name| ToolChoice::Named(name.to_string()))
            .ok_or_else(|| bad("`tool_choice` object needs a `name`")),
        other => Ok(ToolChoice::from_openai(other)?),
    }
}

/// `text.format` as a chat `response_format`.
fn format(text: Option<&Value>) -> Result<Option<grammar::GrammarSpec>, ApiError> {
    let Some(format) = text.and_then(|t| t.get("format")) else {
        return Ok(None);
    };
    // The Responses shape keeps `schema` beside `type`; the chat shape nests it.
    let response_format = match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => json!({"type": "json_schema", "json_schema": {
            "schema": format.get("schema").cloned().unwrap_or(Value::Null)}}),
        _ => format.clone(),
    };
    Ok(requested_shape::openai_response_format(Some(
        &response_format,
    ))?)
}

/// `POST /v1/responses`.
pub async fn create(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ResponsesRequest>,
) -> Result<Response, OpenAiError> {
    let started = Instant::now();
    let (name, defaults) = stored_model(&state, &req.model)?;
    if req.background == Some(true) {
        return Err(bad(
            "`background: true` is not supported: responses run in the foreground here \
             (nothing to poll); send `background: false` or leave it out",
        )
        .into());
    }
    let options = GenerationOptions::layered(
        &defaults,
        &[
            ("num_predict", req.max_output_tokens.as_ref()),
            ("temperature", req.temperature.as_ref()),
            ("top_p", req.top_p.as_ref()),
            ("presence_penalty", req.presence_penalty.as_ref()),
            ("frequency_penalty", req.frequency_penalty.as_ref()),
        ],
    )?;
    let max_tool_calls = whole_number("max_tool_calls", req.max_tool_calls.as_ref())?;
    let top_logprobs = whole_number("top_logprobs", req.top_logprobs.as_ref())?.unwrap_or(0);

    let mut warnings = Warnings::default();
    let tools = Tools::read(
        req.tools.as_deref().unwrap_or_default(),
        req.input.as_ref(),
        &mut warnings,
    )?;
    let (messages, attachments) = conversation(&state, &req, &tools, &mut warnings)?;
    attachments.require_supported(&state.store, &name)?;
    if messages.iter().all(|m| m.role == "system") {
        return Err(bad("`input` is empty").into());
    }
    let mut choice = tool_choice(req.tool_choice.as_ref())?;
    if max_tool_calls == Some(0) {
        choice = ToolChoice::None;
    }
    let functions = match choice {
        ToolChoice::None => Vec::new(),
        _ => tools.functions.clone(),
    };
    let format = format(req.text.as_ref())?;
    let effort = req
        .reasoning
        .as_ref()
        .and_then(|r| r.get("effort"))
        .and_then(Value::as_str);
    let think = effort.map(|effort| effort != "none" && effort != "minimal");
    let parallel_tool_calls = req.parallel_tool_calls.unwrap_or(true);

    let lease = state
        .keeper
        .acquire_drafted(&name, options.draft_model.as_ref(), None)
        .await?;
    let load = started.elapsed();
    let images = attachments.media;
    let sampling = options.sampling.clone();
    let request = GenerationRequest {
        source: PromptSource::Chat {
            messages: messages.clone(),
            think,
        },
        media: images.clone(),
        requested: Requested {
            format,
            tools: functions,
            choice,
            parallel_calls: parallel_tool_calls && max_tool_calls != Some(1),
        },
        options,
        logprobs: None,
        started,
        load,
    };
    let outputs = request::start(lease, request).await?.outputs;
    let mut metadata = match req.metadata.clone() {
        Some(Value::Object(metadata)) => metadata,
        _ => Map::new(),
    };
    if !warnings.is_empty() {
        metadata.insert(WARNING_KEY.into(), json!(warnings.joined()));
    }
    let echo = Echo {
        model: name.to_string(),
        previous_response_id: req.previous_response_id.clone(),
        instructions: req.instructions.clone(),
        tools: tools.echo.clone(),
        tool_choice: req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        parallel_tool_calls,
        text: text_echo(req.text.as_ref()),
        reasoning: json!({
            "effort": effort,
            "summary": req.reasoning.as_ref().and_then(|r| r.get("summary")).cloned(),
        }),
        max_output_tokens: req.max_output_tokens.clone(),
        max_tool_calls,
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        presence_penalty: sampling.presence_penalty,
        frequency_penalty: sampling.frequency_penalty,
        top_logprobs,
        truncation: req.truncation.clone().unwrap_or_else(|| "disabled".into()),
        user: req.user.clone(),
        safety_identifier: req.safety_identifier.clone(),
        prompt_cache_key: req.prompt_cache_key.clone(),
        metadata: Value::Object(metadata),
        store: req.store.unwrap_or(true),
    };
    let conversation = Stored { messages, images };
    let builder = ResponseBuilder::new(echo, tools, conversation, state.responses.clone());
    let mut response = if req.stream {
        sse(outputs, builder)
    } else {
        whole_response(outputs, builder).await?
    };
    warnings.attach(&mut response);
    Ok(response)
}

/// The conversation a response continues: the turns stored under `previous_response_id`,
/// this request's `instructions` in place of any carried over, then its `input` read into
/// messages and attachments.
fn conversation(
    state: &AppState,
    req: &ResponsesRequest,
    tools: &Tools,
    warnings: &mut Warnings,
) -> Result<(Vec<Message>, Attachments), ApiError> {
    let previous = match &req.previous_response_id {
        Some(id) => state.responses.get(id).ok_or_else(|| {
            ApiError::not_found(format!(
                "previous response `{id}` is not stored (the last {STORED_RESPONSES} are kept)"
            ))
        })?,
        None => Stored::default(),
    };
    let mut messages = previous.messages;
    // The earlier turns' `[img-N]` tags keep naming their images and clips; new ones number
    // on.
    let audio = previous
        .images
        .iter()
        .filter(|bytes| matches!(media::detect(bytes), Ok(media::MediaFormat::Audio(_))))
        .count();
    let mut attachments = Attachments {
        media: previous.images,
        audio,
    };
    if let Some(instructions) = req.instructions.as_ref().filter(|i| !i.is_empty()) {
        // Instructions apply to this response only: they replace any carried over.
        messages.retain(|m| m.role != "system");
        messages.insert(0, Message::new("system", instructions.clone()));
    }
    read_input(
        req.input.as_ref().unwrap_or(&Value::Null),
        &mut messages,
        &mut attachments,
        tools,
        warnings,
    )?;
    Ok((messages, attachments))
}

/// The response of a request that does not stream, once its generation ends.
async fn whole_response(
    mut outputs: Receiver<Output>,
    mut builder: ResponseBuilder,
) -> Result<Response, ApiError> {
    while let Some(output) = outputs.recv().await {
        if let Output::Error(message) = &output {
            return Err(ApiError::internal(message.clone()));
        }
        builder.chunks(&output);
    }
    builder
        .finished
        .take()
        .map(|response| Json(response).into_response())
        .ok_or_else(|| ApiError::internal("generation ended without a result"))
}

/// `text` as the response reports it: as sent, its `format` plain text unless it says
/// otherwise.
fn text_echo(text: Option<&Value>) -> Value {
    let mut text = match text {
        Some(Value::Object(text)) => text.clone(),
        _ => Map::new(),
    };
    text.entry("format")
        .or_insert_with(|| json!({"type": "text"}));
    Value::Object(text)
}

/// An optional whole number field (`max_tool_calls`, `top_logprobs`).
fn whole_number(field: &str, value: Option<&Value>) -> Result<Option<u64>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad(format!("`{field}` must be a whole number, got {value}"))),
    }
}

/// A sampling setting as the response reports it: the `f32` the sampler uses, written as its
/// shortest decimal (0.7, not 0.699999988).
fn reported(value: f32) -> Value {
    value
        .to_string()
        .parse::<f64>()
        .map_or(Value::Null, |n| json!(n))
}

/// What a response repeats of its request, and the settings it ran with.
struct Echo {
    model: String,
    previous_response_id: Option<String>,
    instructions: Option<String>,
    tools: Vec<Value>,
    tool_choice: Value,
    parallel_tool_calls: bool,
    text: Value,
    reasoning: Value,
    max_output_tokens: Option<Value>,
    max_tool_calls: Option<u64>,
    temperature: f32,
    top_p: f32,
    presence_penalty: f32,
    frequency_penalty: f32,
    top_logprobs: u64,
    truncation: String,
    user: Option<String>,
    safety_identifier: Option<String>,
    prompt_cache_key: Option<String>,
    metadata: Value,
    store: bool,
}

/// The kind of output item open in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Message,
    Reasoning,
}

/// Builds a response from generation outputs: its items, the stream's events, and at the end
/// the response object (stored for follow-ups).
struct ResponseBuilder {
    id: String,
    created_at: u64,
    /// When it finished, once it has.
    completed_at: Option<u64>,
    echo: Echo,
    /// The request's tools, to write the model's calls as the client declared them.
    tools: Tools,
    items: Vec<Value>,
    open: Option<Open>,
    sequence: u64,
    /// The conversation this response answers, for the store.
    conversation: Stored,
    responses: std::sync::Arc<ResponseStore>,
    /// The final response, once done.
    finished: Option<Value>,
}

impl ResponseBuilder {
    fn new(echo: Echo, tools: Tools, conversation: Stored, responses: Arc<ResponseStore>) -> Self {
        Self {
            id: item_id("resp"),
            created_at: unix_now(),
            completed_at: None,
            echo,
            tools,
            items: Vec::new(),
            open: None,
            sequence: 0,
            conversation,
            responses,
            finished: None,
        }
    }

    /// The response object in its current state.
    fn response(&self, status: &str, usage: Option<Value>, incomplete: Option<&str>) -> Value {
        let e = &self.echo;
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "status": status,
            "error": null,
            "incomplete_details": incomplete.map(|reason| json!({"reason": reason})),
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "max_tool_calls": e.max_tool_calls,
            "model": e.model,
            "output": self.items,
            "parallel_tool_calls": e.parallel_tool_calls,
            "previous_response_id": e.previous_response_id,
            "reasoning": e.reasoning,
            "store": e.store,
            "background": false,
            "service_tier": "default",
            "temperature": reported(e.temperature),
            "top_p": reported(e.top_p),
            "presence_penalty": reported(e.presence_penalty),
            "frequency_penalty": reported(e.frequency_penalty),
            "top_logprobs": e.top_logprobs,
            "text": e.text,
            "tool_choice": e.tool_choice,
            "tools": e.tools,
            "truncation": e.truncation,
            "usage": usage,
            "user": e.user,
            "safety_identifier": e.safety_identifier,
            "prompt_cache_key": e.prompt_cache_key,
            "metadata": e.metadata,
        })
    }

    fn event(&mut self, kind: &str, mut body: Value) -> Value {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        body
    }

    /// Closes the open message or reasoning item.
    fn close(&mut self, events: &mut Vec<Value>) {
        let Some(open) = self.open.take() else {
            return;
        };
        let index = self.items.len() - 1;
        self.items[index]["status"] = json!("completed");
        let item = self.items[index].clone();
        let id = item["id"].clone();
        match open {
            Open::Message => {
                let part = item["content"][0].clone();
                let text = part["text"].clone();
                let done = json!({"item_id": id, "output_index": index, "content_index": 0,
                                  "text": text, "logprobs": []});
                events.push(self.event("response.output_text.done", done));
                let done = json!({"item_id": id, "output_index": index, "content_index": 0,
                                  "part": part});
                events.push(self.event("response.content_part.done", done));
            }
            Open::Reasoning => {
                let part = item["summary"][0].clone();
                let done = json!({"item_id": id, "output_index": index, "summary_index": 0,
                                  "text": part["text"]});
                events.push(self.event("response.reasoning_summary_text.done", done));
                let done = json!({"item_id": id, "output_index": index, "summary_index": 0,
                                  "part": part});
                events.push(self.event("response.reasoning_summary_part.done", done));
            }
        }
        let done = json!({"output_index": index, "item": item});
        events.push(self.event("response.output_item.done", done));
    }

    /// Appends text to the open item of `kind`, opening one first when needed.
    fn text(&mut self, kind: Open, text: &str) -> Vec<Value> {
        let mut events = Vec::new();
        if self.open != Some(kind) {
            self.close(&mut events);
            let (item, part) = match kind {
                Open::Message => (
                    json!({"type": "message", "id": item_id("msg"),
                           "status": "in_progress", "role": "assistant", "content": []}),
                    json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []}),
                ),
                Open::Reasoning => (
                    json!({"type": "reasoning", "id": item_id("rs"),
                           "status": "in_progress", "summary": []}),
                    json!({"type": "summary_text", "text": ""}),
                ),
            };
            let index = self.items.len();
            let id = item["id"].clone();
            self.items.push(item.clone());
            self.open = Some(kind);
            let added = json!({"output_index": index, "item": item});
            events.push(self.event("response.output_item.added", added));
            let (field, event, key) = match kind {
                Open::Message => ("content", "response.content_part.added", "content_index"),
                Open::Reasoning => (
                    "summary",
                    "response.reasoning_summary_part.added",
                    "summary_index",
                ),
            };
            self.items[index][field] = json!([part.clone()]);
            let added = json!({"item_id": id, "output_index": index, key: 0, "part": part});
            events.push(self.event(event, added));
        }
        let index = self.items.len() - 1;
        let id = self.items[index]["id"].clone();
        let (field, event, key) = match kind {
            Open::Message => ("content", "response.output_text.delta", "content_index"),
            Open::Reasoning => (
                "summary",
                "response.reasoning_summary_text.delta",
                "summary_index",
            ),
        };
        push_str(&mut self.items[index][field][0]["text"], text);
        let mut delta = json!({"item_id": id, "output_index": index, key: 0, "delta": text});
        if kind == Open::Message {
            delta["logprobs"] = json!([]);
        }
        events.push(self.event(event, delta));
        events
    }

    fn finish(&mut self, summary: &Summary) -> Vec<Value> {
        let mut events = Vec::new();
        self.close(&mut events);
        let s = &summary.stats;
        let mut usage = json!({
            "input_tokens": s.prompt_tokens,
            "input_tokens_details": {"cached_tokens": s.cached_tokens},
            "output_tokens": s.generated_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": s.prompt_tokens + s.generated_tokens,
        });
        super::generation::insert_images_encoded(&mut usage, s);
        let incomplete = (summary.reason == DoneReason::Length).then_some("max_output_tokens");
        self.completed_at = Some(unix_now());
        let status = if incomplete.is_some() {
            "incomplete"
        } else {
            "completed"
        };
        let response = self.response(status, Some(usage), incomplete);
        if self.echo.store {
            let mut conversation = std::mem::take(&mut self.conversation);
            conversation.messages.push(self.assistant_turn());
            self.responses.put(self.id.clone(), conversation);
        }
        let kind = if incomplete.is_some() {
            "response.incomplete"
        } else {
            "response.completed"
        };
        events.push(self.event(kind, json!({"response": response.clone()})));
        self.finished = Some(response);
        events
    }

    /// The name the model called a call item's tool by.
    fn model_name(&self, item: &Value) -> String {
        let name = item["name"].as_str().unwrap_or("");
        self.tools.model_name(item["namespace"].as_str(), name)
    }

    /// A call the model made, as the output item the client's declaration of the tool asks:
    /// a `function_call` (with its `namespace` when it came in one) or a `custom_tool_call`.
    fn call_events(&mut self, call: &tokenizer::ToolCall) -> Vec<Value> {
        let mut events = Vec::new();
        self.close(&mut events);
        let tool = self.tools.client_tool(&call.name);
        let call_id = item_id("call");
        let (mut item, field, text, delta_event, done_event) = match tool.kind {
            ToolKind::Function => {
                let arguments = serde_json::to_string(&call.arguments).unwrap_or_default();
                (
                    json!({"type": "function_call", "id": item_id("fc"), "call_id": call_id,
                           "name": tool.name, "arguments": arguments, "status": "completed"}),
                    "arguments",
                    arguments,
                    "response.function_call_arguments.delta",
                    "response.function_call_arguments.done",
                )
            }
            ToolKind::Custom => {
                // The one string the model was asked for; anything else, as JSON text.
                let input = match call.arguments.get("input") {
                    Some(Value::String(input)) => input.clone(),
                    _ => serde_json::to_string(&call.arguments).unwrap_or_default(),
                };
                (
                    json!({"type": "custom_tool_call", "id": item_id("ctc"), "call_id": call_id,
                           "name": tool.name, "input": input, "status": "completed"}),
                    "input",
                    input,
                    "response.custom_tool_call_input.delta",
                    "response.custom_tool_call_input.done",
                )
            }
        };
        if let Some(namespace) = &tool.namespace {
            item["namespace"] = json!(namespace);
        }
        let index = self.items.len();
        let mut added = item.clone();
        added[field] = json!("");
        added["status"] = json!("in_progress");
        self.items.push(item.clone());
        let id = item["id"].clone();
        events.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        ));
        events.push(self.event(
            delta_event,
            json!({"item_id": id, "output_index": index, "delta": text}),
        ));
        let mut done = json!({"item_id": id, "output_index": index, field: text});
        if tool.kind == ToolKind::Function {
            done["name"] = json!(tool.name);
        }
        events.push(self.event(done_event, done));
        events.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        events
    }

    /// This response as the assistant turn a follow-up continues from.
    fn assistant_turn(&self) -> Message {
        let mut turn = Message::new("assistant", "");
        for item in &self.items {
            match item["type"].as_str() {
                Some("message") => turn
                    .content
                    .push_str(item["content"][0]["text"].as_str().unwrap_or("")),
                Some("reasoning") => {
                    turn.reasoning_content = item["summary"][0]["text"].as_str().map(str::to_string)
                }
                Some("function_call") => {
                    let arguments = item["arguments"]
                        .as_str()
                        .and_then(|a| serde_json::from_str(a).ok())
                        .unwrap_or_else(|| json!({}));
                    let name = self.model_name(item);
                    turn.tool_calls.push(MessageToolCall::new(name, arguments));
                }
                Some("custom_tool_call") => {
                    let arguments = json!({"input": item["input"]});
                    let name = self.model_name(item);
                    turn.tool_calls.push(MessageToolCall::new(name, arguments));
                }
                _ => {}
            }
        }
        turn
    }
}

impl SseShape for ResponseBuilder {
    fn opening(&mut self) -> Vec<Value> {
        let response = self.response("in_progress", None, None);
        vec![
            self.event("response.created", json!({"response": response.clone()})),
            self.event("response.in_progress", json!({"response": response})),
        ]
    }

    fn chunks(&mut self, output: &Output) -> Vec<Value> {
        match output {
            Output::Content(text, _) => self.text(Open::Message, text),
            Output::Thinking(text) => self.text(Open::Reasoning, text),
            Output::ToolCall(call) => self.call_events(call),
            Output::Done(summary) => self.finish(summary),
            Output::Error(message) => {
                let mut response = self.response("failed", None, None);
                response["error"] = json!({"code": "server_error", "message": message});
                vec![self.event("response.failed", json!({"response": response}))]
            }
        }
    }

    /// `response.in_progress` again: Codex counts only events, not comments, against its
    /// idle timeout.
    fn heartbeat(&mut self) -> Option<Value> {
        let response = self.response("in_progress", None, None);
        Some(self.event("response.in_progress", json!({"response": response})))
    }

    fn named_events(&self) -> bool {
        true
    }

    fn done_marker(&self) -> Option<&'static str> {
        None
    }
}

/// Seconds since the Unix epoch.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
