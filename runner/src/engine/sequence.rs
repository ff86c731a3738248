//! `Sequence`: one request's state inside the step loop — its caches, the tokens they hold,
//! its output constraint, budget, statistics and event channel.

use std::time::Instant;

use kvcache::{LayerCache, LayerSnapshot};
use mlx::Array;
use prefix_trie::{Capture, SessionId};

use crate::engine::head_states::HeadStates;
use crate::engine::job::{DoneReason, Event, Job, Stats, TokenLogprobs};
use crate::engine::speculating::Speculating;

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
    pub captures: Vec<Capture<LayerSnapshot>>,
    /// Its drafter and round state, when it decodes speculatively.
    pub speculating: Option<Speculating>,
    /// How far the rotary position of its next token is from its cache position
    /// (`nn::Vision::rope_delta` of `tokens`): 0 but after an image of a family with
    /// multimodal rotary positions (Qwen2.5-VL). Every forward over its caches carries it
    /// (`nn::Batch::rope_deltas`); only images change it, so generated text and rolled-back
    /// drafts leave it as it is.
    pub rope_delta: i64,
    /// The target's final states its drafter has not read, when it speculates with one that
    /// reads them (`mtp`, an assistant); empty otherwise.
    pub head_states: HeadStates,
}

impl Sequence {
    /// Whether it drafts with a drafter that reads the target's final states (`mtp`, an
    /// assistant): only then are they kept ([`Sequence::keep_head_states`]), so other
    /// sequences pay nothing.
    pub fn wants_head_states(&self) -> bool {
        self.speculating
            .as_ref()
            .is_some_and(|spec| spec.reads_target_states)
    }

    /// Keeps `rows` (`[1, r, hidden]`, the target's final states at `position..`) for its
    /// drafter head, when it [wants them](Sequence::wants_head_states); otherwise does nothing.
    pub fn keep_head_states(&mut self, position: usize, rows: Array) -> mlx::Result<()> {
        if self.wants_head_states() {
            self.head_states.push(position, rows)?;
        }
        Ok(())
    }

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

    /// Whether it may generate another token after the ones delivered so far.
    pub fn has_budget(&self) -> bool {
        self.stats.generated_tokens < self.budget
    }

    /// Hands a generated token over, read at `now`: a stop token ends the sequence unstreamed;
    /// otherwise the grammar consumes it, it is counted and streamed.
    pub fn deliver(
        &mut self,
        token: u32,
        logprobs: Option<TokenLogprobs>,
        now: Instant,
    ) -> Option<Outcome> {
        if self.first_token.is_none() {
            self.first_token = Some(now);
            self.stats.prompt_eval = now - self.admitted;
        }
        if self.job.stop_tokens.contains(&token) {
            return Some(Outcome::Done(DoneReason::Stop));
        }
        if let Some(grammar) = self.job.grammar.as_mut()
            && let Err(e) = grammar.consume(token)
        {
            return Some(Outcome::Failed(format!("structured output: {e}")));
        }
        self.stats.generated_tokens += 1;
        let sent = self.job.events.send(Event::Token {
            id: token,
            logprobs,
        });
        sent.is_err()
            .then_some(Outcome::Done(DoneReason::Cancelled))
    }

    /// Moves the captures its caches recorded since the schedule was set into `captures`.
    pub fn collect_captures(&mut self) {
        let taken = take_captures(&mut self.caches);
        self.captures.extend(taken);
    }
}

/// How a sequence ends.
pub enum Outcome {
    /// It finished or was cancelled; its caches go to the prefix trie.
    Done(DoneReason),
    /// It failed; its caches are not trusted.
    Failed(String),
}

/// The captures `caches` recorded since their schedule was set, each with its layer.
pub fn take_captures(caches: &mut [Option<LayerCache>]) -> Vec<Capture<LayerSnapshot>> {
    let mut captures = Vec::new();
    for (layer, cache) in caches.iter_mut().enumerate() {
        if let Some(cache) = cache {
            for (_, snapshot) in cache.take_captures() {
                captures.push(Capture { layer, snapshot });
            }
        }
    }
    captures
}
