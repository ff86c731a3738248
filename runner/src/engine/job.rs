//! What a generation asks of the engine and what it streams back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

/// One generation: an already tokenized prompt and how to continue it.
pub struct Job {
    /// Prompt token ids (chat template applied, special tokens included).
    pub prompt: Vec<u32>,
    /// Sampling options for this request.
    pub sampling: sampler::Options,
    /// The most tokens to generate.
    pub max_tokens: usize,
    /// Token ids that end generation (EOS and end-of-turn tokens); not streamed.
    pub stop_tokens: Vec<u32>,
    /// The constraint every sampled token must satisfy (structured output), at the start of
    /// the output. Its end tokens must be `stop_tokens`: it allows them only when complete.
    pub grammar: Option<grammar::Grammar>,
    /// Prompt offsets where a conversation turn starts (the last user message, say): the
    /// prefix cache keeps restore points there, so an edited or regenerated turn resumes.
    pub turn_starts: Vec<usize>,
    /// Where tokens and the final summary go. The job stops at its next step once the
    /// receiver is dropped (the client went away).
    pub events: UnboundedSender<Event>,
    /// Set by the caller to stop the job at its next step (a stop string matched); the job
    /// still reports `Done` with its statistics.
    pub cancel: Arc<AtomicBool>,
}

impl Job {
    /// Whether the job should stop: cancelled, or nobody is listening.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.events.is_closed()
    }
}

/// The logprob of one generated token and its best alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The chosen token's logprob.
    pub logprob: f32,
    /// The most likely tokens, most likely first, with their logprobs.
    pub top: Vec<(u32, f32)>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoneReason {
    /// The model produced a stop token (or a stop string matched, decided by the caller).
    Stop,
    /// The token budget or the context ran out.
    Length,
    /// The client went away.
    Cancelled,
}

impl DoneReason {
    /// The name APIs report (`stop`, `length`).
    pub fn as_str(self) -> &'static str {
        match self {
            DoneReason::Stop => "stop",
            DoneReason::Length => "length",
            DoneReason::Cancelled => "cancelled",
        }
    }
}

/// Timings and counts of one generation, as Ollama reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache (not evaluated).
    pub cached_tokens: usize,
    /// Time evaluating the rest of the prompt.
    pub prompt_eval: Duration,
    /// Generated tokens.
    pub generated_tokens: usize,
    /// Time generating them (from the first decode step to the last token read).
    pub eval: Duration,
    /// Peak MLX memory during the job, bytes.
    pub peak_memory: usize,
}

impl Stats {
    /// Prompt tokens actually evaluated.
    pub fn prompt_eval_count(&self) -> usize {
        self.prompt_tokens - self.cached_tokens
    }
}

/// What a job streams.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A generated token.
    Token {
        /// Its id.
        id: u32,
        /// Its logprobs, when asked for.
        logprobs: Option<TokenLogprobs>,
    },
    /// The job finished.
    Done {
        /// Why.
        reason: DoneReason,
        /// Counts and timings.
        stats: Stats,
    },
    /// The job failed (or the engine did); nothing follows.
    Failed(String),
}
