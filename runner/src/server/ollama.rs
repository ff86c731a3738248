//! Ollama's API: `/api/generate`, `/api/chat` and the model-management endpoints.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc::Receiver;

use grammar::GrammarSpec;

use crate::engine::DoneReason;
use crate::model_keeper::{KeepAlive, Lease};
use crate::model_name::ModelName;
use crate::server::error::ApiError;
use crate::server::generation::{self, Output, Summary};
use crate::server::options::GenerationOptions;
use crate::server::prompt::{self, Attachments, ChatMessage};
use crate::server::request::{self, GenerationRequest, PromptSource};
use crate::server::requested_shape::{self, Requested};
use crate::server::{AppState, JsonBody, rfc3339};

/// The fields `/api/generate` and `/api/chat` share.
#[derive(Debug, Deserialize)]
pub struct GenerationFields {
    model: String,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    format: Option<Value>,
    #[serde(default)]
    options: Option<Map<String, Value>>,
    #[serde(default)]
    keep_alive: Option<Value>,
    #[serde(default)]
    think: Option<Value>,
    #[serde(default)]
    logprobs: bool,
    #[serde(default)]
    top_logprobs: Option<usize>,
}

/// `/api/generate`'s body.
#[derive(Debug, Deserialize)]
pub struct GenerateRequest {
    #[serde(flatten)]
    fields: GenerationFields,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    suffix: Option<String>,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    raw: bool,
    #[serde(default)]
    images: Option<Vec<String>>,
}

/// `/api/chat`'s body.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    #[serde(flatten)]
    fields: GenerationFields,
    #[serde(default)]
    messages: Vec<ChatMessage>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
}

/// The parts of a generation request both endpoints share.
struct Common {
    name: ModelName,
    format: Option<GrammarSpec>,
    options: GenerationOptions,
    keep_alive: Option<KeepAlive>,
    think: Option<bool>,
    logprobs: Option<usize>,
    stream: bool,
}

/// The most alternatives a client may ask for per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

fn common(state: &AppState, fields: &GenerationFields) -> Result<Common, ApiError> {
    let GenerationFields {
        model,
        stream,
        format,
        options,
        keep_alive,
        think,
        logprobs,
        top_logprobs,
    } = fields;
    let (format, options, keep_alive, think) = (
        format.as_ref(),
        options.as_ref(),
        keep_alive.as_ref(),
        think.as_ref(),
    );
    let (logprobs, top_logprobs, stream) = (*logprobs, *top_logprobs, *stream);
    if model.is_empty() {
        return Err(ApiError::bad_request("`model` is required"));
    }
    let name = ModelName::parse(model)?;
    let format = requested_shape::ollama_format(format)?;
    let mut generation = GenerationOptions::default();
    if let Ok(defaults) = state.model_defaults(&name) {
        generation.apply(&defaults)?;
    }
    if let Some(options) = options {
        generation.apply(options)?;
    }
    let keep_alive = keep_alive
        .map(KeepAlive::parse)
        .transpose()
        .map_err(ApiError::bad_request)?;
    let think = match think {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        // Effort levels ("low", "medium", "high") all mean "think".
        Some(Value::String(_)) => Some(true),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "`think` must be true, false or a level, got {other}"
            )));
        }
    };
    let top = top_logprobs.unwrap_or(0);
    if top > MAX_TOP_LOGPROBS {
        return Err(ApiError::bad_request(format!(
            "`top_logprobs` must be at most {MAX_TOP_LOGPROBS}, got {top}"
        )));
    }
    Ok(Common {
        name,
        format,
        options: generation,
        keep_alive,
        think,
        logprobs: (logprobs || top > 0).then_some(top),
        stream: stream.unwrap_or(true),
    })
}

/// `POST /api/generate`.
pub async fn generate(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<GenerateRequest>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let c = common(&state, &req.fields)?;
    let mut attachments = Attachments::default();
    // The images come before the prompt's text, as Ollama places them (a raw prompt may place
    // them itself with `[img-N]` tags).
    let mut tags = String::new();
    for image in req.images.iter().flatten() {
        tags.push_str(&attachments.add_image(prompt::image_base64(image)?));
    }
    let prompt_text = req.prompt.unwrap_or_default();
    let tagged_text = match req.raw {
        true => prompt_text.clone(),
        false => format!("{tags}{prompt_text}"),
    };
    // Checked before the model loads: what a model takes is known from its manifest.
    attachments.require_supported(&state.store, &c.name)?;
    let lease = state
        .keeper
        .acquire_drafted(&c.name, c.options.draft_model.as_ref(), c.keep_alive)
        .await?;
    let load = started.elapsed();
    if prompt_text.is_empty() && req.suffix.is_none() {
        // An empty prompt only loads (or, with keep_alive 0, unloads) the model.
        drop(lease);
        if c.keep_alive == Some(KeepAlive::For(Duration::ZERO)) {
            state.keeper.unload(&c.name).await?;
        }
        let reason = if c.keep_alive == Some(KeepAlive::For(Duration::ZERO)) {
            "unload"
        } else {
            "load"
        };
        return Ok(Json(json!({
            "model": c.name.to_string(),
            "created_at": rfc3339(SystemTime::now()),
            "response": "",
            "done": true,
            "done_reason": reason,
        }))
        .into_response());
    }
    let source = match req.suffix.filter(|s| !s.is_empty()) {
        Some(suffix) => PromptSource::Infill {
            prefix: prompt_text,
            suffix,
        },
        None if req.raw => PromptSource::Raw(tagged_text),
        None => {
            let mut messages = Vec::new();
            if let Some(system) = req.system.filter(|s| !s.is_empty()) {
                messages.push(tokenizer::Message::new("system", system));
            }
            messages.push(tokenizer::Message::new("user", tagged_text));
            PromptSource::Chat {
                messages,
                think: c.think,
            }
        }
    };
    let timing = (started, load);
    let media = attachments.media;
    run(
        lease,
        c,
        (source, media),
        Vec::new(),
        timing,
        generate_chunk,
        GenerateCollector::default(),
    )
    .await
}

/// `POST /api/chat`.
pub async fn chat(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<ChatRequest>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let c = common(&state, &req.fields)?;
    let mut attachments = Attachments::default();
    let messages = prompt::to_template_messages(&req.messages, &mut attachments)?;
    attachments.require_supported(&state.store, &c.name)?;
    let lease = state
        .keeper
        .acquire_drafted(&c.name, c.options.draft_model.as_ref(), c.keep_alive)
        .await?;
    let load = started.elapsed();
    if messages.is_empty() {
        drop(lease);
        return Ok(Json(json!({
            "model": c.name.to_string(),
            "created_at": rfc3339(SystemTime::now()),
            "message": {"role": "assistant", "content": ""},
            "done": true,
            "done_reason": "load",
        }))
        .into_response());
    }
    let think = c.think;
    let timing = (started, load);
    run(
        lease,
        c,
        (PromptSource::Chat { messages, think }, attachments.media),
        req.tools.unwrap_or_default(),
        timing,
        chat_chunk,
        ChatCollector::default(),
    )
    .await
}

/// Starts the generation through the request builder and answers streamed or collected.
async fn run<C: Collector>(
    lease: Lease,
    c: Common,
    (source, media): (PromptSource, Vec<Arc<[u8]>>),
    tools: Vec<Value>,
    (started, load): (Instant, Duration),
    chunk: fn(&str, &Output) -> Option<Value>,
    collector: C,
) -> Result<Response, ApiError> {
    // Ollama has no `tool_choice`: calls are always the model's choice.
    let requested = Requested {
        format: c.format.clone(),
        tools,
        ..Requested::none()
    };
    let started = request::start(
        lease,
        GenerationRequest {
            source,
            media,
            requested,
            options: c.options,
            logprobs: c.logprobs,
            started,
            load,
        },
    )
    .await?;
    let model = c.name.to_string();
    let name = model.clone();
    let shape = move |output: &Output| chunk(&name, output);
    Ok(respond(started.outputs, c.stream, model, shape, collector).await)
}

fn done_fields(summary: &Summary) -> Map<String, Value> {
    let s = &summary.stats;
    let mut m = Map::new();
    m.insert("done".into(), json!(true));
    m.insert("done_reason".into(), json!(reason_name(summary.reason)));
    m.insert(
        "total_duration".into(),
        json!(summary.total.as_nanos() as u64),
    );
    m.insert(
        "load_duration".into(),
        json!(summary.load.as_nanos() as u64),
    );
    m.insert("prompt_eval_count".into(), json!(s.prompt_eval_count()));
    // Not in Ollama's API: prompt tokens served from the prefix cache instead of evaluated.
    m.insert("prompt_cached_count".into(), json!(s.cached_tokens));
    m.insert(
        "prompt_eval_duration".into(),
        json!(s.prompt_eval.as_nanos() as u64),
    );
    m.insert("eval_count".into(), json!(s.generated_tokens));
    m.insert("eval_duration".into(), json!(s.eval.as_nanos() as u64));
    // Not in Ollama's API either: how many of the prompt's images the vision encoder ran for
    // (the others came from the prefix cache or the cache of encoded images).
    if s.images > 0 {
        m.insert("images_encoded".into(), json!(s.images_encoded));
    }
    if s.audio > 0 {
        m.insert("audio_encoded".into(), json!(s.audio_encoded));
    }
    // Not in Ollama's API either: what speculative decoding did.
    if let Some(spec) = &s.speculation {
        m.insert(
            "speculation".into(),
            super::generation::speculation_json(spec, summary.draft.as_ref()),
        );
    }
    m
}

fn reason_name(reason: DoneReason) -> &'static str {
    match reason {
        DoneReason::Stop | DoneReason::Cancelled => "stop",
        DoneReason::Length => "length",
    }
}

fn base(model: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("model".into(), json!(model));
    m.insert("created_at".into(), json!(rfc3339(SystemTime::now())));
    m
}

/// One streamed `/api/generate` line, or `None` for outputs it does not show.
fn generate_chunk(model: &str, output: &Output) -> Option<Value> {
    let mut m = base(model);
    match output {
        Output::Content(text, logprobs) => {
            m.insert("response".into(), json!(text));
            if !logprobs.is_empty() {
                m.insert("logprobs".into(), json!(logprobs));
            }
            m.insert("done".into(), json!(false));
        }
        Output::Thinking(text) => {
            m.insert("response".into(), json!(""));
            m.insert("thinking".into(), json!(text));
            m.insert("done".into(), json!(false));
        }
        Output::ToolCall(_) => return None,
        Output::Done(summary) => {
            m.insert("response".into(), json!(""));
            m.extend(done_fields(summary));
        }
        Output::Error(message) => return Some(json!({ "error": message })),
    }
    Some(Value::Object(m))
}

fn tool_call_json(call: &tokenizer::ToolCall) -> Value {
    json!({"function": {"name": call.name, "arguments": call.arguments}})
}

/// One streamed `/api/chat` line.
fn chat_chunk(model: &str, output: &Output) -> Option<Value> {
    let mut m = base(model);
    match output {
        Output::Content(text, logprobs) => {
            m.insert(
                "message".into(),
                json!({"role": "assistant", "content": text}),
            );
            if !logprobs.is_empty() {
                m.insert("logprobs".into(), json!(logprobs));
            }
            m.insert("done".into(), json!(false));
        }
        Output::Thinking(text) => {
            m.insert(
                "message".into(),
                json!({"role": "assistant", "content": "", "thinking": text}),
            );
            m.insert("done".into(), json!(false));
        }
        Output::ToolCall(call) => {
            m.insert(
                "message".into(),
                json!({"role": "assistant", "content": "", "tool_calls": [tool_call_json(call)]}),
            );
            m.insert("done".into(), json!(false));
        }
        Output::Done(summary) => {
            m.insert(
                "message".into(),
                json!({"role": "assistant", "content": ""}),
            );
            m.extend(done_fields(summary));
        }
        Output::Error(message) => return Some(json!({ "error": message })),
    }
    Some(Value::Object(m))
}

/// Folds a whole generation into one response object.
pub trait Collector: Send + 'static {
    /// Takes one output.
    fn add(&mut self, output: Output);
    /// The response: `Ok` body, or an error status and message.
    fn finish(self, model: &str) -> Result<Value, ApiError>;
}

#[derive(Default)]
struct Collected {
    content: String,
    thinking: String,
    tool_calls: Vec<tokenizer::ToolCall>,
    logprobs: Vec<generation::LogprobEntry>,
    summary: Option<Summary>,
    error: Option<String>,
}

impl Collected {
    fn add(&mut self, output: Output) {
        match output {
            Output::Content(text, logprobs) => {
                self.content.push_str(&text);
                self.logprobs.extend(logprobs);
            }
            Output::Thinking(text) => self.thinking.push_str(&text),
            Output::ToolCall(call) => self.tool_calls.push(call),
            Output::Done(summary) => self.summary = Some(summary),
            Output::Error(message) => self.error = Some(message),
        }
    }

    fn finish_fields(&self, model: &str) -> Result<Map<String, Value>, ApiError> {
        if let Some(error) = &self.error {
            return Err(ApiError::internal(error.clone()));
        }
        let summary = self
            .summary
            .as_ref()
            .ok_or_else(|| ApiError::internal("generation ended without a result"))?;
        let mut m = base(model);
        m.extend(done_fields(summary));
        if !self.logprobs.is_empty() {
            m.insert("logprobs".into(), json!(self.logprobs));
        }
        Ok(m)
    }
}

#[derive(Default)]
struct GenerateCollector(Collected);

impl Collector for GenerateCollector {
    fn add(&mut self, output: Output) {
        self.0.add(output);
    }

    fn finish(self, model: &str) -> Result<Value, ApiError> {
        let mut m = self.0.finish_fields(model)?;
        m.insert("response".into(), json!(self.0.content));
        if !self.0.thinking.is_empty() {
            m.insert("thinking".into(), json!(self.0.thinking));
        }
        Ok(Value::Object(m))
    }
}

#[derive(Default)]
struct ChatCollector(Collected);

impl Collector for ChatCollector {
    fn add(&mut self, output: Output) {
        self.0.add(output);
    }

    fn finish(self, model: &str) -> Result<Value, ApiError> {
        let mut m = self.0.finish_fields(model)?;
        let mut message = json!({"role": "assistant", "content": self.0.content});
        if !self.0.thinking.is_empty() {
            message["thinking"] = json!(self.0.thinking);
        }
        if !self.0.tool_calls.is_empty() {
            message["tool_calls"] =
                Value::Array(self.0.tool_calls.iter().map(tool_call_json).collect());
        }
        m.insert("message".into(), message);
        Ok(Value::Object(m))
    }
}

/// Streams outputs as NDJSON lines, or collects them into one JSON response.
async fn respond<C: Collector>(
    mut outputs: Receiver<Output>,
    stream: bool,
    model: String,
    shape: impl Fn(&Output) -> Option<Value> + Send + 'static,
    mut collector: C,
) -> Response {
    if stream {
        return ndjson(outputs, shape);
    }
    while let Some(output) = outputs.recv().await {
        collector.add(output);
    }
    match collector.finish(&model) {
        Ok(body) => Json(body).into_response(),
        Err(e) => e.into_response(),
    }
}

/// A streamed NDJSON body: one JSON object per line, flushed as produced. Dropping the body
/// (the client left) drops the receiver, which cancels the generation.
pub fn ndjson(
    outputs: Receiver<Output>,
    shape: impl Fn(&Output) -> Option<Value> + Send + 'static,
) -> Response {
    let lines = futures_util::stream::unfold((outputs, shape), |(mut outputs, shape)| async move {
        loop {
            let output = outputs.recv().await?;
            if let Some(value) = shape(&output) {
                let mut line = serde_json::to_vec(&value).unwrap_or_default();
                line.push(b'\n');
                return Some((Ok::<Bytes, Infallible>(Bytes::from(line)), (outputs, shape)));
            }
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(lines))
        .unwrap_or_else(|_| ApiError::internal("building the response").into_response())
}
