//! The request builder: the one path from what a request asked to a job on the engine, taken
//! by every API (Ollama's generate and chat, OpenAI's chat and text completions and Responses,
//! Anthropic's Messages) and by the CLI's `run` and `bench`. It renders the prompt off the
//! async runtime, holds it to the context, compiles the output constraint and starts the job.
//! Its failures are [`RequestError`]s; each API puts them in its wire format at its edge.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokenizer::Message;
use tokio::sync::mpsc::Receiver;

use crate::engine::ModelInfo;
use crate::model_keeper::Lease;
use crate::server::generation::{self, Output, Prepared};
use crate::server::loosened;
use crate::server::options::GenerationOptions;
use crate::server::prompt::{self, RenderedPrompt};
use crate::server::request_error::RequestError;
use crate::server::structured::{self, Requested};

/// What the prompt is made from.
pub enum PromptSource {
    /// A conversation, rendered with the model's chat template; `think` asks the model to
    /// reason first (`None`: its template's default).
    Chat {
        /// The turns, in order.
        messages: Vec<Message>,
        /// Whether the model should think first.
        think: Option<bool>,
    },
    /// Text tokenized as it is, no template.
    Raw(String),
    /// Ollama's insert: what goes between `prefix` and `suffix`, for a model whose vocabulary
    /// has fill-in-the-middle tokens.
    Infill {
        /// The text before the gap.
        prefix: String,
        /// The text after it.
        suffix: String,
    },
    /// Token ids exactly as given (`mlxkit bench`): not rendered, and not held to the
    /// context, so a benchmark measures the ids it was handed.
    Tokens(Vec<u32>),
}

/// Everything a generation request asked, whichever API it came through.
pub struct GenerationRequest {
    /// What the prompt is made from.
    pub source: PromptSource,
    /// The images and audio clips the prompt's `[img-N]` tags name.
    pub media: Vec<Arc<[u8]>>,
    /// The output's shape: format, tools (also rendered into a chat prompt), tool choice.
    pub requested: Requested,
    /// Validated options.
    pub options: GenerationOptions,
    /// Top logprobs per token, when asked.
    pub logprobs: Option<usize>,
    /// When the request arrived.
    pub started: Instant,
    /// Time spent loading the model for it.
    pub load: Duration,
}

/// A started generation.
pub struct Started {
    /// Its outputs, in order; dropping the receiver cancels it at its next step.
    pub outputs: Receiver<Output>,
    /// The prompt's length in tokens.
    pub prompt_tokens: usize,
    /// Where the request's schemas were loosened to compile (also recorded for the
    /// response's `x-mlxkit-schema-loosened` header, see `server::loosened`).
    pub loosened: Vec<String>,
}

/// Builds `request` into a job and starts it on the leased model.
pub async fn start(lease: Lease, request: GenerationRequest) -> Result<Started, RequestError> {
    let info = Arc::clone(&lease.info);
    let checks_context = !matches!(request.source, PromptSource::Tokens(_));
    let rendered = render(
        &info,
        request.source,
        &request.requested.tools,
        request.media,
    )
    .await?;
    if checks_context {
        prompt::check_context(&info, &rendered.tokens, request.options.num_ctx)?;
    }
    let (grammar, loosened) =
        structured::prepare(&info, &request.requested, rendered.parser.as_ref()).await?;
    loosened::record(&loosened);
    let prompt_tokens = rendered.tokens.len();
    let outputs = generation::start(
        lease,
        Prepared {
            prompt: rendered.tokens,
            options: request.options,
            logprobs: request.logprobs,
            parser: rendered.parser,
            grammar,
            turn_starts: rendered.turn_starts,
            images: rendered.images,
            started: request.started,
            load: request.load,
        },
    )?;
    Ok(Started {
        outputs,
        prompt_tokens,
        loosened,
    })
}

/// Renders and tokenizes `source` for the model on the blocking pool (templates and
/// tokenizing are CPU work, seconds for a huge prompt); `tools` are rendered into a chat.
pub async fn render(
    info: &Arc<ModelInfo>,
    source: PromptSource,
    tools: &[Value],
    media: Vec<Arc<[u8]>>,
) -> Result<RenderedPrompt, RequestError> {
    let info = Arc::clone(info);
    let tools = tools.to_vec();
    prompt::off_runtime(move || match source {
        PromptSource::Chat { messages, think } => {
            prompt::render_chat(&info, messages, Some(tools.as_slice()), think, &media)
        }
        PromptSource::Raw(text) => prompt::render_raw(&info, &text, &media),
        PromptSource::Infill { prefix, suffix } => {
            if !media.is_empty() {
                return Err(RequestError::invalid(
                    "images cannot be combined with `suffix` (insert)",
                ));
            }
            prompt::render_infill(&info, &prefix, &suffix)
        }
        PromptSource::Tokens(tokens) => Ok(RenderedPrompt {
            tokens,
            parser: None,
            turn_starts: Vec::new(),
            images: Vec::new(),
        }),
    })
    .await
}
