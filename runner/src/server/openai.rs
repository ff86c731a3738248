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
use crate::server::choices::interleave;
use crate::server::error::ApiError;
use crate::server::generation::{LogprobEntry, Output, Summary};
use crate::server::ollama::MAX_TOP_LOGPROBS;
use crate::server::options::GenerationOptions;
use crate::server::prompt::{self, Attachments, ChatMessage};
use crate::server::request::{self, GenerationRequest, MAX_CHOICES, PromptSource};
use crate::server::requested_shape::{self, Requested, ToolChoice};
use crate::server::sse::{SseShape, sse};
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
    /// How many choices to generate, each a row of the engine's batch.
    #[serde(default)]
    n: Option<Value>,
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
        Ok(options)
    }

    /// `n`: how many choices to generate, 1 when absent.
    fn choices(&self) -> Result<usize, ApiError> {
        let Some(n) = self.n.as_ref().filter(|n| !n.is_null()) else {
            return Ok(1);
        };
        match n.as_u64() {
            Some(count) if (1..=MAX_CHOICES as u64).contains(&count) => Ok(count as usize),
            _ => Err(ApiError::bad_request(format!(
                "`n` must be a whole number from 1 to {MAX_CHOICES}, got {n}"
            ))),
        }
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

/// What OpenAI's API calls a finish reason. A limit reached wins over the calls made before it: the reply was cut (a second call's half
/// is dropped, issue 48), and `tool_calls` would tell the client it had every call.
fn finish_reason(summary: &Summary, tool_calls: bool) -> &'static str {
    match summary.reason {
        DoneReason::Length => "length",
        _ if tool_calls => "tool_calls",
        DoneReason::Stop | DoneReason::Cancelled => "stop",
    }
}

/// The usage of a request's choices (one summary each, in choice order): the prompt counted
/// once, as OpenAI counts it, the completions summed; what the prompt found cached, images
/// encoded and speculation are choice 0's.
fn usage(summaries: &[&Summary]) -> Value {
    let Some(summary) = summaries.first() else {
        return Value::Null;
    };
    let s = &summary.stats;
    let completion: usize = summaries.iter().map(|s| s.stats.generated_tokens).sum();
    let mut usage = json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": s.prompt_tokens + completion,
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
    let choices = req.sampling.choices()?;
    let format = requested_shape::openai_response_format(req.response_format.as_ref())?;
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
    let outputs = request::start_choices(lease, request, choices)
        .await?
        .outputs;
    let id = request_id("chatcmpl");
    let model = name.to_string();
    let include_usage = include_usage(req.stream_options.as_ref());
    if req.stream {
        let stream = ChatStream::new(id, model, include_usage, outputs.len());
        return Ok(sse(interleave(outputs), stream));
    }
    let choices = futures_util::future::try_join_all(outputs.into_iter().map(collect_chat)).await?;
    let summaries: Vec<&Summary> = choices.iter().map(|c| &c.summary).collect();
    let usage = usage(&summaries);
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(index, choice)| choice.to_json(index, logprobs.is_some()))
        .collect();
    Ok(Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": now_secs(),
        "model": model,
        "system_fingerprint": format!("mlxkit-{}", env!("CARGO_PKG_VERSION")),
        "choices": choices,
        "usage": usage,
    }))
    .into_response())
}

/// Whether `stream_options` asks for a last chunk with the usage.
fn include_usage(stream_options: Option<&Value>) -> bool {
    stream_options
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// One chat choice, collected whole.
struct ChatChoice {
    content: String,
    reasoning: String,
    calls: Vec<tokenizer::ToolCall>,
    logprobs: Vec<LogprobEntry>,
    summary: Summary,
}

impl ChatChoice {
    /// The choice as `choices[index]` of a chat completion.
    fn to_json(&self, index: usize, want_logprobs: bool) -> Value {
        let mut message = json!({ "role": "assistant", "content": self.content });
        if !self.reasoning.is_empty() {
            message["reasoning_content"] = json!(self.reasoning);
        }
        if !self.calls.is_empty() {
            message["tool_calls"] = Value::Array(
                self.calls
                    .iter()
                    .enumerate()
                    .map(|(i, c)| tool_call_json(i, c))
                    .collect(),
            );
        }
        json!({
            "index": index,
            "message": message,
            "logprobs": if want_logprobs { logprobs_json(&self.logprobs) } else { Value::Null },
            "finish_reason": finish_reason(&self.summary, !self.calls.is_empty()),
        })
    }
}

async fn collect_chat(mut outputs: Receiver<Output>) -> Result<ChatChoice, ApiError> {
    let (mut content, mut reasoning, mut calls, mut logprobs) =
        (String::new(), String::new(), Vec::new(), Vec::new());
    let mut summary = None;
    while let Some(output) = outputs.recv().await {
        match output {
            Output::Content(text, entries) => {
                content.push_str(&text);
                logprobs.extend(entries);
            }
            Output::Thinking(text) => reasoning.push_str(&text),
            Output::ToolCall(call) => calls.push(call),
            Output::Done(s) => summary = Some(s),
            Output::Error(message) => return Err(ApiError::internal(message)),
        }
    }
    let summary = summary.ok_or_else(|| ApiError::internal("generation ended without a result"))?;
    Ok(ChatChoice {
        content,
        reasoning,
        calls,
        logprobs,
        summary,
    })
}

/// A streamed chat completion's chunks: a role-only chunk per choice first, then each
/// choice's deltas as they come (tagged with its `index`), its finish reason, and the usage
/// once every choice has finished, when asked.
struct ChatStream {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    /// Tool calls sent so far, per choice.
    tool_calls: Vec<usize>,
    /// Each choice's summary, once it has finished.
    finished: Vec<Option<Summary>>,
}

impl ChatStream {
    fn new(id: String, model: String, include_usage: bool, choices: usize) -> ChatStream {
        ChatStream {
            id,
            model,
            created: now_secs(),
            include_usage,
            tool_calls: vec![0; choices],
            finished: vec![None; choices],
        }
    }

    fn chunk(
        &self,
        index: usize,
        delta: Value,
        logprobs: Option<Value>,
        finish: Option<&str>,
    ) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": format!("mlxkit-{}", env!("CARGO_PKG_VERSION")),
            "choices": [{
                "index": index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish,
            }],
        })
    }
}

impl SseShape<(usize, Output)> for ChatStream {
    /// The role alone, before anything is generated, as OpenAI's first chunk carries it;
    /// `content: null` beside it, as llama.cpp sends it and its server tests expect (OpenAI
    /// sends `""`; clients read both as no text).
    fn opening(&mut self) -> Vec<Value> {
        (0..self.finished.len())
            .map(|index| {
                self.chunk(
                    index,
                    json!({ "role": "assistant", "content": null }),
                    None,
                    None,
                )
            })
            .collect()
    }

    fn chunks(&mut self, (index, output): &(usize, Output)) -> Vec<Value> {
        let index = *index;
        match output {
            Output::Content(text, entries) => {
                let lp = (!entries.is_empty()).then(|| logprobs_json(entries));
                vec![self.chunk(index, json!({ "content": text }), lp, None)]
            }
            Output::Thinking(text) => {
                vec![self.chunk(index, json!({ "reasoning_content": text }), None, None)]
            }
            Output::ToolCall(call) => {
                let Some(sent) = self.tool_calls.get_mut(index) else {
                    return Vec::new();
                };
                let delta = json!({ "tool_calls": [tool_call_json(*sent, call)] });
                *sent += 1;
                vec![self.chunk(index, delta, None, None)]
            }
            Output::Done(summary) => {
                let calls = self.tool_calls.get(index).copied().unwrap_or(0);
                let mut out = vec![self.chunk(
                    index,
                    json!({}),
                    None,
                    Some(finish_reason(summary, calls > 0)),
                )];
                if let Some(slot) = self.finished.get_mut(index) {
                    *slot = Some(summary.clone());
                }
                let summaries: Option<Vec<&Summary>> =
                    self.finished.iter().map(Option::as_ref).collect();
                if let Some(summaries) = summaries.filter(|_| self.include_usage) {
                    out.push(json!({
                        "id": self.id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": usage(&summaries),
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
    let choices = req.sampling.choices()?;
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
    let format = requested_shape::openai_response_format(req.response_format.as_ref())?;
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
    let outputs = request::start_choices(lease, request, choices)
        .await?
        .outputs;
    let id = request_id("cmpl");
    let model = name.to_string();
    let echo = req.echo.then(|| prompt_text.clone());
    let include_usage = include_usage(req.stream_options.as_ref());
    if req.stream {
        let stream = CompletionStream {
            id,
            model,
            created: now_secs(),
            include_usage,
            echo,
            started: vec![false; outputs.len()],
            finished: vec![None; outputs.len()],
        };
        return Ok(sse(interleave(outputs), stream));
    }
    let collected = outputs
        .into_iter()
        .map(|outputs| collect_completion(outputs, echo.clone().unwrap_or_default()));
    let collected = futures_util::future::try_join_all(collected).await?;
    let summaries: Vec<&Summary> = collected.iter().map(|(_, _, s)| s).collect();
    let usage = usage(&summaries);
    let choices: Vec<Value> = collected
        .iter()
        .enumerate()
        .map(|(index, (text, entries, summary))| {
            json!({
                "text": text,
                "index": index,
                "logprobs": if req.logprobs.is_some() { completion_logprobs(entries) } else { Value::Null },
                "finish_reason": finish_reason(summary, false),
            })
        })
        .collect();
    Ok(Json(json!({
        "id": id,
        "object": "text_completion",
        "created": now_secs(),
        "model": model,
        "choices": choices,
        "usage": usage,
    }))
    .into_response())
}

/// One text completion choice, collected whole after `text` (the echoed prompt, or nothing):
/// its text, its tokens' logprobs and how it ended.
async fn collect_completion(
    mut outputs: Receiver<Output>,
    mut text: String,
) -> Result<(String, Vec<LogprobEntry>, Summary), ApiError> {
    let mut entries = Vec::new();
    let mut summary = None;
    while let Some(output) = outputs.recv().await {
        match output {
            Output::Content(t, e) => {
                text.push_str(&t);
                entries.extend(e);
            }
            Output::Done(s) => summary = Some(s),
            Output::Error(message) => return Err(ApiError::internal(message)),
            Output::Thinking(_) | Output::ToolCall(_) => {}
        }
    }
    let summary = summary.ok_or_else(|| ApiError::internal("generation ended without a result"))?;
    Ok((text, entries, summary))
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

/// A streamed text completion's chunks, each choice's tagged with its `index`.
struct CompletionStream {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    /// The prompt, when `echo` asks for it before each choice's text.
    echo: Option<String>,
    /// Whether each choice has sent anything yet (its echo goes first).
    started: Vec<bool>,
    /// Each choice's summary, once it has finished.
    finished: Vec<Option<Summary>>,
}

impl CompletionStream {
    fn chunk(&self, index: usize, text: &str, logprobs: Value, finish: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [{ "text": text, "index": index, "logprobs": logprobs, "finish_reason": finish }],
        })
    }
}

impl SseShape<(usize, Output)> for CompletionStream {
    fn chunks(&mut self, (index, output): &(usize, Output)) -> Vec<Value> {
        let index = *index;
        let mut out = Vec::new();
        if let Some(started) = self.started.get_mut(index)
            && !*started
        {
            *started = true;
            if let Some(echo) = &self.echo {
                out.push(self.chunk(index, echo, Value::Null, None));
            }
        }
        match output {
            Output::Content(text, entries) => {
                let lp = if entries.is_empty() {
                    Value::Null
                } else {
                    completion_logprobs(entries)
                };
                out.push(self.chunk(index, text, lp, None));
            }
            Output::Done(summary) => {
                out.push(self.chunk(index, "", Value::Null, Some(finish_reason(summary, false))));
                if let Some(slot) = self.finished.get_mut(index) {
                    *slot = Some(summary.clone());
                }
                let summaries: Option<Vec<&Summary>> =
                    self.finished.iter().map(Option::as_ref).collect();
                if let Some(summaries) = summaries.filter(|_| self.include_usage) {
                    out.push(json!({
                        "id": self.id,
                        "object": "text_completion",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": usage(&summaries),
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn ended(reason: DoneReason) -> Summary {
        Summary {
            reason,
            stats: Default::default(),
            total: Default::default(),
            load: Default::default(),
            draft: None,
            stop_sequence: None,
        }
    }

    #[test]
    fn a_limit_reached_after_a_call_is_length() {
        assert_eq!(finish_reason(&ended(DoneReason::Length), true), "length");
        assert_eq!(finish_reason(&ended(DoneReason::Stop), true), "tool_calls");
        assert_eq!(finish_reason(&ended(DoneReason::Stop), false), "stop");
    }
}
