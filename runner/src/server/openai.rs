//! OpenAI's API: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc::Receiver;

use crate::engine::DoneReason;
use crate::model_name::ModelName;
use crate::server::error::ApiError;
use crate::server::generation::{LogprobEntry, Output, Summary};
use crate::server::ollama::MAX_TOP_LOGPROBS;
use crate::server::options::GenerationOptions;
use crate::server::prompt::{self, Attachments, ChatMessage};
use crate::server::request::{self, GenerationRequest, PromptSource};
use crate::server::sse::{SseShape, sse};
use crate::server::structured::{self, Requested, ToolChoice};
use crate::server::{AppState, JsonBody, request_id, stored_model};

/// A failure on an OpenAI endpoint (chat and text completions, Responses, embeddings,
/// transcriptions, models), answered in OpenAI's shape: this is where every error those
/// endpoints meet is put in their wire format, whatever part of the server raised it.
#[derive(Debug)]
pub struct OpenAiError(ApiError);

impl<E: Into<ApiError>> From<E> for OpenAiError {
    fn from(e: E) -> OpenAiError {
        OpenAiError(e.into().openai())
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        self.0.into_response()
    }
}

/// The generation fields both completion endpoints share.
#[derive(Debug, Deserialize)]
pub struct Sampling {
    #[serde(default)]
    temperature: Option<Value>,
    #[serde(default)]
    top_p: Option<Value>,
    #[serde(default)]
    presence_penalty: Option<Value>,
    #[serde(default)]
    frequency_penalty: Option<Value>,
    #[serde(default)]
    seed: Option<Value>,
    #[serde(default)]
    stop: Option<Value>,
    #[serde(default)]
    max_tokens: Option<Value>,
    #[serde(default)]
    max_completion_tokens: Option<Value>,
    #[serde(default)]
    logit_bias: Option<Value>,
    #[serde(default)]
    n: Option<u32>,
    /// Speculation, as in Ollama's options (`extra_body` in the OpenAI SDK): `draft` names a
    /// drafter or `none`, `num_draft` bounds its depth, `speculate: false` turns it off.
    #[serde(default)]
    draft: Option<Value>,
    #[serde(default)]
    num_draft: Option<Value>,
    #[serde(default)]
    speculate: Option<Value>,
}

impl Sampling {
    fn options(&self, defaults: &Map<String, Value>) -> Result<GenerationOptions, ApiError> {
        let options = GenerationOptions::layered(
            defaults,
            &[
                ("temperature", self.temperature.as_ref()),
                ("top_p", self.top_p.as_ref()),
                ("presence_penalty", self.presence_penalty.as_ref()),
                ("frequency_penalty", self.frequency_penalty.as_ref()),
                ("seed", self.seed.as_ref()),
                ("stop", self.stop.as_ref()),
                ("max_tokens", self.max_tokens.as_ref()),
                ("max_completion_tokens", self.max_completion_tokens.as_ref()),
                ("logit_bias", self.logit_bias.as_ref()),
                ("draft", self.draft.as_ref()),
                ("num_draft", self.num_draft.as_ref()),
                ("speculate", self.speculate.as_ref()),
            ],
        )?;
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::bad_request("only `n: 1` is supported"));
        }
        Ok(options)
    }
}

/// `/v1/chat/completions`' body.
#[derive(Debug, Deserialize)]
pub struct ChatCompletionRequest {
    model: String,
    messages: Vec<ChatMessage>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<Value>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    #[serde(default)]
    response_format: Option<Value>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<usize>,
    #[serde(default)]
    reasoning_effort: Option<String>,
    #[serde(flatten)]
    sampling: Sampling,
}

/// `/v1/completions`' body.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    model: String,
    prompt: Value,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<Value>,
    #[serde(default)]
    logprobs: Option<usize>,
    #[serde(default)]
    echo: bool,
    /// Not in OpenAI's legacy API; accepted as the chat endpoint's, as other local servers do.
    #[serde(default)]
    response_format: Option<Value>,
    #[serde(flatten)]
    sampling: Sampling,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn finish_reason(summary: &Summary, tool_calls: bool) -> &'static str {
    if tool_calls {
        return "tool_calls";
    }
    match summary.reason {
        DoneReason::Length => "length",
        DoneReason::Stop | DoneReason::Cancelled => "stop",
    }
}

fn usage(summary: &Summary) -> Value {
    let s = &summary.stats;
    let mut usage = json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.generated_tokens,
        "total_tokens": s.prompt_tokens + s.generated_tokens,
        "prompt_tokens_details": { "cached_tokens": s.cached_tokens },
    });
    super::generation::insert_images_encoded(&mut usage, s);
    // An extension object: what speculative decoding did.
    if let (Some(spec), Some(map)) = (&s.speculation, usage.as_object_mut()) {
        map.insert(
            "speculation".into(),
            super::generation::speculation_json(spec, summary.draft.as_ref()),
        );
    }
    usage
}

fn logprobs_json(entries: &[LogprobEntry]) -> Value {
    json!({ "content": entries })
}

fn tool_call_json(index: usize, call: &tokenizer::ToolCall) -> Value {
    json!({
        "index": index,
        "id": format!("call_{}", request_id("t").trim_start_matches("t-")),
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": serde_json::to_string(&call.arguments).unwrap_or_default(),
        }
    })
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ChatCompletionRequest>,
) -> Result<Response, OpenAiError> {
    let started = Instant::now();
    let (name, defaults) = stored_model(&state, &req.model)?;
    let options = req.sampling.options(&defaults)?;
    let format = structured::openai_response_format(req.response_format.as_ref())?;
    let choice = ToolChoice::from_openai(req.tool_choice.as_ref())?;
    // `none` withholds the tools from the model altogether.
    let tools = match choice {
        ToolChoice::None => None,
        _ => req.tools.as_deref(),
    };
    let top = req.top_logprobs.unwrap_or(0);
    if top > MAX_TOP_LOGPROBS {
        return Err(ApiError::bad_request(format!(
            "`top_logprobs` must be at most {MAX_TOP_LOGPROBS}"
        ))
        .into());
    }
    let logprobs = req.logprobs.unwrap_or(false).then_some(top);
    let mut attachments = Attachments::default();
    let messages = prompt::to_template_messages(&req.messages, &mut attachments)?;
    if messages.is_empty() {
        return Err(ApiError::bad_request("`messages` must not be empty").into());
    }
    attachments.require_supported(&state.store, &name)?;
    let lease = state
        .keeper
        .acquire_drafted(&name, options.draft_model.as_ref(), None)
        .await?;
    let load = started.elapsed();
    let requested = Requested {
        format,
        tools: tools.map(<[Value]>::to_vec).unwrap_or_default(),
        choice,
        parallel_calls: req.parallel_tool_calls.unwrap_or(true),
    };
    let request = GenerationRequest {
        source: PromptSource::Chat {
            messages,
            think: req.reasoning_effort.as_deref().map(|e| e != "none"),
        },
        media: attachments.media,
        requested,
        options,
        logprobs,
        started,
        load,
    };
    let outputs = request::start(lease, request).await?.outputs;
    let id = request_id("chatcmpl");
    let model = name.to_string();
    let include_usage = req
        .stream_options
        .as_ref()
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if req.stream {
        return Ok(sse(outputs, ChatStream::new(id, model, include_usage)));
    }
    Ok(collect_chat(outputs, id, model, logprobs.is_some()).await?)
}

async fn collect_chat(
    mut outputs: Receiver<Output>,
    id: String,
    model: String,
    want_logprobs: bool,
) -> Result<Response, ApiError> {
    let (mut content, mut reasoning, mut calls, mut lps) =
        (String::new(), String::new(), Vec::new(), Vec::new());
    let mut summary = None;
    while let Some(output) = outputs.recv().await {
        match output {
            Output::Content(text, entries) => {
                content.push_str(&text);
                lps.extend(entries);
            }
            Output::Thinking(text) => reasoning.push_str(&text),
            Output::ToolCall(call) => calls.push(call),
            Output::Done(s) => summary = Some(s),
            Output::Error(message) => return Err(ApiError::internal(message)),
        }
    }
    let summary = summary.ok_or_else(|| ApiError::internal("generation ended without a result"))?;
    let mut message = json!({ "role": "assistant", "content": content });
    if !reasoning.is_empty() {
        message["reasoning_content"] = json!(reasoning);
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(
            calls
                .iter()
                .enumerate()
                .map(|(i, c)| tool_call_json(i, c))
                .collect(),
        );
    }
    Ok(Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": now_secs(),
        "model": model,
        "system_fingerprint": format!("mlxkit-{}", env!("CARGO_PKG_VERSION")),
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": if want_logprobs { logprobs_json(&lps) } else { Value::Null },
            "finish_reason": finish_reason(&summary, !calls.is_empty()),
        }],
        "usage": usage(&summary),
    }))
    .into_response())
}

struct ChatStream {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    sent_role: bool,
    tool_calls: usize,
}

impl ChatStream {
    fn new(id: String, model: String, include_usage: bool) -> ChatStream {
        ChatStream {
            id,
            model,
            created: now_secs(),
            include_usage,
            sent_role: false,
            tool_calls: 0,
        }
    }

    fn chunk(&self, delta: Value, logprobs: Option<Value>, finish: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": format!("mlxkit-{}", env!("CARGO_PKG_VERSION")),
            "choices": [{
                "index": 0,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish,
            }],
        })
    }

    fn role(&mut self, mut delta: Value) -> Value {
        if !self.sent_role {
            self.sent_role = true;
            delta["role"] = json!("assistant");
        }
        delta
    }
}

impl SseShape for ChatStream {
    fn chunks(&mut self, output: &Output) -> Vec<Value> {
        match output {
            Output::Content(text, entries) => {
                let delta = self.role(json!({ "content": text }));
                let lp = (!entries.is_empty()).then(|| logprobs_json(entries));
                vec![self.chunk(delta, lp, None)]
            }
            Output::Thinking(text) => {
                let delta = self.role(json!({ "reasoning_content": text }));
                vec![self.chunk(delta, None, None)]
            }
            Output::ToolCall(call) => {
                let delta =
                    self.role(json!({ "tool_calls": [tool_call_json(self.tool_calls, call)] }));
                self.tool_calls += 1;
                vec![self.chunk(delta, None, None)]
            }
            Output::Done(summary) => {
                let delta = self.role(json!({}));
                let mut out = vec![self.chunk(
                    delta,
                    None,
                    Some(finish_reason(summary, self.tool_calls > 0)),
                )];
                if self.include_usage {
                    out.push(json!({
                        "id": self.id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": usage(summary),
                    }));
                }
                out
            }
            Output::Error(message) => {
                vec![json!({ "error": { "message": message, "type": "server_error" } })]
            }
        }
    }
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Response, OpenAiError> {
    let started = Instant::now();
    let (name, defaults) = stored_model(&state, &req.model)?;
    let options = req.sampling.options(&defaults)?;
    let prompt_text = match &req.prompt {
        Value::String(s) => s.clone(),
        Value::Array(items) if items.len() == 1 && items[0].is_string() => {
            items[0].as_str().unwrap_or("").to_string()
        }
        other => {
            return Err(
                ApiError::bad_request(format!("`prompt` must be a string, got {other}")).into(),
            );
        }
    };
    let format = structured::openai_response_format(req.response_format.as_ref())?;
    let top = req.logprobs.unwrap_or(0);
    if top > 5 {
        return Err(ApiError::bad_request("`logprobs` must be at most 5").into());
    }
    let lease = state
        .keeper
        .acquire_drafted(&name, options.draft_model.as_ref(), None)
        .await?;
    let load = started.elapsed();
    let requested = Requested {
        format,
        ..Requested::none()
    };
    let request = GenerationRequest {
        source: PromptSource::Raw(prompt_text.clone()),
        media: Vec::new(),
        requested,
        options,
        logprobs: req.logprobs,
        started,
        load,
    };
    let outputs = request::start(lease, request).await?.outputs;
    let id = request_id("cmpl");
    let model = name.to_string();
    let echo = req.echo.then(|| prompt_text.clone());
    let include_usage = req
        .stream_options
        .as_ref()
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if req.stream {
        return Ok(sse(
            outputs,
            CompletionStream {
                id,
                model,
                created: now_secs(),
                include_usage,
                echo,
            },
        ));
    }
    let mut outputs = outputs;
    let mut text = echo.unwrap_or_default();
    let mut entries = Vec::new();
    let mut summary = None;
    while let Some(output) = outputs.recv().await {
        match output {
            Output::Content(t, e) => {
                text.push_str(&t);
                entries.extend(e);
            }
            Output::Done(s) => summary = Some(s),
            Output::Error(message) => return Err(ApiError::internal(message).into()),
            Output::Thinking(_) | Output::ToolCall(_) => {}
        }
    }
    let summary = summary.ok_or_else(|| ApiError::internal("generation ended without a result"))?;
    Ok(Json(json!({
        "id": id,
        "object": "text_completion",
        "created": now_secs(),
        "model": model,
        "choices": [{
            "text": text,
            "index": 0,
            "logprobs": if req.logprobs.is_some() { completion_logprobs(&entries) } else { Value::Null },
            "finish_reason": finish_reason(&summary, false),
        }],
        "usage": usage(&summary),
    }))
    .into_response())
}

/// The legacy completions logprobs shape.
fn completion_logprobs(entries: &[LogprobEntry]) -> Value {
    json!({
        "tokens": entries.iter().map(|e| e.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
        "top_logprobs": entries.iter().map(|e| {
            e.top_logprobs.iter().map(|t| (t.token.clone(), json!(t.logprob))).collect::<Map<String, Value>>()
        }).collect::<Vec<_>>(),
        "text_offset": [],
    })
}

struct CompletionStream {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    echo: Option<String>,
}

impl CompletionStream {
    fn chunk(&self, text: &str, logprobs: Value, finish: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [{ "text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish }],
        })
    }
}

impl SseShape for CompletionStream {
    fn chunks(&mut self, output: &Output) -> Vec<Value> {
        let mut out = Vec::new();
        if let Some(echo) = self.echo.take() {
            out.push(self.chunk(&echo, Value::Null, None));
        }
        match output {
            Output::Content(text, entries) => {
                let lp = if entries.is_empty() {
                    Value::Null
                } else {
                    completion_logprobs(entries)
                };
                out.push(self.chunk(text, lp, None));
            }
            Output::Done(summary) => {
                out.push(self.chunk("", Value::Null, Some(finish_reason(summary, false))));
                if self.include_usage {
                    out.push(json!({
                        "id": self.id,
                        "object": "text_completion",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": usage(summary),
                    }));
                }
            }
            Output::Error(message) => {
                out.push(json!({ "error": { "message": message, "type": "server_error" } }))
            }
            Output::Thinking(_) | Output::ToolCall(_) => {}
        }
        out
    }
}

/// `GET /v1/models`.
pub async fn models(State(state): State<AppState>) -> Result<Json<Value>, OpenAiError> {
    let entries = state.store.list()?;
    Ok(Json(json!({
        "object": "list",
        "data": entries.iter().map(model_json).collect::<Vec<_>>(),
    })))
}

/// `GET /v1/models/{model}`.
pub async fn model(
    State(state): State<AppState>,
    Path(model): Path<String>,
) -> Result<Json<Value>, OpenAiError> {
    let name = ModelName::parse(&model)?;
    let entry = state.store.get(&name)?;
    Ok(Json(model_json(&entry)))
}

fn model_json(entry: &crate::store::Entry) -> Value {
    json!({
        "id": entry.name.to_string(),
        "object": "model",
        "created": entry.modified.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        "owned_by": "library",
    })
}
