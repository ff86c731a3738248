//! OpenAI's Responses API: `POST /v1/responses`, which newer agents (Codex and others) speak.
//!
//! `instructions` and `input` (a string, or items: messages, `function_call`s and their
//! `function_call_output`s, reasoning) become template messages; the output is a list of
//! items (reasoning, a message, function calls) built as the generation streams, so the
//! stream's events and the final response are made by one [`ResponseBuilder`]. A response is
//! kept (unless `store: false`) in a bounded in-memory store so that `previous_response_id`
//! can continue its conversation.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokenizer::{Message, MessageToolCall};

use crate::engine::DoneReason;
use crate::server::error::ApiError;
use crate::server::generation::{Output, Summary};
use crate::server::openai::OpenAiError;
use crate::server::options::GenerationOptions;
use crate::server::prompt::{self, Attachments};
use crate::server::request::{self, GenerationRequest, PromptSource};
use crate::server::sse::{SseShape, sse};
use crate::server::structured::{self, Requested, ToolChoice};
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

/// `/v1/responses`' body.
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
                            "{at}: content part type {other:?} is not supported"
                        )));
                    }
                }
            }
            Ok(text)
        }
        other => Err(bad(format!(
            "{at}: content must be a string or a list of parts, got {other}"
        ))),
    }
}

/// Appends the request's input items to `messages`.
fn read_input(
    input: &Value,
    messages: &mut Vec<Message>,
    attachments: &mut Attachments,
) -> Result<(), ApiError> {
    let items = match input {
        Value::Null => return Ok(()),
        Value::String(text) => {
            messages.push(Message::new("user", text.clone()));
            return Ok(());
        }
        Value::Array(items) => items,
        other => {
            return Err(bad(format!(
                "`input` must be a string or a list of items, got {other}"
            )));
        }
    };
    // Tool outputs name their call by id; templates want the function's name.
    let mut call_names: HashMap<String, String> = messages
        .iter()
        .filter_map(|m| m.tool_call_id.clone().zip(m.name.clone()))
        .collect();
    let mut reasoning: Option<String> = None;
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
            "function_call" => {
                let name = item
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at} is a function_call without `name`")))?;
                let arguments = match item.get("arguments") {
                    Some(Value::String(s)) => {
                        serde_json::from_str(s).unwrap_or(Value::String(s.clone()))
                    }
                    Some(other) => other.clone(),
                    None => json!({}),
                };
                if let Some(id) = item.get("call_id").and_then(Value::as_str) {
                    call_names.insert(id.to_string(), name.to_string());
                }
                // Consecutive calls belong to one assistant turn.
                match messages.last_mut() {
                    Some(last) if last.role == "assistant" && !last.tool_calls.is_empty() => {
                        last.tool_calls.push(MessageToolCall::new(name, arguments));
                    }
                    _ => {
                        let mut turn = Message::new("assistant", "");
                        turn.reasoning_content = reasoning.take();
                        turn.tool_calls.push(MessageToolCall::new(name, arguments));
                        messages.push(turn);
                    }
                }
            }
            "function_call_output" => {
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
    Ok(())
}

/// Responses' tools (`{"type": "function", "name", "parameters"}`) in the chat shape.
fn function_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            match tool.get("type").and_then(Value::as_str) {
                Some("function") => {}
                other => {
                    return Err(bad(format!(
                        "tools[{i}] of type {other:?}: only function tools run on a local server"
                    )));
                }
            }
            let name = tool
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("tools[{i}] needs a `name`")))?;
            Ok(structured::function_tool(
                name,
                tool.get("parameters"),
                tool.get("description"),
            ))
        })
        .collect()
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
    Ok(structured::openai_response_format(Some(&response_format))?)
}

/// `POST /v1/responses`.
pub async fn create(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ResponsesRequest>,
) -> Result<Response, OpenAiError> {
    let started = Instant::now();
    let (name, defaults) = stored_model(&state, &req.model)?;
    let options = GenerationOptions::layered(
        &defaults,
        &[
            ("num_predict", req.max_output_tokens.as_ref()),
            ("temperature", req.temperature.as_ref()),
            ("top_p", req.top_p.as_ref()),
        ],
    )?;

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
    )?;
    attachments.require_supported(&state.store, &name)?;
    if messages.iter().all(|m| m.role == "system") {
        return Err(bad("`input` is empty").into());
    }
    let choice = tool_choice(req.tool_choice.as_ref())?;
    let tools = match choice {
        ToolChoice::None => Vec::new(),
        _ => function_tools(req.tools.as_deref().unwrap_or_default())?,
    };
    let format = format(req.text.as_ref())?;
    let think = req
        .reasoning
        .as_ref()
        .and_then(|r| r.get("effort"))
        .and_then(Value::as_str)
        .map(|effort| effort != "none" && effort != "minimal");

    let lease = state
        .keeper
        .acquire_drafted(&name, options.draft_model.as_ref(), None)
        .await?;
    let load = started.elapsed();
    let images = attachments.media;
    let request = GenerationRequest {
        source: PromptSource::Chat {
            messages: messages.clone(),
            think,
        },
        media: images.clone(),
        requested: Requested {
            format,
            tools,
            choice,
            parallel_calls: req.parallel_tool_calls.unwrap_or(true),
        },
        options,
        logprobs: None,
        started,
        load,
    };
    let outputs = request::start(lease, request).await?.outputs;
    let echo = Echo {
        model: name.to_string(),
        previous_response_id: req.previous_response_id.clone(),
        instructions: req.instructions.clone(),
        tools: req.tools.clone().unwrap_or_default(),
        tool_choice: req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        text: req
            .text
            .clone()
            .unwrap_or_else(|| json!({"format": {"type": "text"}})),
        reasoning: req.reasoning.clone(),
        max_output_tokens: req.max_output_tokens.clone(),
        temperature: req.temperature.clone(),
        top_p: req.top_p.clone(),
        metadata: req.metadata.clone().unwrap_or_else(|| json!({})),
        store: req.store.unwrap_or(true),
    };
    let conversation = Stored { messages, images };
    let mut builder = ResponseBuilder::new(echo, conversation, state.responses.clone());
    if req.stream {
        return Ok(sse(outputs, builder));
    }
    let mut outputs = outputs;
    while let Some(output) = outputs.recv().await {
        if let Output::Error(message) = &output {
            return Err(ApiError::internal(message.clone()).into());
        }
        builder.chunks(&output);
    }
    builder
        .finished
        .take()
        .map(|response| Json(response).into_response())
        .ok_or_else(|| ApiError::internal("generation ended without a result").into())
}

/// What a response repeats of its request.
struct Echo {
    model: String,
    previous_response_id: Option<String>,
    instructions: Option<String>,
    tools: Vec<Value>,
    tool_choice: Value,
    parallel_tool_calls: bool,
    text: Value,
    reasoning: Option<Value>,
    max_output_tokens: Option<Value>,
    temperature: Option<Value>,
    top_p: Option<Value>,
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
    echo: Echo,
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
    fn new(echo: Echo, conversation: Stored, responses: Arc<ResponseStore>) -> Self {
        Self {
            id: item_id("resp"),
            created_at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            echo,
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
            "status": status,
            "error": null,
            "incomplete_details": incomplete.map(|reason| json!({"reason": reason})),
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "model": e.model,
            "output": self.items,
            "parallel_tool_calls": e.parallel_tool_calls,
            "previous_response_id": e.previous_response_id,
            "reasoning": e.reasoning,
            "store": e.store,
            "temperature": e.temperature,
            "text": e.text,
            "tool_choice": e.tool_choice,
            "tools": e.tools,
            "top_p": e.top_p,
            "truncation": "disabled",
            "usage": usage,
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
                    json!({"type": "output_text", "text": "", "annotations": []}),
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
                    let name = item["name"].as_str().unwrap_or("");
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
            Output::ToolCall(call) => {
                let mut events = Vec::new();
                self.close(&mut events);
                let arguments = serde_json::to_string(&call.arguments).unwrap_or_default();
                let call_id = item_id("call");
                let item = json!({"type": "function_call", "id": item_id("fc"),
                                  "call_id": call_id, "name": call.name, "arguments": arguments,
                                  "status": "completed"});
                let index = self.items.len();
                let mut added = item.clone();
                added["arguments"] = json!("");
                added["status"] = json!("in_progress");
                self.items.push(item.clone());
                let id = item["id"].clone();
                events.push(self.event(
                    "response.output_item.added",
                    json!({"output_index": index, "item": added}),
                ));
                events.push(self.event(
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": index, "delta": arguments}),
                ));
                events.push(self.event("response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "arguments": arguments, "name": call.name})));
                events.push(self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                ));
                events
            }
            Output::Done(summary) => self.finish(summary),
            Output::Error(message) => {
                let mut response = self.response("failed", None, None);
                response["error"] = json!({"code": "server_error", "message": message});
                vec![self.event("response.failed", json!({"response": response}))]
            }
        }
    }

    fn named_events(&self) -> bool {
        true
    }

    fn done_marker(&self) -> Option<&'static str> {
        None
    }
}
