//! The path every chat-shaped request takes once its API's fields are read (OpenAI's chat
//! completions and Responses, Anthropic's Messages): render the conversation off the runtime,
//! hold it to the context, compile its output constraint, start it on the engine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenizer::Message;
use tokio::sync::mpsc::Receiver;

use crate::model_keeper::Lease;
use crate::server::error::ApiError;
use crate::server::generation::{self, Output, Prepared};
use crate::server::options::GenerationOptions;
use crate::server::prompt;
use crate::server::structured::{self, Requested};

/// A conversation to continue, with everything its request asked.
pub struct ChatJob {
    /// The turns, in order.
    pub messages: Vec<Message>,
    /// The images their `[img-N]` tags name.
    pub images: Vec<Arc<[u8]>>,
    /// The output's shape: format, tools (also rendered into the prompt), tool choice.
    pub requested: Requested,
    /// Whether the model should think first (`None`: its template's default).
    pub think: Option<bool>,
    /// Validated options.
    pub options: GenerationOptions,
    /// Top logprobs per token, when asked.
    pub logprobs: Option<usize>,
    /// When the request arrived.
    pub started: Instant,
    /// Time spent loading the model for it.
    pub load: Duration,
}

/// Starts `job` on the leased model; returns its outputs and the prompt's length in tokens.
/// Errors are in Ollama's shape: callers put them in their API's.
pub async fn start(lease: Lease, job: ChatJob) -> Result<(Receiver<Output>, usize), ApiError> {
    let info = lease.info.clone();
    let rendered = prompt::off_runtime({
        let (info, messages, tools) = (info.clone(), job.messages, job.requested.tools.clone());
        let (think, images) = (job.think, job.images);
        move || prompt::render_chat(&info, messages, Some(tools.as_slice()), think, &images)
    })
    .await?;
    prompt::check_context(&info, &rendered.tokens, job.options.num_ctx)?;
    let grammar = structured::prepare(&info, &job.requested, rendered.parser.as_ref()).await?;
    let prompt_tokens = rendered.tokens.len();
    let outputs = generation::start(
        lease,
        Prepared {
            prompt: rendered.tokens,
            options: job.options,
            logprobs: job.logprobs,
            parser: rendered.parser,
            grammar,
            turn_starts: rendered.turn_starts,
            images: rendered.images,
            started: job.started,
            load: job.load,
        },
    )?;
    Ok((outputs, prompt_tokens))
}
