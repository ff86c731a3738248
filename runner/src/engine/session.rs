//! `Session`: a loaded model with its live caches, and the prefill/decode loop that runs a job.
//!
//! The caches outlive a job: the next job rewinds them to the longest prefix it shares with
//! what they hold and prefills only the rest. A job cancelled during prefill keeps every chunk
//! it finished, so a client that times out and retries resumes where it stopped.

use std::time::Instant;

use kvcache::LayerCache;
use mlx::{Array, Dtype};
use nn::{Batch, Model};
use sampler::Sampler;

use crate::engine::job::{DoneReason, Event, Job, Stats, TokenLogprobs};

/// Prompt tokens evaluated per forward while prefilling. Smaller chunks bound the attention
/// scratch memory and let cancellation land sooner; larger ones amortize per-forward overhead.
pub const PREFILL_CHUNK: usize = 512;

/// MLX's buffer pool is released whenever generation crosses a multiple of this many tokens.
const CLEAR_CACHE_EVERY: usize = 256;

/// The sampler slot a session decodes with.
const SLOT: usize = 0;

/// Stands in `Session::cached` for a token whose forward was dispatched before the host read
/// it; no vocabulary is this large.
const UNREAD: u32 = u32::MAX;

/// What went wrong while running a job.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The model failed.
    #[error(transparent)]
    Model(#[from] nn::Error),
    /// MLX failed.
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
    /// The sampler refused the options or failed.
    #[error(transparent)]
    Sampler(#[from] sampler::Error),
    /// The caches failed.
    #[error(transparent)]
    Cache(#[from] kvcache::Error),
    /// The output constraint failed (a matcher error; a sampled token is always allowed).
    #[error("structured output: {0}")]
    Grammar(#[from] grammar::Error),
    /// The prompt cannot be run.
    #[error("{0}")]
    Invalid(String),
}

type Result<T> = std::result::Result<T, SessionError>;

/// A loaded model and what its caches hold.
pub struct Session {
    model: Box<dyn Model>,
    context_length: usize,
    caches: Vec<Option<LayerCache>>,
    /// The tokens whose keys and values the caches hold, in order.
    cached: Vec<u32>,
    sampler: Sampler,
}

impl Session {
    /// A session over `model` with empty caches.
    pub fn new(model: Box<dyn Model>, context_length: usize) -> Result<Session> {
        let caches = model.new_caches()?;
        Ok(Session {
            model,
            context_length,
            caches,
            cached: Vec::new(),
            sampler: Sampler::new(),
        })
    }

    /// The model.
    pub fn model(&self) -> &dyn Model {
        self.model.as_ref()
    }

    /// Runs `job`, streaming its tokens; errors are reported through the job's channel too.
    pub fn run(&mut self, job: Job) {
        let events = job.events.clone();
        let outcome = self.generate(job);
        // The sampler slot and MLX's pool are released whatever happened.
        let _ = self.sampler.remove(SLOT);
        let _ = mlx::memory::clear_cache();
        match outcome {
            Ok((reason, stats)) => {
                let _ = events.send(Event::Done { reason, stats });
            }
            Err(e) => {
                // A failed forward may leave the caches half-written: start clean next time.
                self.reset();
                let _ = events.send(Event::Failed(e.to_string()));
            }
        }
    }

    /// Forgets everything the caches hold.
    pub fn reset(&mut self) {
        self.cached.clear();
        match self.model.new_caches() {
            Ok(caches) => self.caches = caches,
            // Building empty caches succeeded at load and depends only on the config; if it
            // ever fails, dropping the old ones still leaves nothing stale behind.
            Err(_) => self.caches.iter_mut().for_each(|c| *c = None),
        }
    }

    /// Rewinds the caches to the longest prefix of `prompt` they hold, keeping at least one
    /// prompt token to evaluate (its logits seed decoding). Returns the reused length.
    fn reuse_prefix(&mut self, prompt: &[u32]) -> usize {
        let shared = self
            .cached
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len().saturating_sub(1));
        if shared == self.cached.len() {
            return shared;
        }
        let rewound = self
            .caches
            .iter_mut()
            .flatten()
            .try_for_each(|c| c.rewind(shared));
        match rewound {
            Ok(()) => {
                self.cached.truncate(shared);
                shared
            }
            Err(_) => {
                // Some cache kinds cannot rewind this far (a sliding window that already dropped
                // the keys): recompute from the start.
                self.reset();
                0
            }
        }
    }

    /// Runs the model over `tokens` (a host slice) and appends them to the caches.
    fn forward(&mut self, tokens: &[u32]) -> Result<Array> {
        let batch = Batch::single(tokens, self.cached.len())?;
        let out = self.model.forward(&batch, &mut self.caches)?;
        self.cached.extend_from_slice(tokens);
        Ok(out.hidden)
    }

    fn generate(&mut self, mut job: Job) -> Result<(DoneReason, Stats)> {
        let start = Instant::now();
        mlx::memory::reset_peak_memory()?;
        let prompt = &job.prompt;
        if prompt.is_empty() {
            return Err(SessionError::Invalid("the prompt is empty".into()));
        }
        if prompt.len() >= self.context_length {
            return Err(SessionError::Invalid(format!(
                "the prompt is {} tokens, the model's context is {}",
                prompt.len(),
                self.context_length
            )));
        }
        let mut stats = Stats {
            prompt_tokens: prompt.len(),
            ..Stats::default()
        };
        stats.cached_tokens = self.reuse_prefix(prompt);

        // Prefill in chunks. The last chunk ends with the prompt's last token, whose hidden
        // state seeds decoding: a short prompt is one forward, not a prompt forward plus a
        // single-token one (on a CPU, each forward reads every weight once more).
        let seed_hidden = loop {
            if job.cancelled() {
                stats.prompt_eval = start.elapsed();
                return Ok((DoneReason::Cancelled, stats));
            }
            let from = self.cached.len();
            let to = (from + PREFILL_CHUNK).min(prompt.len());
            let hidden = self.forward(&prompt[from..to])?;
            if to == prompt.len() {
                break hidden;
            }
            // Sliding-window caches attend a gathered copy while prefilling, so their ring
            // writes are not inputs of `hidden`: evaluate the cache state explicitly.
            let mut arrays = vec![hidden];
            arrays.extend(
                self.caches
                    .iter()
                    .flatten()
                    .flat_map(LayerCache::state_arrays),
            );
            mlx::eval(&arrays)?;
            mlx::memory::clear_cache()?;
        };

        self.sampler.add(SLOT, job.sampling.clone(), prompt)?;
        let want_logprobs = job.sampling.logprobs;
        let budget = job.max_tokens.min(self.context_length - prompt.len());
        if budget == 0 {
            stats.prompt_eval = start.elapsed();
            return Ok((DoneReason::Length, stats));
        }

        // Pipelined decode: the forward of token n + 1 is dispatched before the host reads
        // token n, so the device never waits for the host. Unconstrained, its sample is
        // dispatched too; under a grammar the sample needs the mask that token n leads to,
        // which the host computes while the device runs the forward.
        let mut grammar = job.grammar.take();
        let seed_logits = self.logits(&seed_hidden)?;
        if grammar.is_some() {
            // The prompt's last forward runs while the first mask is computed.
            mlx::async_eval([&seed_logits])?;
        }
        let mut pending = self.sample(&seed_logits, grammar.as_mut())?;
        mlx::async_eval([&pending.tokens])?;
        let mut prompt_done: Option<Instant> = None;
        let decode_start = Instant::now();
        let mut reason = DoneReason::Length;
        while stats.generated_tokens < budget {
            let next_logits = if stats.generated_tokens + 1 < budget && !job.cancelled() {
                Some(self.forward_unread(&pending.tokens)?)
            } else {
                None
            };
            let mut next = None;
            if let Some(logits) = &next_logits {
                if grammar.is_none() {
                    let sampled = self.sample(logits, None)?;
                    mlx::async_eval([&sampled.tokens])?;
                    next = Some(sampled);
                } else {
                    mlx::async_eval([logits])?;
                }
            }
            let token = pending
                .tokens
                .to_vec::<u32>()?
                .first()
                .copied()
                .unwrap_or(UNREAD);
            if next_logits.is_some() {
                self.record_last(token);
            }
            if prompt_done.is_none() {
                prompt_done = Some(Instant::now());
                stats.prompt_eval = start.elapsed();
            }
            if job.stop_tokens.contains(&token) {
                reason = DoneReason::Stop;
                break;
            }
            if let Some(grammar) = grammar.as_mut() {
                grammar.consume(token)?;
            }
            let logprobs = match (&pending.logprobs, want_logprobs) {
                (Some(lp), Some(top)) => Some(read_logprobs(lp, top)?),
                _ => None,
            };
            stats.generated_tokens += 1;
            if job
                .events
                .send(Event::Token {
                    id: token,
                    logprobs,
                })
                .is_err()
            {
                reason = DoneReason::Cancelled;
                break;
            }
            if stats.generated_tokens.is_multiple_of(CLEAR_CACHE_EVERY) {
                mlx::memory::clear_cache()?;
            }
            if let (Some(logits), Some(grammar)) = (&next_logits, grammar.as_mut()) {
                let sampled = self.sample(logits, Some(grammar))?;
                mlx::async_eval([&sampled.tokens])?;
                next = Some(sampled);
            }
            match next {
                Some(next) => pending = next,
                None => {
                    if job.cancelled() {
                        reason = DoneReason::Cancelled;
                    }
                    break;
                }
            }
        }
        stats.eval = prompt_done
            .map(|t| t.elapsed())
            .unwrap_or_else(|| decode_start.elapsed());
        stats.peak_memory = mlx::memory::peak_memory()?;
        Ok((reason, stats))
    }

    /// The forward of the token the previous step sampled, without reading it on the host;
    /// returns the next logits. A placeholder keeps `cached` in step with the caches until
    /// the caller reads the token and records it with [`Session::record_last`].
    fn forward_unread(&mut self, tokens: &Array) -> Result<Array> {
        let batch = Batch {
            tokens: tokens.astype(Dtype::I32)?.reshape(&[1, 1])?,
            positions: vec![self.cached.len()],
        };
        let out = self.model.forward(&batch, &mut self.caches)?;
        self.cached.push(UNREAD);
        self.logits(&out.hidden)
    }

    /// Records the id of the token whose forward [`Session::forward_unread`] dispatched last.
    fn record_last(&mut self, token: u32) {
        if let Some(last) = self.cached.last_mut()
            && *last == UNREAD
        {
            *last = token;
        }
    }

    /// The f32 logits `[1, V]` after the last position of `hidden`.
    fn logits(&self, hidden: &Array) -> Result<Array> {
        let last = hidden.slice_axis(1, -1, hidden.dim(1)?)?;
        Ok(self
            .model
            .unembed(&last)?
            .squeeze(&[1])?
            .astype(Dtype::F32)?)
    }

    /// Samples from `logits`, within what `grammar` allows next when there is one.
    fn sample(
        &mut self,
        logits: &Array,
        grammar: Option<&mut grammar::Grammar>,
    ) -> Result<sampler::Sampled> {
        let Some(grammar) = grammar else {
            return Ok(self.sampler.sample(&[SLOT], logits)?);
        };
        let mut mask = grammar.mask()?;
        // The model may have more output rows than the tokenizer has tokens (padding); the
        // grammar never allows those.
        let width = usize::try_from(logits.dim(1)?).unwrap_or(0);
        if mask.len() < sampler::mask_words(width) {
            mask.resize(sampler::mask_words(width), 0);
        }
        Ok(self
            .sampler
            .sample_masked(&[SLOT], logits, &[Some(mask.as_slice())])?)
    }
}

fn read_logprobs(lp: &sampler::Logprobs, top: usize) -> Result<TokenLogprobs> {
    let logprob = lp
        .chosen
        .to_vec::<f32>()?
        .first()
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    let ids = lp.top_ids.to_vec::<u32>()?;
    let values = lp.top_logprobs.to_vec::<f32>()?;
    Ok(TokenLogprobs {
        logprob,
        top: ids.into_iter().zip(values).take(top).collect(),
    })
}
