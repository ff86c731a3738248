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

use crate::engine::{DrafterKind, ModelInfo, Speculation};
use crate::model_keeper::Lease;
use crate::server::generation::{self, Output, Prepared};
use crate::server::loosened;
use crate::server::options::GenerationOptions;
use crate::server::prompt::{self, RenderedPrompt};
use crate::server::request_error::RequestError;
use crate::server::requested_shape::Requested;
use crate::server::structured;

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

/// The most choices one request may ask for (OpenAI's `n`): each is a row of the engine's
/// batch, and a request should not fill the batch alone.
pub const MAX_CHOICES: usize = 16;

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

/// Generations of one prompt started together (OpenAI's `n` choices).
pub struct StartedChoices {
    /// Each choice's outputs, by choice index; dropping one cancels that choice.
    pub outputs: Vec<Receiver<Output>>,
    /// The prompt's length in tokens (once: the choices share it).
    pub prompt_tokens: usize,
    /// Where the request's schemas were loosened to compile (the choices share them).
    pub loosened: Vec<String>,
}

/// Builds `request` into a job and starts it on the leased model.
pub async fn start(lease: Lease, request: GenerationRequest) -> Result<Started, RequestError> {
    let started = start_choices(lease, request, 1).await?;
    let outputs = started
        .outputs
        .into_iter()
        .next()
        .ok_or_else(|| RequestError::internal("no generation was started"))?;
    Ok(Started {
        outputs,
        prompt_tokens: started.prompt_tokens,
        loosened: started.loosened,
    })
}

/// Builds `request` into `choices` jobs (at least one) on the leased model, submitted together
/// so they run as rows of the engine's batch: the prompt is rendered once, each job samples on
/// its own. With a seed, choice 0 keeps it and choice `i` draws with a seed derived from it,
/// so the choices differ and a rerun repeats them; without one each draws its own.
pub async fn start_choices(
    lease: Lease,
    request: GenerationRequest,
    choices: usize,
) -> Result<StartedChoices, RequestError> {
    let info = Arc::clone(&lease.info);
    check_drafter(&info, request.options.speculation)?;
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
    let prompt_tokens = rendered.tokens.len();
    let lease = Arc::new(lease);
    let mut loosened = Vec::new();
    let mut outputs = Vec::with_capacity(choices.max(1));
    for choice in 0..choices.max(1) {
        // A grammar is a matcher positioned in one output: each choice compiles its own.
        let (grammar, notes) =
            structured::prepare(&info, &request.requested, rendered.parser.as_ref()).await?;
        if choice == 0 {
            loosened::record(&notes);
            loosened = notes;
        }
        let mut options = request.options.clone();
        options.sampling.seed = options.sampling.seed.map(|seed| choice_seed(seed, choice));
        // An error here drops the choices already started, which cancels them.
        outputs.push(generation::start(
            Arc::clone(&lease),
            Prepared {
                prompt: rendered.tokens.clone(),
                options,
                logprobs: request.logprobs,
                parser: rendered.parser.clone(),
                grammar,
                turn_starts: rendered.turn_starts.clone(),
                images: rendered.images.clone(),
                started: request.started,
                load: request.load,
            },
        )?);
    }
    Ok(StartedChoices {
        outputs,
        prompt_tokens,
        loosened,
    })
}

/// Refuses a drafter the model cannot serve before anything starts: the head drafter of a
/// checkpoint that ships none.
fn check_drafter(info: &ModelInfo, speculation: Speculation) -> Result<(), RequestError> {
    match speculation {
        Speculation::On {
            drafter: DrafterKind::Mtp,
            ..
        } if !info.draft_head => Err(RequestError::invalid(format!(
            "option `draft`: `mtp` drafts with a multi-token-prediction head, and `{}` ships \
             none",
            info.name
        ))),
        _ => Ok(()),
    }
}

/// The seed choice `choice` of a seeded request draws with: the request's own for choice 0
/// (one choice samples as it always did), a SplitMix64 mix of it and the index after, so
/// neighbouring seeds and indices do not give overlapping streams.
fn choice_seed(seed: u64, choice: usize) -> u64 {
    if choice == 0 {
        return seed;
    }
    let mut z = seed.wrapping_add((choice as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_seeds_keep_the_first_and_differ_for_the_rest() {
        assert_eq!(choice_seed(42, 0), 42);
        let seeds: std::collections::BTreeSet<u64> =
            (0..MAX_CHOICES).map(|i| choice_seed(42, i)).collect();
        assert_eq!(seeds.len(), MAX_CHOICES);
        assert_eq!(choice_seed(42, 3), choice_seed(42, 3));
        assert_ne!(choice_seed(42, 1), choice_seed(43, 1));
        assert_ne!(choice_seed(42, 1), 43);
    }
}
