//! `Sequence`: one request's state inside the step loop — its caches, the tokens they hold,
//! its output constraint, budget, statistics and event channel.

use std::time::Instant;

use kvcache::LayerCache;
use prefix_trie::{Capture, SessionId};

use crate::engine::job::{Event, Job, Stats, TokenLogprobs};

/// Names a sequence for as long as the model stays loaded; also its sampler slot.
pub type SequenceId = usize;

/// Where a sequence is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Prompt tokens from `cache_len()` on are still to be evaluated.
    Prefilling,
    /// Every prompt token is evaluated; a sampled token is in flight.
    Decoding,
}

/// One request being served.
pub struct Sequence {
    /// Its id (and sampler slot).
    pub id: SequenceId,
    /// The request.
    pub job: Job,
    /// One slot per layer, as the model builds them.
    pub caches: Vec<Option<LayerCache>>,
    /// The tokens whose state the caches hold, in order: the prompt's evaluated part, then
    /// every generated token that was fed back.
    pub tokens: Vec<u32>,
    /// The prefix trie's session for this request, when it has one.
    pub trie_session: Option<SessionId>,
    /// Prefill or decode.
    pub phase: Phase,
    /// The most tokens it may generate (the job's, held to the context).
    pub budget: usize,
    /// Counts and timings so far.
    pub stats: Stats,
    /// When it was admitted.
    pub admitted: Instant,
    /// When its first token was read.
    pub first_token: Option<Instant>,
    /// Captures taken from its caches so far, for the trie at retirement.
    pub captures: Vec<Capture<kvcache::LayerSnapshot>>,
}

impl Sequence {
    /// Tokens the caches hold.
    pub fn cache_len(&self) -> usize {
        self.tokens.len()
    }

    /// Prompt tokens still to evaluate.
    pub fn prompt_left(&self) -> usize {
        self.job.prompt.len().saturating_sub(self.tokens.len())
    }

    /// Whether it should stop: cancelled by the caller or nobody listens.
    pub fn cancelled(&self) -> bool {
        self.job.cancelled()
    }

    /// Whether generating one more token after the one in flight is allowed.
    pub fn may_continue(&self) -> bool {
        self.stats.generated_tokens + 1 < self.budget
    }

    /// Streams a generated token; `false` when the client is gone.
    pub fn send_token(&self, id: u32, logprobs: Option<TokenLogprobs>) -> bool {
        self.job.events.send(Event::Token { id, logprobs }).is_ok()
    }

    /// Moves the captures its caches recorded since the schedule was set into `captures`.
    pub fn collect_captures(&mut self) {
        for (layer, cache) in self.caches.iter_mut().enumerate() {
            if let Some(cache) = cache {
                for (_, snapshot) in cache.take_captures() {
                    self.captures.push(Capture { layer, snapshot });
                }
            }
        }
    }
}
