//! Turning a request into prompt tokens: chat messages through the model's template, media
//! checked, the context enforced. Runs in the request's task, beside the engine's work.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;
use tokenizer::{
    Message, MessageToolCall, ParserConfig, RenderOptions, ToolCallFormat, ToolFormat,
};

use crate::engine::{ModelInfo, PromptMedia};
use crate::server::audio;
use crate::server::images;
use crate::server::prompt_tokens::{check_bytes, encode};
use crate::server::request_error::RequestError;

/// The largest decoded image or audio payload accepted, in bytes.
pub const MAX_MEDIA_BYTES: u64 = 32 << 20;

/// A chat message as Ollama's and OpenAI's clients send it (the union of both shapes).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Text, or (OpenAI) a list of content parts.
    #[serde(default)]
    pub content: Option<Value>,
    /// Ollama: base64 images.
    #[serde(default)]
    pub images: Option<Vec<String>>,
    /// Previous reasoning (Ollama `thinking`).
    #[serde(default)]
    pub thinking: Option<String>,
    /// Previous reasoning (OpenAI-compatible servers' `reasoning_content`).
    #[serde(default)]
    pub reasoning_content: Option<String>,
    /// Tool calls an assistant made.
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
    /// Tool result: the function's name.
    #[serde(default)]
    pub name: Option<String>,
    /// Tool result: which call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// Ollama's tool result name field.
    #[serde(default)]
    pub tool_name: Option<String>,
}

/// Media attached to a request, decoded and checked.
#[derive(Debug, Default)]
pub struct Attachments {
    /// How many of `media` are audio clips.
    pub audio: usize,
    /// The bytes of each image or audio clip found: the `[img-N]` tags in the messages name
    /// them by index, whatever their kind (their bytes say which).
    pub media: Vec<Arc<[u8]>>,
}

impl Attachments {
    /// Fails with a clear error when the model cannot take what was attached, before anything
    /// loads: an unknown model is "not found" first. A model takes images when its checkpoint
    /// has a vision tower (its capabilities list `vision`), audio when it has an audio encoder
    /// (`audio`).
    pub fn require_supported(
        &self,
        store: &crate::store::Store,
        name: &crate::model_name::ModelName,
    ) -> Result<(), RequestError> {
        let image_count = self.media.len().saturating_sub(self.audio);
        if image_count == 0 && self.audio == 0 {
            return Ok(());
        }
        let entry = store.get(name)?;
        let model = name.to_string();
        let inputs =
            crate::capabilities::Inputs::of_capabilities(&entry.manifest.details.capabilities);
        if image_count > 0 {
            if !inputs.vision {
                return Err(RequestError::refused(format!(
                    "model `{model}` does not support images"
                )));
            }
            if image_count > images::MAX_IMAGES {
                return Err(RequestError::invalid(format!(
                    "{image_count} images in one request, at most {} are accepted",
                    images::MAX_IMAGES
                )));
            }
        }
        if self.audio > 0 {
            if !inputs.audio {
                return Err(RequestError::refused(format!(
                    "model `{model}` does not support audio"
                )));
            }
            if self.audio > audio::MAX_CLIPS {
                return Err(RequestError::invalid(format!(
                    "{} audio clips in one request, at most {} are accepted",
                    self.audio,
                    audio::MAX_CLIPS
                )));
            }
        }
        Ok(())
    }
}

/// Checks an Ollama `images` entry (base64) decodes to a real image.
pub fn check_image_base64(payload: &str) -> Result<(), RequestError> {
    image_base64(payload).map(drop)
}

/// The bytes of an Ollama `images` entry (base64), checked to be an image by their signature
/// (decoding them under limits waits for a model that reads them).
pub fn image_base64(payload: &str) -> Result<Vec<u8>, RequestError> {
    let bytes = media::decode_ollama_image(payload, MAX_MEDIA_BYTES)
        .map_err(|e| RequestError::invalid(format!("invalid image: {e}")))?;
    check_image_bytes(&bytes)?;
    Ok(bytes)
}

/// The bytes of an OpenAI `image_url` (a base64 data URL; remote URLs are not fetched),
/// checked to be an image by their signature.
pub fn image_url(url: &str) -> Result<Vec<u8>, RequestError> {
    let bytes = media::decode_image_url(url, MAX_MEDIA_BYTES)
        .map_err(|e| RequestError::invalid(format!("invalid image: {e}")))?;
    check_image_bytes(&bytes)?;
    Ok(bytes)
}

impl Attachments {
    /// Keeps an image's bytes; returns the `[img-N]` tag that places it in a prompt.
    pub fn add_image(&mut self, bytes: Vec<u8>) -> String {
        let tag = format!("[img-{}]", self.media.len());
        self.media.push(bytes.into());
        tag
    }

    /// Keeps an audio clip's bytes; returns the tag that places it in a prompt (the same
    /// `[img-N]` media tag as images': the bytes tell the kinds apart).
    pub fn add_audio(&mut self, bytes: Vec<u8>) -> String {
        self.audio += 1;
        self.add_image(bytes)
    }
}

/// The bytes of an OpenAI `input_audio` part (`{"input_audio": {"data", "format"}}`), checked
/// to be audio by their signature; decoding them under limits waits for a model that reads
/// them.
pub fn input_audio(part: &Value) -> Result<Vec<u8>, RequestError> {
    let audio = part
        .get("input_audio")
        .ok_or_else(|| RequestError::invalid("input_audio part without data"))?;
    let data = audio.get("data").and_then(Value::as_str).unwrap_or("");
    let format = audio.get("format").and_then(Value::as_str).unwrap_or("");
    media::decode_input_audio(data, format, MAX_MEDIA_BYTES)
        .map_err(|e| RequestError::invalid(format!("invalid audio: {e}")))
}

fn check_image_bytes(bytes: &[u8]) -> Result<(), RequestError> {
    match media::detect(bytes) {
        Ok(media::MediaFormat::Image(_)) => Ok(()),
        _ => Err(RequestError::invalid(
            "invalid image: the data is not a PNG, JPEG, WebP or GIF image",
        )),
    }
}

/// Reads message content: a string, or OpenAI content parts (text parts joined; image and
/// audio parts decoded and counted).
fn content_text(
    content: &Option<Value>,
    attachments: &mut Attachments,
) -> Result<String, RequestError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "text" | "input_text" => {
                        text.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""));
                    }
                    "image_url" => {
                        let url = part
                            .get("image_url")
                            .and_then(|u| u.get("url").or(Some(u)))
                            .and_then(Value::as_str)
                            .ok_or_else(|| RequestError::invalid("image_url part without a url"))?;
                        // The image's place among the text parts.
                        text.push_str(&attachments.add_image(image_url(url)?));
                    }
                    "input_audio" => {
                        // The clip's place among the text parts.
                        text.push_str(&attachments.add_audio(input_audio(part)?));
                    }
                    other => {
                        return Err(RequestError::invalid(format!(
                            "unsupported content part type `{other}`"
                        )));
                    }
                }
            }
            Ok(text)
        }
        Some(other) => Err(RequestError::invalid(format!(
            "message content must be a string or a list of parts, got {other}"
        ))),
    }
}

/// Converts request messages to template messages, checking attached media.
pub fn to_template_messages(
    messages: &[ChatMessage],
    attachments: &mut Attachments,
) -> Result<Vec<Message>, RequestError> {
    messages
        .iter()
        .map(|m| {
            if m.role.is_empty() {
                return Err(RequestError::invalid("every message needs a role"));
            }
            // An Ollama message's images come before its text, as Ollama places them.
            let mut content = String::new();
            for image in m.images.iter().flatten() {
                content.push_str(&attachments.add_image(image_base64(image)?));
            }
            content.push_str(&content_text(&m.content, attachments)?);
            let mut message = Message::new(m.role.clone(), content);
            message.reasoning_content = m.thinking.clone().or_else(|| m.reasoning_content.clone());
            message.name = m.name.clone().or_else(|| m.tool_name.clone());
            message.tool_call_id = m.tool_call_id.clone();
            for call in m.tool_calls.iter().flatten() {
                let function = call.get("function").unwrap_or(call);
                let name = function
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| RequestError::invalid("a tool call without a function name"))?;
                let arguments = match function.get("arguments") {
                    // OpenAI sends arguments as a JSON string.
                    Some(Value::String(s)) => {
                        serde_json::from_str(s).unwrap_or(Value::String(s.clone()))
                    }
                    Some(v) => v.clone(),
                    None => Value::Object(Default::default()),
                };
                message
                    .tool_calls
                    .push(MessageToolCall::new(name, arguments));
            }
            Ok(message)
        })
        .collect()
}

/// A rendered, tokenized prompt and how to parse the model's answer.
pub struct RenderedPrompt {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// Output parser settings.
    pub parser: Option<ParserConfig>,
    /// Where the last message's turn starts, when there are earlier ones: a restore point for
    /// the prefix cache, so a regenerated or edited last turn resumes there.
    pub turn_starts: Vec<usize>,
    /// The images in the prompt, in order, ready for the engine.
    pub images: Vec<PromptMedia>,
}

/// Renders `messages` with the model's template and tokenizes the result, with the model's
/// default system prompt when the conversation has none; the `[img-N]` tags in the messages
/// become `images[N]` in the model's layout (see [`images`]).
///
/// `tools` reach the prompt whatever the template: through it where it renders them
/// ([`ToolFormat::Template`]), else written into the system turn by
/// [`tokenizer::tool_messages`], in Hermes' words for a family that writes Hermes calls, in
/// the generic format (whose calls the parser reads as [`ToolCallFormat::Generic`]) for any
/// other.
pub fn render_chat(
    info: &ModelInfo,
    mut messages: Vec<Message>,
    tools: Option<&[Value]>,
    think: Option<bool>,
    images: &[Arc<[u8]>],
) -> Result<RenderedPrompt, RequestError> {
    if let Some(system) = &info.manifest.system
        && !messages.iter().any(|m| m.role == "system")
    {
        messages.insert(0, Message::new("system", system.clone()));
    }
    let offered = tools.filter(|t| !t.is_empty());
    // The template is handed only tools it shows; others are written into the messages.
    let tools = offered.filter(|_| info.tool_format == ToolFormat::Template);
    if let Some(offered) = offered.filter(|_| tools.is_none()) {
        messages = tokenizer::tool_messages(info.tool_format, &messages, offered);
    }
    let options = RenderOptions {
        add_generation_prompt: true,
        enable_thinking: think,
        ..RenderOptions::default()
    };
    let rendered = info
        .template
        .render_reporting(&messages, tools, &options)
        .map_err(|e| RequestError::invalid(format!("rendering the chat template: {e}")))?;
    // Where a mid-conversation system message went depends on the template: say which.
    if let Some(placement) = rendered.late_system {
        tracing::info!(model = %info.name, "mid-conversation system messages {placement}");
    }
    let text = rendered.text;
    // The template writes the special tokens itself (BOS included) as text.
    let (tokens, prompt_images, clips) = tokenize_with_images(info, &text, images, false)?;
    let family_config = info.family.map(|family| family.parser_config());
    let parser = match (family_config, offered.map(|_| info.tool_format)) {
        (config, Some(ToolFormat::Generic)) => Some(ParserConfig {
            tool_calls: ToolCallFormat::Generic,
            ..config.unwrap_or_default()
        }),
        (Some(config), Some(_)) => Some(config),
        (Some(config), None) => Some(config.without_tools()),
        (None, _) => None,
    }
    .map(|config| {
        let config = config.with_think(think.unwrap_or(true));
        let opens = config.prompt_opens_thinking(&text);
        config.starting_in_thinking(opens)
    });
    let turn_starts = last_turn_start(info, &messages, tools, &options, &tokens, images, &clips)
        .into_iter()
        .collect();
    Ok(RenderedPrompt {
        tokens,
        parser,
        turn_starts,
        images: prompt_images,
    })
}

/// The segments of each audio clip a prompt shows, by media index.
type Clips = HashMap<usize, Vec<audio::Segment>>;

/// Tokenizes `text` (adding the model's BOS with `add_special`); with `images`, its `[img-N]`
/// tags expanded and the media prepared (the audio clips' segments returned for reuse).
fn tokenize_with_images(
    info: &ModelInfo,
    text: &str,
    images: &[Arc<[u8]>],
    add_special: bool,
) -> Result<(Vec<u32>, Vec<PromptMedia>, Clips), RequestError> {
    if images.is_empty() {
        return Ok((encode(info, text, add_special)?, Vec::new(), Clips::new()));
    }
    let expanded = images::expand(info, text, images, add_special, &Clips::new())?;
    let prepared = images::prepare(info, &expanded, images)?;
    Ok((expanded.tokens, prepared, expanded.audio))
}

/// The offset where the last message begins: the tokens the conversation without it shares
/// with the whole prompt. `None` for a single message or when the earlier part does not render.
fn last_turn_start(
    info: &ModelInfo,
    messages: &[Message],
    tools: Option<&[Value]>,
    options: &RenderOptions,
    tokens: &[u32],
    images: &[Arc<[u8]>],
    clips: &Clips,
) -> Option<usize> {
    let (_, earlier) = messages.split_last()?;
    if earlier.is_empty() {
        return None;
    }
    let options = RenderOptions {
        add_generation_prompt: false,
        ..options.clone()
    };
    let text = info.template.render(earlier, tools, &options).ok()?;
    let head = match images {
        [] => info.tokenizer.encode(&text, false).ok()?,
        // The clips were cut for the whole prompt already: not decoded again.
        _ => {
            images::expand(info, &text, images, false, clips)
                .ok()?
                .tokens
        }
    };
    let shared = head.iter().zip(tokens).take_while(|(a, b)| a == b).count();
    (shared > 0).then_some(shared)
}

/// Tokenizes raw text (no template), adding the model's BOS as configured; its `[img-N]` tags
/// become `images[N]` in the model's layout.
pub fn render_raw(
    info: &ModelInfo,
    text: &str,
    images: &[Arc<[u8]>],
) -> Result<RenderedPrompt, RequestError> {
    if images.is_empty() {
        let tokens = encode(info, text, true)?;
        return Ok(RenderedPrompt {
            tokens,
            parser: None,
            turn_starts: Vec::new(),
            images: Vec::new(),
        });
    }
    let (tokens, prompt_images, _) = tokenize_with_images(info, text, images, true)?;
    Ok(RenderedPrompt {
        tokens,
        parser: None,
        turn_starts: Vec::new(),
        images: prompt_images,
    })
}

/// The prompt for Ollama's `suffix`: fill in what goes between `prefix` and `suffix`, for a
/// model whose vocabulary has fill-in-the-middle markers; others are refused, as Ollama does.
pub fn render_infill(
    info: &ModelInfo,
    prefix: &str,
    suffix: &str,
) -> Result<RenderedPrompt, RequestError> {
    let markers = tokenizer::FillInMiddle::of(&info.tokenizer).ok_or_else(|| {
        RequestError::refused(format!(
            "`{}` does not support insert (`suffix`): its vocabulary has no \
             fill-in-the-middle tokens",
            info.name
        ))
    })?;
    check_bytes(info, prefix.len() + suffix.len())?;
    let tokens = markers
        .prompt(&info.tokenizer, prefix, suffix)
        .map_err(|e| RequestError::invalid(format!("tokenizing the prompt: {e}")))?;
    Ok(RenderedPrompt {
        tokens,
        parser: None,
        turn_starts: Vec::new(),
        images: Vec::new(),
    })
}

/// How many prompts are rendered and tokenized at once, off the async runtime.
fn render_permits() -> &'static tokio::sync::Semaphore {
    static PERMITS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    PERMITS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        tokio::sync::Semaphore::new(cores.max(2))
    })
}

/// Runs `work` (rendering a template, tokenizing: CPU-bound, up to seconds for a huge prompt)
/// on the blocking pool, at most one per core at a time, so the runtime's threads keep
/// answering every other request meanwhile.
pub async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, RequestError> + Send + 'static,
) -> Result<T, RequestError> {
    let _permit = render_permits()
        .acquire()
        .await
        .map_err(|_| RequestError::internal("the prompt pool is closed"))?;
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| RequestError::task_failed("preparing the prompt", &e))?
}

/// Refuses a prompt that leaves no room to generate within the context.
pub fn check_context(
    info: &ModelInfo,
    tokens: &[u32],
    num_ctx: Option<usize>,
) -> Result<(), RequestError> {
    let context = num_ctx
        .map(|n| n.min(info.context_length))
        .unwrap_or(info.context_length);
    if tokens.is_empty() {
        return Err(RequestError::invalid("the prompt is empty"));
    }
    if tokens.len() >= context {
        return Err(RequestError::refused(format!(
            "the prompt is {} tokens, more than the context of {context} tokens allows",
            tokens.len()
        )));
    }
    Ok(())
}
