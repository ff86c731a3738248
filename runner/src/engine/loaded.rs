//! `LoadedModel`: a loaded model and its step loop over many sequences at once.
//!
//! Each [`LoadedModel::step`]:
//!
//! 1. drops cancelled jobs from the queue and admits waiting ones while their KV fits the
//!    budget: the prefix trie restores each new sequence's caches to its longest cached prefix;
//! 2. gives prefilling sequences prompt chunks under a per-step token budget (smaller while
//!    others decode, so decoding keeps moving behind a long prompt);
//! 3. runs **one batched forward** over every decoding sequence, fed with the tokens sampled
//!    the step before, which the host has not read yet (the device never waits for the host);
//! 4. samples every row — decode rows and sequences whose prefill just ended — in one sampler
//!    call (unconstrained: dispatched before the host reads; under a grammar: after the host
//!    has advanced the matchers);
//! 5. reads the previous step's tokens, streams them and applies stop tokens, budgets and
//!    cancellation;
//! 6. retires finished and cancelled sequences into the prefix trie, so a retry or the next
//!    turn resumes where they stopped.
//!
//! Seams for speculation: a row may carry several tokens (`Batch` rows of any width), caches
//! rewind, and the sampler hands out per-position distributions.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use kvcache::KvStorage;
use mlx::{Array, Dtype};
use nn::{Batch, ImageGrid, Model};
use sampler::{Sampled, Sampler};

use crate::engine::draft_model::{DraftModel, DraftServing};
use crate::engine::drafters::Drafters;
use crate::engine::encoded_media::{self, EncodedIds, EncodedMedia};
use crate::engine::job::{
    DoneReason, DrafterKind, EncoderInput, Event, Job, PromptMedia, Speculation, Stats,
    TokenLogprobs,
};
use crate::engine::memory::{LONG_PREFILL, MemoryBudget};
use crate::engine::prefix_cache::PrefixCache;
use crate::engine::sequence::{Outcome, Phase, Sequence, SequenceId};
use crate::engine::speculation::{self, Controllers, MAX_DRAFT_DEPTH, Speculating};
use crate::engine::step::{
    Pending, Result, Step, StepError, caches_of, equal_width_groups, exact_width_groups,
    last_logits, with_rope_deltas,
};

/// Draft tokens per round when a request names no limit.
const DEFAULT_DRAFT_DEPTH: usize = 8;

/// How the step loop schedules work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopConfig {
    /// Prompt tokens per forward while prefilling. Smaller chunks bound the attention scratch
    /// memory and let cancellation land sooner; larger ones amortize per-forward overhead.
    pub prefill_chunk: usize,
    /// Prompt tokens per step while other sequences decode: the most a long prompt delays
    /// their next token.
    pub prefill_budget_while_decoding: usize,
    /// Prompt tokens per step while nothing decodes: prompts that arrive together are
    /// evaluated in one batched forward, up to this many tokens.
    pub prefill_budget_idle: usize,
    /// Sequences running at once; more wait in the queue.
    pub max_sequences: usize,
    /// Prefix-cache capture interval while prefilling.
    pub capture_interval: usize,
    /// Memory budgets (prefix cache, running KV).
    pub memory: MemoryBudget,
    /// The drafter of requests that do not choose (`--draft`); `None`: plain decoding.
    pub draft: Option<DrafterKind>,
    /// How KV caches store keys and values (`--kv-cache`); `None`: in the dtype the model
    /// computes them in.
    pub kv_storage: Option<KvStorage>,
}

impl LoopConfig {
    /// Defaults, overridable by `MLXKIT_MAX_SEQUENCES`, `MLXKIT_CACHE_BYTES`,
    /// `MLXKIT_KV_BYTES`, `MLXKIT_DRAFT`.
    pub fn from_env() -> LoopConfig {
        let max_sequences = std::env::var("MLXKIT_MAX_SEQUENCES")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(16);
        LoopConfig {
            prefill_chunk: 256,
            prefill_budget_while_decoding: 128,
            prefill_budget_idle: 1024,
            max_sequences,
            capture_interval: crate::engine::prefix_cache::CAPTURE_INTERVAL,
            memory: MemoryBudget::from_env(),
            draft: std::env::var("MLXKIT_DRAFT")
                .ok()
                .and_then(|name| DrafterKind::parse(&name)),
            kv_storage: None,
        }
    }
}

/// Empty caches for one sequence of `model`, rewindable by a draft's depth, storing keys and
/// values as `kv_storage` when given.
fn fresh_caches(
    model: &dyn Model,
    kv_storage: Option<KvStorage>,
) -> Result<Vec<Option<kvcache::LayerCache>>> {
    let mut caches = model.new_caches_rewindable(MAX_DRAFT_DEPTH)?;
    if let Some(storage) = kv_storage {
        for cache in caches.iter_mut().flatten() {
            cache.set_kv_storage(storage)?;
        }
    }
    Ok(caches)
}

/// Checks at load that `model`'s attention layers can be stored as `kv_storage` says, rather
/// than failing its first request: 8-bit codes come in groups of [`kvcache::Q8_GROUP`].
fn check_kv_storage(model: &dyn Model, kv_storage: Option<KvStorage>) -> Result<()> {
    if kv_storage != Some(KvStorage::Q8) {
        return Ok(());
    }
    let group = kvcache::Q8_GROUP as usize;
    for (layer, state) in model.spec().layers.iter().enumerate() {
        if let nn::LayerState::Attention { head_dim, .. } = state
            && head_dim % group != 0
        {
            return Err(StepError::Unsupported(format!(
                "an 8-bit KV cache stores heads in groups of {group} values, and layer {layer} \
                 of this model has {head_dim}-value heads; use --kv-cache f16"
            )));
        }
    }
    Ok(())
}

/// What the loop is doing, for `ps` and the stats endpoints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LoopStatus {
    /// Sequences admitted and not yet retired.
    pub running: usize,
    /// Of those, the ones still prefilling.
    pub prefilling: usize,
    /// Prompt tokens the prefilling ones have evaluated so far.
    pub prefilled_tokens: usize,
    /// Jobs waiting for admission.
    pub queued: usize,
    /// Bytes the prefix trie holds.
    pub cache_bytes: usize,
    /// Its budget.
    pub cache_budget: usize,
    /// Nodes in the trie.
    pub cache_nodes: usize,
    /// Bytes the draft model's prefix trie holds, when one is loaded.
    pub draft_cache_bytes: usize,
    /// MLX's active memory after the last step.
    pub active_memory: usize,
    /// MLX's peak memory.
    pub peak_memory: usize,
    /// The prompt-lookup depth controller's current depth, once a request has speculated.
    pub draft_depth: Option<usize>,
    /// The draft model's depth controller's current depth, once a request has drafted with
    /// the draft model loaded beside the model.
    pub draft_model_depth: Option<usize>,
}

/// What a decoding row of the batched forward is fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Feed {
    /// The token the previous step sampled in this row of its `Pending`, not yet read.
    Row(usize),
    /// A token the host knows: the first of a speculating sequence's plain stretch.
    Token(u32),
}

/// A loaded model, the sequences it serves and the jobs waiting for it.
pub struct LoadedModel {
    model: Box<dyn Model>,
    context_length: usize,
    config: LoopConfig,
    sampler: Sampler,
    prefix: PrefixCache,
    queue: VecDeque<Job>,
    sequences: Vec<Sequence>,
    pending: Option<Pending>,
    next_id: SequenceId,
    controllers: Controllers,
    /// What speculating sequences draft with, the draft model loaded beside this one among
    /// them.
    drafters: Drafters,
    /// Whether requests that leave the drafter to the server draft with it (it came from the
    /// model's Modelfile or the server's `--draft`, not from a request naming it).
    draft_by_default: bool,
    /// The vision encoder's outputs by image content, for a model that reads images.
    encoded: EncodedMedia,
}

impl LoadedModel {
    /// The embedding of `tokens` (see [`crate::engine::embedding`]), evaluated in prefill
    /// chunks on caches of its own.
    pub fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        crate::engine::embedding::embed(self.model.as_ref(), tokens, self.config.prefill_chunk)
    }

    /// Serves `model` with `context_length` tokens per sequence.
    pub fn new(
        model: Box<dyn Model>,
        context_length: usize,
        config: LoopConfig,
    ) -> Result<LoadedModel> {
        check_kv_storage(model.as_ref(), config.kv_storage)?;
        let prefix = PrefixCache::new(
            &fresh_caches(model.as_ref(), config.kv_storage)?,
            config.memory.cache_bytes,
            config.capture_interval,
        )?;
        Ok(LoadedModel {
            model,
            context_length,
            config,
            sampler: Sampler::new(),
            prefix,
            queue: VecDeque::new(),
            sequences: Vec::new(),
            pending: None,
            next_id: 0,
            controllers: Controllers::default(),
            drafters: Drafters::default(),
            draft_by_default: false,
            encoded: EncodedMedia::new(encoded_media::DEFAULT_BUDGET),
        })
    }

    /// Loads `model`, called `name`, beside this one as its draft model (see
    /// [`DraftModel::new`] for what is checked), replacing any other; `by_default`: requests
    /// that leave the drafter to the server draft with it.
    pub fn attach_draft(
        &mut self,
        name: String,
        model: Box<dyn Model>,
        by_default: bool,
    ) -> Result<()> {
        let serving = DraftServing {
            catch_up: self.config.prefill_chunk,
            target_cache_bytes: self.config.memory.cache_bytes,
            capture_interval: self.config.capture_interval,
        };
        let draft = DraftModel::new(name, model, self.model.as_ref(), serving)?;
        self.drafters.attach_model(draft);
        self.draft_by_default = by_default;
        Ok(())
    }

    /// The draft model's name, when one is loaded beside this one.
    pub fn draft_name(&self) -> Option<&str> {
        self.drafters.model().map(DraftModel::name)
    }

    /// Keeps what serving teaches the loop (the depth controllers) in `dir`: read now, written
    /// as it learns and when the model is unloaded.
    pub fn keep_state_in(&mut self, dir: std::path::PathBuf) {
        self.controllers = Controllers::persisted(dir, self.draft_name());
    }

    /// The controller's current depth for `drafter` (as for a lone sequence), once it has one.
    pub fn draft_depth(&self, drafter: DrafterKind) -> Option<usize> {
        self.controllers.current_depth(drafter)
    }

    /// The model.
    pub fn model(&self) -> &dyn Model {
        self.model.as_ref()
    }

    /// The prefix cache.
    pub fn prefix_cache(&self) -> &PrefixCache {
        &self.prefix
    }

    /// Queues a job; it is admitted at a coming step.
    pub fn submit(&mut self, job: Job) {
        self.queue.push_back(job);
    }

    /// Whether nothing runs and nothing waits.
    pub fn is_idle(&self) -> bool {
        self.sequences.is_empty() && self.queue.is_empty()
    }

    /// What the loop is doing.
    pub fn status(&self) -> LoopStatus {
        LoopStatus {
            running: self.sequences.len(),
            prefilling: self
                .sequences
                .iter()
                .filter(|s| s.phase == Phase::Prefilling)
                .count(),
            prefilled_tokens: self
                .sequences
                .iter()
                .filter(|s| s.phase == Phase::Prefilling)
                .map(|s| s.tokens.len() - s.stats.cached_tokens)
                .sum(),
            queued: self.queue.len(),
            cache_bytes: self.prefix.bytes(),
            cache_budget: self.prefix.budget(),
            cache_nodes: self.prefix.node_count(),
            draft_cache_bytes: self.drafters.model().map_or(0, DraftModel::cache_bytes),
            active_memory: mlx::memory::active_memory().unwrap_or(0),
            peak_memory: mlx::memory::peak_memory().unwrap_or(0),
            draft_depth: self.controllers.current_depth(DrafterKind::Ngram),
            draft_model_depth: self
                .drafters
                .model()
                .and_then(|_| self.controllers.current_depth(DrafterKind::Model)),
        }
    }

    /// Runs one step (see the module docs). Failures end the sequences they concern with an
    /// error event; the loop itself always goes on.
    pub fn step(&mut self) {
        self.drop_cancelled_queued();
        // Cancelled sequences retire before anything is admitted, so a retry finds what they
        // evaluated in the trie.
        self.retire_cancelled();
        self.admit();
        if let Err(e) = self.advance() {
            // A failed batched forward may leave any running cache half-written.
            self.fail_all(&e.to_string());
        }
    }

    /// Ends every running sequence with `message` (after a failure or panic in a step).
    pub fn fail_all(&mut self, message: &str) {
        self.pending = None;
        for mut seq in std::mem::take(&mut self.sequences) {
            self.prefix.abandon(&mut seq);
            let _ = self.sampler.remove(seq.id);
            self.end_drafting(&seq, false);
            let _ = seq.job.events.send(Event::Failed(message.to_string()));
        }
    }

    /// Tells a retiring sequence's drafter it ended (`intact`: not after a failure, so what
    /// the drafter holds of it may be kept).
    fn end_drafting(&mut self, seq: &Sequence, intact: bool) {
        let kind = seq.speculating.as_ref().map(Speculating::kind);
        if let Some(drafter) = kind.and_then(|kind| self.drafters.get(kind)) {
            drafter.end(seq.id, &seq.tokens, intact);
        }
    }

    fn retire_cancelled(&mut self) {
        let cancelled: Vec<SequenceId> = self
            .sequences
            .iter()
            .filter(|s| s.cancelled())
            .map(|s| s.id)
            .collect();
        for id in cancelled {
            self.retire(id, Outcome::Done(DoneReason::Cancelled));
        }
    }

    fn drop_cancelled_queued(&mut self) {
        let mut kept = VecDeque::with_capacity(self.queue.len());
        for job in self.queue.drain(..) {
            if job.cancelled() {
                let stats = Stats {
                    prompt_tokens: job.prompt.len(),
                    ..Stats::default()
                };
                let _ = job.events.send(Event::Done {
                    reason: DoneReason::Cancelled,
                    stats,
                });
            } else {
                kept.push_back(job);
            }
        }
        self.queue = kept;
    }

    /// KV bytes a job reserves: its prompt plus its whole budget, held to the context, in the
    /// target and, when it drafts with one, in the draft model.
    fn reservation(&self, job: &Job) -> usize {
        let tokens = job
            .prompt
            .len()
            .saturating_add(job.max_tokens)
            .min(self.context_length);
        let draft = match (self.drafters.model(), self.drafter_of(job)) {
            (Some(draft), Some((DrafterKind::Model, _))) => {
                draft.model().spec().state_bytes(tokens)
            }
            _ => 0,
        };
        // The draft model's caches keep its compute dtype; the target's follow `--kv-cache`.
        let storage = self
            .config
            .kv_storage
            .unwrap_or(KvStorage::Float(Dtype::F32));
        self.model
            .spec()
            .state_bytes_in(tokens, storage)
            .saturating_add(draft)
    }

    /// The drafter `job` asks for (or the server's, when it leaves the choice to the server)
    /// and its deepest round, if it speculates.
    fn drafter_of(&self, job: &Job) -> Option<(DrafterKind, Option<usize>)> {
        // A draft model the model's Modelfile names drafts unless a request says otherwise.
        let default = match (self.drafters.model(), self.config.draft) {
            (Some(_), _) if self.draft_by_default => Some(DrafterKind::Model),
            // A server-wide draft model only drafts for targets it could be loaded beside.
            (None, Some(DrafterKind::Model)) => None,
            (_, default) => default,
        };
        match (job.speculation, default) {
            (Speculation::Off, _) | (Speculation::ServerDefault { .. }, None) => None,
            (Speculation::ServerDefault { max_depth }, Some(drafter)) => Some((drafter, max_depth)),
            (Speculation::On { drafter, max_depth }, _) => Some((drafter, max_depth)),
        }
    }

    fn admit(&mut self) {
        let mut reserved: usize = self
            .sequences
            .iter()
            .map(|s| self.reservation(&s.job))
            .sum();
        while self.sequences.len() < self.config.max_sequences {
            let Some(job) = self.queue.front() else {
                return;
            };
            let need = self.reservation(job);
            if !self.sequences.is_empty()
                && reserved.saturating_add(need) > self.config.memory.kv_bytes
            {
                return; // Waits until running sequences retire.
            }
            let Some(job) = self.queue.pop_front() else {
                return;
            };
            if self.sequences.is_empty() {
                let _ = mlx::memory::reset_peak_memory();
            }
            if let Some(seq) = self.start(job) {
                reserved = reserved.saturating_add(need);
                self.sequences.push(seq);
            }
        }
    }

    /// Turns `job` into a sequence whose caches hold its longest cached prefix, or ends it
    /// with the error that keeps it from running.
    fn start(&mut self, job: Job) -> Option<Sequence> {
        let prompt_len = job.prompt.len();
        if prompt_len == 0 {
            return refuse(job, StepError::EmptyPrompt);
        }
        if prompt_len >= self.context_length {
            let error = StepError::PromptTooLong {
                prompt: prompt_len,
                context: self.context_length,
            };
            return refuse(job, error);
        }
        if let Err(e) = self.check_images(&job) {
            return refuse(job, e);
        }
        let mut caches = match fresh_caches(self.model.as_ref(), self.config.kv_storage) {
            Ok(caches) => caches,
            Err(e) => return refuse(job, e),
        };
        let media = job.media_items(prompt_len);
        let (mut session, mut restore_at, capture_at) =
            match self
                .prefix
                .begin(&job.prompt, &media, &job.turn_starts, &mut caches)
            {
                Ok(restored) => (
                    Some(restored.session),
                    restored.restore_at,
                    restored.capture_at,
                ),
                Err(e) => {
                    tracing::warn!("prefix cache not used for a request: {e}");
                    match fresh_caches(self.model.as_ref(), self.config.kv_storage) {
                        Ok(fresh) => caches = fresh,
                        Err(e) => return refuse(job, e),
                    }
                    (None, 0, Vec::new())
                }
            };
        if let Some((from, common)) = self.live_share(&job, restore_at) {
            match copy_from_live(
                &self.sequences[from].caches,
                &mut caches,
                common,
                &capture_at,
            ) {
                Ok(()) => restore_at = common,
                Err(e) => {
                    tracing::warn!("copying a prefix from a running request failed: {e}");
                    if let Some(session) = session.take() {
                        self.prefix.abandon_session(session);
                    }
                    match fresh_caches(self.model.as_ref(), self.config.kv_storage) {
                        Ok(fresh) => caches = fresh,
                        Err(e) => return refuse(job, e),
                    }
                    restore_at = 0;
                }
            }
        }
        // The restored prefix's images place the rotary positions of what follows.
        let rope_delta = match self.rope_delta_of(&job, restore_at) {
            Ok(delta) => delta,
            Err(e) => {
                if let Some(session) = session {
                    self.prefix.abandon_session(session);
                }
                return refuse(job, e);
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        if let Err(e) = self.sampler.add(id, job.sampling.clone(), &job.prompt) {
            if let Some(session) = session {
                self.prefix.abandon_session(session);
            }
            return refuse(job, e.into());
        }
        let budget = job.max_tokens.min(self.context_length - prompt_len);
        let speculating = match self.speculation_for(&job, id) {
            Ok(speculating) => speculating,
            Err(e) => {
                if let Some(session) = session {
                    self.prefix.abandon_session(session);
                }
                let _ = self.sampler.remove(id);
                return refuse(job, e);
            }
        };
        let tokens = job.prompt[..restore_at].to_vec();
        tracing::debug!(
            sequence = id,
            prompt = prompt_len,
            restored = restore_at,
            "admitted"
        );
        Some(Sequence {
            id,
            caches,
            tokens,
            trie_session: session,
            phase: Phase::Prefilling,
            budget,
            stats: Stats {
                prompt_tokens: prompt_len,
                cached_tokens: restore_at,
                images: job.images.iter().filter(|m| !m.is_audio()).count(),
                audio: job.images.iter().filter(|m| m.is_audio()).count(),
                ..Stats::default()
            },
            admitted: Instant::now(),
            first_token: None,
            captures: Vec::new(),
            speculating,
            rope_delta,
            job,
        })
    }

    /// The rope delta after the first `n` prompt tokens of `job` and the images wholly among
    /// them (`nn::Vision::rope_delta`): 0 for a model whose tokens each take one position.
    fn rope_delta_of(&self, job: &Job, n: usize) -> Result<i64> {
        let Some(vision) = self.model.vision() else {
            return Ok(0);
        };
        let tokens = job.prompt.get(..n).ok_or_else(|| {
            StepError::Internal(format!("{n} tokens of a {}-token prompt", job.prompt.len()))
        })?;
        let grids: Vec<ImageGrid> = job
            .images
            .iter()
            .filter(|image| image.tokens.end <= n)
            .filter_map(PromptMedia::grid)
            .collect();
        Ok(vision.rope_delta(tokens, &grids)?)
    }

    /// How `job` decodes: speculatively when it or the server asks for it (recurrent layers
    /// roll a round back through captures, see `rollback`).
    fn speculation_for(&mut self, job: &Job, id: SequenceId) -> Result<Option<Speculating>> {
        let Some((drafter, max_depth)) = self.drafter_of(job) else {
            return Ok(None);
        };
        let layers = self.model.spec().num_layers();
        if let DrafterKind::SelfDraft(k) = drafter
            && k >= layers
        {
            return Err(StepError::Request(format!(
                "draft `self:{k}`: a layer-skip draft needs fewer layers than the model's {layers}"
            )));
        }
        self.drafters
            .of(drafter)?
            .begin(id, &job.prompt, &job.turn_starts)?;
        Ok(Some(Speculating::new(
            drafter,
            max_depth.unwrap_or(DEFAULT_DRAFT_DEPTH),
            &job.sampling,
        )))
    }

    /// The running sequence whose caches hold a longer prefix of `prompt` than `restored`
    /// (the trie's), and that prefix's length: a request that shares a system prompt with one
    /// still prefilling, or a retry that arrives before its cancelled attempt is noticed.
    /// Whole-state layers (sliding windows, recurrent) can only be copied at the running
    /// sequence's current offset.
    /// Image tokens match only where both hold the same image, and a shared prefix never ends
    /// inside an image (its tokens attend both ways: they are evaluated together).
    fn live_share(&self, job: &Job, restored: usize) -> Option<(usize, usize)> {
        let prompt = &job.prompt;
        let limit = prompt.len() - 1;
        self.sequences
            .iter()
            .enumerate()
            .filter_map(|(i, seq)| {
                let mut common = seq
                    .tokens
                    .iter()
                    .zip(prompt)
                    .enumerate()
                    .take_while(|&(at, (a, b))| {
                        a == b
                            && ((job.images.is_empty() && seq.job.images.is_empty())
                                || job.image_at(at).map(|m| m.id)
                                    == seq.job.image_at(at).map(|m| m.id))
                    })
                    .count()
                    .min(limit);
                if let Some(image) = job.image_at(common)
                    && image.tokens.start < common
                {
                    common = image.tokens.start;
                }
                let exact = common == seq.tokens.len();
                let copyable = seq
                    .caches
                    .iter()
                    .flatten()
                    .all(|c| exact || c.layer_kind() == prefix_trie::LayerKind::Range);
                (copyable && common > restored).then_some((i, common))
            })
            .max_by_key(|&(_, common)| common)
    }

    /// Refuses a job whose images the model cannot take or whose prompt does not hold them as
    /// the model lays them out: each image's range must be exactly its image tokens, in order,
    /// and the prompt may hold no other image token.
    fn check_images(&self, job: &Job) -> Result<()> {
        if job.images.is_empty() {
            return Ok(());
        }
        if job.images.iter().any(PromptMedia::is_audio) {
            return self.check_audio(job);
        }
        let Some(vision) = self.model.vision() else {
            return Err(StepError::Request("this model does not read images".into()));
        };
        let input = vision.image_input();
        // A dynamic-resolution model's image takes as many tokens as its grid says.
        let merge = vision.patch_input().map(|p| p.merge_size);
        let mut runs = Vec::with_capacity(job.images.len());
        for (n, image) in job.images.iter().enumerate() {
            let expected = match (image.grid(), merge) {
                (None, None) => input.tokens_per_image,
                (Some(grid), Some(merge)) => grid.tokens(merge),
                (Some(_), None) => {
                    return Err(StepError::Request(format!(
                        "image {n} comes as patches; this model takes whole images"
                    )));
                }
                (None, Some(_)) => {
                    return Err(StepError::Request(format!(
                        "image {n} comes as whole pixels; this model takes patches"
                    )));
                }
            };
            runs.push((image.tokens.clone(), expected));
        }
        check_media_runs(&job.prompt, &runs, input.image_token, &IMAGE_RUNS)
    }

    /// [`Self::check_images`] for a prompt with audio: every media item must be an audio
    /// segment, each range exactly the audio tokens its valid frames make
    /// ([`nn::Audio::audio_tokens`]), in order, and no other audio token in the prompt.
    fn check_audio(&self, job: &Job) -> Result<()> {
        let Some(audio) = self.model.audio() else {
            return Err(StepError::Request("this model does not read audio".into()));
        };
        let input = audio.audio_input();
        let mut runs = Vec::with_capacity(job.images.len());
        for (n, segment) in job.images.iter().enumerate() {
            let EncoderInput::Audio(mel) = &segment.input else {
                return Err(StepError::Request(format!(
                    "media item {n} is an image in a prompt with audio"
                )));
            };
            if mel.feature_size != input.num_mel_bins || mel.frames != input.max_frames {
                return Err(StepError::Request(format!(
                    "audio segment {n} has {} bins by {} frames; the encoder takes {} by {}",
                    mel.feature_size, mel.frames, input.num_mel_bins, input.max_frames
                )));
            }
            runs.push((segment.tokens.clone(), audio.audio_tokens(mel.valid_frames)));
        }
        check_media_runs(&job.prompt, &runs, input.audio_token, &AUDIO_RUNS)
    }

    /// `n`, or another length so that the chunk of sequence `index` does not end inside an
    /// image: shorter, to stop before it, or, when the chunk starts with it, just long enough
    /// to take it whole (an image's tokens attend to each other both ways).
    fn chunk_of_whole_images(&self, index: usize, n: usize) -> usize {
        let seq = &self.sequences[index];
        let from = seq.tokens.len();
        let to = from + n;
        match seq.job.image_at(to) {
            Some(image) if image.tokens.start < to => {
                if image.tokens.start > from {
                    image.tokens.start - from
                } else {
                    image.tokens.end - from
                }
            }
            _ => n,
        }
    }

    /// The ids of the images and audio segments whose features it keeps, as request handlers
    /// see them.
    pub fn encoded_ids(&self) -> Arc<EncodedIds> {
        self.encoded.ids()
    }

    /// The features of `image` (or audio segment): kept from an earlier encode, or encoded now
    /// (counted in `encoded`).
    fn features_of(&mut self, image: &PromptMedia, encoded: &mut usize) -> Result<Array> {
        if let Some(features) = self.encoded.get(&image.id) {
            return Ok(features);
        }
        // Its features were kept when the request was prepared, and dropped since.
        let decoded;
        let input = match &image.input {
            EncoderInput::Undecoded(undecoded) => {
                decoded = undecoded
                    .decode()
                    .map_err(|e| StepError::Request(format!("invalid image: {e}")))?;
                &decoded
            }
            input => input,
        };
        if let EncoderInput::Audio(mel) = input {
            let audio = self
                .model
                .audio()
                .ok_or_else(|| StepError::Request("this model does not read audio".into()))?;
            let shape = [
                1,
                i32::try_from(mel.feature_size).unwrap_or(i32::MAX),
                i32::try_from(mel.frames).unwrap_or(i32::MAX),
            ];
            let features =
                audio.encode_audio(&Array::from_slice(&mel.features, &shape)?, mel.valid_frames)?;
            mlx::eval([&features])?;
            *encoded += 1;
            self.encoded.insert(image.id, features.clone());
            return Ok(features);
        }
        let Some(vision) = self.model.vision() else {
            return Err(StepError::Request("this model does not read images".into()));
        };
        let features = match (input, image.grid()) {
            (EncoderInput::Patches(patches), Some(grid)) => {
                let rows = i32::try_from(grid.patches()).unwrap_or(i32::MAX);
                let len = i32::try_from(patches.patch_len).unwrap_or(i32::MAX);
                let array = Array::from_slice(&patches.data, &[rows, len])?;
                vision.encode_image_patches(&array, &[grid])?
            }
            (EncoderInput::Pixels(pixels), _) => {
                let shape = [
                    media::PixelValues::CHANNELS as i32,
                    i32::try_from(pixels.height).unwrap_or(i32::MAX),
                    i32::try_from(pixels.width).unwrap_or(i32::MAX),
                ];
                let array = Array::from_slice(&pixels.data, &[1, shape[0], shape[1], shape[2]])?;
                vision.encode_images(&array)?
            }
            (EncoderInput::Patches(_), None) => {
                return Err(StepError::Internal("image patches without a grid".into()));
            }
            (EncoderInput::Audio(_), _) => {
                return Err(StepError::Internal("audio where an image was due".into()));
            }
            (EncoderInput::Undecoded(_), _) => {
                return Err(StepError::Internal(
                    "an image decoded to another undecoded".into(),
                ));
            }
        };
        mlx::eval([&features])?;
        *encoded += 1;
        self.encoded.insert(image.id, features.clone());
        Ok(features)
    }

    fn index_of(&self, id: SequenceId) -> Option<usize> {
        self.sequences.iter().position(|s| s.id == id)
    }

    fn has_grammar(&self, id: SequenceId) -> bool {
        self.index_of(id)
            .is_some_and(|i| self.sequences[i].job.grammar.is_some())
    }

    /// Steps 2–6 of the module docs.
    fn advance(&mut self) -> Result<()> {
        let mut step = Step::default();
        for seq in &self.sequences {
            if seq.cancelled() {
                step.ending
                    .add(seq.id, Outcome::Done(DoneReason::Cancelled));
            }
        }
        let seeds = self.prefill(&mut step);

        // Speculating sequences whose drafting does not pay join the plain forward below.
        speculation::decide_depths(&mut self.controllers, &mut self.sequences, &step.ending);

        // The batched decode forward, fed with last step's unread tokens (and the first token
        // of each plain stretch that starts now).
        let previous = self.pending.take();
        let rows: HashMap<SequenceId, usize> = previous
            .iter()
            .flat_map(|prev| prev.rows.iter().enumerate().map(|(r, &id)| (id, r)))
            .collect();
        let mut fed: Vec<(SequenceId, Feed)> = Vec::new();
        for seq in &mut self.sequences {
            if step.ending.contains(seq.id) || !seq.may_continue() {
                continue;
            }
            match seq.speculating.as_mut() {
                Some(spec) if !spec.decodes_plainly() => {}
                Some(spec) => match (rows.get(&seq.id), spec.take_next()) {
                    (_, Some(token)) => fed.push((seq.id, Feed::Token(token))),
                    (Some(&row), None) => fed.push((seq.id, Feed::Row(row))),
                    (None, None) => {}
                },
                None => {
                    if let Some(&row) = rows.get(&seq.id) {
                        fed.push((seq.id, Feed::Row(row)));
                    }
                }
            }
        }
        let decode_logits = match fed.is_empty() {
            false => Some(self.decode_forward(previous.as_ref(), &fed)?),
            true => None,
        };

        // One sampler call for every row that needs a next token.
        let mut sample_ids: Vec<SequenceId> = fed.iter().map(|&(id, _)| id).collect();
        let mut parts: Vec<Array> = decode_logits.into_iter().collect();
        for (id, logits) in seeds {
            sample_ids.push(id);
            parts.push(logits);
        }
        let logits = match parts.len() {
            0 => None,
            1 => parts.pop(),
            _ => Some(mlx::concatenate(&parts, 0)?),
        };
        let constrained = sample_ids.iter().any(|&id| self.has_grammar(id));
        let mut sampled = None;
        if let Some(logits) = &logits {
            if constrained {
                // The masks need the tokens read below; the forward runs meanwhile.
                mlx::async_eval([logits])?;
            } else {
                let s = self.sampler.sample(&sample_ids, logits)?;
                mlx::async_eval([&s.tokens])?;
                sampled = Some(s);
            }
        }

        // Read, stream and judge last step's tokens.
        if let Some(prev) = &previous {
            self.read_tokens(prev, &fed, &mut step)?;
        }

        if let (Some(logits), true) = (&logits, constrained) {
            let masks = self.grammar_masks(&sample_ids, logits, &mut step.ending)?;
            let borrowed: Vec<Option<&[u32]>> = masks.iter().map(|m| m.as_deref()).collect();
            let s = self.sampler.sample_masked(&sample_ids, logits, &borrowed)?;
            mlx::async_eval([&s.tokens])?;
            sampled = Some(s);
        }
        speculation::run_rounds(
            self.model.as_ref(),
            &mut self.drafters,
            &mut self.sampler,
            &mut self.controllers,
            &mut self.sequences,
            &mut step,
        )?;
        self.pending = sampled.map(|sampled| Pending {
            sampled,
            rows: sample_ids,
            dispatched: Instant::now(),
        });

        for (id, outcome) in step.ending.outcomes {
            self.retire(id, outcome);
        }
        if step.clear_pool {
            crate::engine::memory::release_pool()?;
        }
        Ok(())
    }

    /// Gives prefilling sequences their chunks under this step's token budget, batched into as
    /// few forwards as their chunk widths allow; returns the last-position logits `[1, V]` of
    /// each sequence whose prompt is now fully evaluated.
    fn prefill(&mut self, step: &mut Step) -> Vec<(SequenceId, Array)> {
        let decoding = self
            .sequences
            .iter()
            .any(|s| s.phase == Phase::Decoding && !step.ending.contains(s.id));
        let mut budget = if decoding {
            self.config.prefill_budget_while_decoding
        } else {
            self.config.prefill_budget_idle
        };
        // Shortest remaining prompt first: a short request is never queued behind a long
        // prompt's chunks.
        let mut order: Vec<usize> = (0..self.sequences.len())
            .filter(|&i| {
                let seq = &self.sequences[i];
                seq.phase == Phase::Prefilling && !step.ending.contains(seq.id)
            })
            .collect();
        order.sort_by_key(|&i| self.sequences[i].prompt_left());
        let mut planned = Vec::new();
        for i in order {
            if budget == 0 {
                break;
            }
            let wanted = self.sequences[i]
                .prompt_left()
                .min(budget)
                .min(self.config.prefill_chunk)
                .max(1);
            let n = self.chunk_of_whole_images(i, self.chunk_until_capture(i, wanted));
            budget = budget.saturating_sub(n);
            planned.push((i, n));
        }
        // Chunks holding image tokens are never cut to another's width (that could split an
        // image): they share a forward only with chunks of their exact width.
        let (with_images, text): (Vec<_>, Vec<_>) = planned.into_iter().partition(|&(i, n)| {
            let seq = &self.sequences[i];
            let from = seq.tokens.len();
            seq.job
                .images
                .iter()
                .any(|image| image.tokens.start < from + n && from < image.tokens.end)
        });
        let mut groups = equal_width_groups(text);
        groups.extend(exact_width_groups(with_images));
        let mut seeds = Vec::new();
        for (width, group) in groups {
            let ids: Vec<SequenceId> = group.iter().map(|&i| self.sequences[i].id).collect();
            match self.prefill_rows(&group, width) {
                Ok(ends) => {
                    for (id, logits) in ids.into_iter().zip(ends) {
                        match logits {
                            // Asked for no tokens (or no room left): done once the prompt is
                            // evaluated.
                            Some(_)
                                if self
                                    .index_of(id)
                                    .is_some_and(|i| self.sequences[i].budget == 0) =>
                            {
                                step.ending.add(id, Outcome::Done(DoneReason::Length));
                            }
                            Some(logits) => seeds.push((id, logits)),
                            None => {}
                        }
                    }
                    step.clear_pool |= width * group.len() >= LONG_PREFILL;
                }
                // One forward wrote every row's caches: none of them can be trusted.
                Err(e) => {
                    for id in ids {
                        step.ending.add(id, Outcome::Failed(e.to_string()));
                    }
                }
            }
        }
        seeds
    }

    /// `n`, or less so that the chunk of sequence `index` ends at its next scheduled capture: a
    /// recurrent layer captures only at a forward's end.
    fn chunk_until_capture(&self, index: usize, n: usize) -> usize {
        let seq = &self.sequences[index];
        let from = seq.tokens.len();
        seq.caches
            .iter()
            .flatten()
            .filter_map(|c| c.next_capture_within(from, n))
            .filter(|&at| at > from)
            .map(|at| at - from)
            .min()
            .unwrap_or(n)
            .min(seq.prompt_left())
            .max(1)
    }

    /// Evaluates the next `width` prompt tokens of each sequence in `group` (indices into
    /// `self.sequences`, ascending) in one forward. A row whose chunk ends its prompt gets its
    /// last logits (its last token's hidden state seeds decoding: a short prompt is one
    /// forward).
    fn prefill_rows(&mut self, group: &[usize], width: usize) -> Result<Vec<Option<Array>>> {
        let mut rows = Vec::with_capacity(group.len());
        for &i in group {
            let seq = &self.sequences[i];
            let from = seq.tokens.len();
            let to = from + width;
            if to > seq.job.prompt.len() {
                return Err(StepError::Internal(
                    "a prefill chunk overruns its prompt".into(),
                ));
            }
            rows.push((&seq.job.prompt[from..to], from));
        }
        let batch = with_rope_deltas(Batch::rows(&rows)?, &self.sequences, group)?;
        // What each row's chunk moves its rope delta by (its images', whole in the chunk).
        let moved = group
            .iter()
            .map(|&i| self.chunk_rope_delta(i, width))
            .collect::<Result<Vec<i64>>>()?;
        let images = self.chunk_images(group, width)?;
        let out =
            match images {
                None => {
                    let mut caches = caches_of(&mut self.sequences, group)?;
                    self.model.forward_rows(&batch, &mut caches)?
                }
                Some((features, _)) if self.model.audio().is_some() => {
                    let audio = self.model.audio().ok_or_else(|| {
                        StepError::Request("this model does not read audio".into())
                    })?;
                    let mut caches = caches_of(&mut self.sequences, group)?;
                    audio.forward_rows_with_audio(&batch, Some(&features), &mut caches)?
                }
                Some((features, grids)) => {
                    let vision = self.model.vision().ok_or_else(|| {
                        StepError::Request("this model does not read images".into())
                    })?;
                    let mut caches = caches_of(&mut self.sequences, group)?;
                    vision.forward_rows_with_image_grids(
                        &batch,
                        Some(&features),
                        &grids,
                        &mut caches,
                    )?
                }
            };
        let mut ends = Vec::with_capacity(group.len());
        let mut unfinished = Vec::new();
        for (row, &i) in group.iter().enumerate() {
            let seq = &mut self.sequences[i];
            let from = seq.tokens.len();
            seq.tokens
                .extend_from_slice(&seq.job.prompt[from..from + width]);
            seq.rope_delta += moved[row];
            if seq.tokens.len() == seq.job.prompt.len() {
                seq.phase = Phase::Decoding;
                let hidden = out.hidden.slice_axis(0, row as i32, row as i32 + 1)?;
                ends.push(Some(last_logits(self.model.as_ref(), &hidden)?));
            } else {
                unfinished.push(i);
                ends.push(None);
            }
        }
        if !unfinished.is_empty() {
            // Sliding-window caches attend a gathered copy while prefilling, so their ring
            // writes are not inputs of `hidden`: evaluate the cache state explicitly.
            let mut arrays = vec![out.hidden];
            for i in unfinished {
                arrays.extend(
                    self.sequences[i]
                        .caches
                        .iter()
                        .flatten()
                        .flat_map(|c| c.state_arrays()),
                );
            }
            mlx::eval(&arrays)?;
        }
        Ok(ends)
    }

    /// How far the next `width` prompt tokens of sequence `index` move its rope delta: by what
    /// the images wholly among them add (planning never cuts one).
    fn chunk_rope_delta(&self, index: usize, width: usize) -> Result<i64> {
        let Some(vision) = self.model.vision() else {
            return Ok(0);
        };
        let seq = &self.sequences[index];
        let (from, to) = (seq.tokens.len(), seq.tokens.len() + width);
        let chunk = seq
            .job
            .prompt
            .get(from..to)
            .ok_or_else(|| StepError::Internal("a prefill chunk overruns its prompt".into()))?;
        let grids: Vec<ImageGrid> = seq
            .job
            .images
            .iter()
            .filter(|image| from <= image.tokens.start && image.tokens.end <= to)
            .filter_map(PromptMedia::grid)
            .collect();
        Ok(vision.rope_delta(chunk, &grids)?)
    }

    /// The features of the images in the next `width` prompt tokens of each sequence in
    /// `group`, in row order, and their grids (empty for fixed-size images), or `None` when
    /// there are none: `[images, tokens_per_image, hidden]`, or `[tokens, hidden]` for a
    /// dynamic-resolution model. An image the chunk holds only in part is an error (planning
    /// never cuts one).
    fn chunk_images(
        &mut self,
        group: &[usize],
        width: usize,
    ) -> Result<Option<(Array, Vec<ImageGrid>)>> {
        let mut wanted: Vec<(usize, PromptMedia)> = Vec::new();
        for &i in group {
            let seq = &self.sequences[i];
            let (from, to) = (seq.tokens.len(), seq.tokens.len() + width);
            for image in &seq.job.images {
                let range = &image.tokens;
                if range.end <= from || to <= range.start {
                    continue;
                }
                if range.start < from || to < range.end {
                    return Err(StepError::Internal(format!(
                        "a prefill chunk of tokens {from}..{to} splits the image at {range:?}"
                    )));
                }
                wanted.push((i, image.clone()));
            }
        }
        if wanted.is_empty() {
            return Ok(None);
        }
        let mut features = Vec::with_capacity(wanted.len());
        let mut grids = Vec::new();
        for (i, image) in wanted {
            let mut encoded = 0;
            features.push(self.features_of(&image, &mut encoded)?);
            grids.extend(image.grid());
            let stats = &mut self.sequences[i].stats;
            if image.is_audio() {
                stats.audio_encoded += encoded;
            } else {
                stats.images_encoded += encoded;
            }
        }
        Ok(Some((mlx::concatenate(&features, 0)?, grids)))
    }

    /// One forward over the decoding rows `fed`, each fed the token `prev` sampled in its row
    /// or the token the host gives it; returns their logits `[rows, V]`. A host token joins
    /// its sequence's cached tokens here; a sampled one when it is read.
    fn decode_forward(
        &mut self,
        prev: Option<&Pending>,
        fed: &[(SequenceId, Feed)],
    ) -> Result<Array> {
        let sampled_rows = prev.map_or(0, |p| p.rows.len());
        let all_in_order = fed.len() == sampled_rows
            && fed
                .iter()
                .enumerate()
                .all(|(i, &(_, feed))| feed == Feed::Row(i));
        let tokens = match prev {
            Some(prev) if all_in_order => prev.sampled.tokens.clone(),
            _ => {
                // Host tokens go after the sampled ones; each row picks its own.
                let mut host: Vec<i32> = Vec::new();
                let mut picks: Vec<i32> = Vec::with_capacity(fed.len());
                for &(_, feed) in fed {
                    match feed {
                        Feed::Row(row) => picks.push(row as i32),
                        Feed::Token(token) => {
                            picks.push((sampled_rows + host.len()) as i32);
                            host.push(i32::try_from(token).unwrap_or(i32::MAX));
                        }
                    }
                }
                let host = Array::from_slice(&host, &[host.len() as i32])?;
                let all = match prev {
                    Some(prev) => {
                        let sampled = &prev.sampled.tokens;
                        mlx::concatenate(&[sampled.clone(), host.astype(sampled.dtype())?], 0)?
                    }
                    None => host,
                };
                all.take(&Array::from_slice(&picks, &[picks.len() as i32])?, 0)?
            }
        };
        let tokens = tokens.reshape(&[fed.len() as i32, 1])?;
        // `fed` follows the order of `self.sequences`, so its caches can be borrowed in order.
        let indices: Vec<usize> = fed
            .iter()
            .filter_map(|&(id, _)| self.index_of(id))
            .collect();
        let positions: Vec<usize> = indices
            .iter()
            .map(|&i| self.sequences[i].tokens.len())
            .collect();
        for (&i, &(_, feed)) in indices.iter().zip(fed) {
            if let Feed::Token(token) = feed {
                self.sequences[i].tokens.push(token);
            }
        }
        let batch = Batch::from_device(&tokens, positions)?;
        let batch = with_rope_deltas(batch, &self.sequences, &indices)?;
        let mut caches = caches_of(&mut self.sequences, &indices)?;
        let out = self.model.forward_rows(&batch, &mut caches)?;
        last_logits(self.model.as_ref(), &out.hidden)
    }

    /// Reads the tokens `prev` sampled and hands each to its sequence: a token whose forward
    /// was dispatched (`fed`) joins the sequence's cached tokens; stop tokens, budgets, the
    /// grammar and the client decide whether it goes on.
    fn read_tokens(
        &mut self,
        prev: &Pending,
        fed: &[(SequenceId, Feed)],
        step: &mut Step,
    ) -> Result<()> {
        let tokens = prev.sampled.tokens.to_vec::<u32>()?;
        let logprobs = match &prev.sampled.logprobs {
            Some(lp) => Some((
                lp.chosen.to_vec::<f32>()?,
                lp.top_ids.to_vec::<u32>()?,
                lp.top_logprobs.to_vec::<f32>()?,
            )),
            None => None,
        };
        let now = Instant::now();
        // What a plain step cost, for the controllers of sequences decoding plainly.
        let step_cost = now.saturating_duration_since(prev.dispatched);
        for (row, &id) in prev.rows.iter().enumerate() {
            let Some(index) = self.index_of(id) else {
                continue;
            };
            if step.ending.contains(id) {
                continue; // Cancelled before its token was read: the token never happened.
            }
            let seq = &mut self.sequences[index];
            let Some(&token) = tokens.get(row) else {
                step.ending.add(
                    id,
                    Outcome::Failed("the sampler returned too few rows".into()),
                );
                continue;
            };
            let was_fed = fed.iter().any(|&(f, _)| f == id);
            if was_fed {
                seq.tokens.push(token);
            }
            if seq
                .speculating
                .as_ref()
                .is_some_and(Speculating::rounds_started)
            {
                let batch = prev.rows.len();
                let cost = was_fed.then_some(step_cost);
                speculation::plain_step(
                    &mut self.drafters,
                    &mut self.controllers,
                    seq,
                    token,
                    batch,
                    cost,
                )?;
            }
            let entry = match (&logprobs, seq.job.sampling.logprobs) {
                (Some((chosen, ids, values)), Some(top)) => {
                    Some(logprobs_of_row(chosen, ids, values, row, top))
                }
                _ => None,
            };
            if let Some(outcome) = step.deliver(seq, token, entry, now) {
                step.ending.add(id, outcome);
            } else if !was_fed {
                if let Some(spec) = seq.speculating.as_mut()
                    && seq.stats.generated_tokens < seq.budget
                    && !seq.job.cancelled()
                {
                    // Its next round starts from this token.
                    spec.resume_from(token);
                    continue;
                }
                let reason = if seq.cancelled() {
                    DoneReason::Cancelled
                } else {
                    DoneReason::Length
                };
                step.ending.add(id, Outcome::Done(reason));
            }
        }
        Ok(())
    }

    /// The grammar mask of each row to sample (`None`: unconstrained, or the sequence ends).
    fn grammar_masks(
        &mut self,
        ids: &[SequenceId],
        logits: &Array,
        ending: &mut Ending,
    ) -> Result<Vec<Option<Vec<u32>>>> {
        let width = usize::try_from(logits.dim(1)?).unwrap_or(0);
        let mut masks = Vec::with_capacity(ids.len());
        for &id in ids {
            let index = self.index_of(id).filter(|_| !ending.contains(id));
            let grammar = index.and_then(|i| self.sequences[i].job.grammar.as_mut());
            let mask = match grammar.map(|g| g.mask()) {
                Some(Ok(mut mask)) => {
                    // The model may have more output rows than the tokenizer has tokens
                    // (padding); the grammar never allows those.
                    if mask.len() < sampler::mask_words(width) {
                        mask.resize(sampler::mask_words(width), 0);
                    }
                    Some(mask)
                }
                Some(Err(e)) => {
                    ending.add(id, Outcome::Failed(format!("structured output: {e}")));
                    None
                }
                None => None,
            };
            masks.push(mask);
        }
        Ok(masks)
    }

    /// Ends sequence `id`: records what its caches hold in the prefix trie (finished or
    /// cancelled; a failed one's caches are not trusted), releases its slot and reports.
    fn retire(&mut self, id: SequenceId, outcome: Outcome) {
        let Some(index) = self.index_of(id) else {
            return;
        };
        let mut seq = self.sequences.remove(index);
        let _ = self.sampler.remove(seq.id);
        tracing::debug!(
            sequence = id,
            cached = seq.tokens.len(),
            generated = seq.stats.generated_tokens,
            outcome = match &outcome {
                Outcome::Done(reason) => reason.as_str(),
                Outcome::Failed(_) => "failed",
            },
            "retired"
        );
        match &outcome {
            Outcome::Done(_) => {
                if let Err(e) = self.prefix.close(&mut seq) {
                    tracing::warn!("prefix cache: recording a request failed: {e}");
                }
            }
            Outcome::Failed(_) => self.prefix.abandon(&mut seq),
        }
        self.end_drafting(&seq, matches!(outcome, Outcome::Done(_)));
        // Dropping the caches copies out the lazy snapshots the trie took of them.
        seq.caches.clear();
        if let Err(e) = self.prefix.evict() {
            tracing::warn!("prefix cache: eviction failed: {e}");
        }
        let event = match outcome {
            Outcome::Done(reason) => {
                let mut stats = seq.stats;
                stats.speculation = seq.speculating.as_ref().map(Speculating::stats);
                match seq.first_token {
                    Some(first) => stats.eval = first.elapsed(),
                    None => stats.prompt_eval = seq.admitted.elapsed(),
                }
                stats.peak_memory = mlx::memory::peak_memory().unwrap_or(0);
                Event::Done { reason, stats }
            }
            Outcome::Failed(message) => Event::Failed(message),
        };
        let _ = seq.job.events.send(event);
    }
}

/// Brings the fresh-or-restored `caches` to `common` tokens copied from a running sequence's
/// caches, and schedules the captures past that point.
fn copy_from_live(
    source: &[Option<kvcache::LayerCache>],
    caches: &mut [Option<kvcache::LayerCache>],
    common: usize,
    capture_at: &[usize],
) -> std::result::Result<(), kvcache::Error> {
    let later: Vec<usize> = capture_at
        .iter()
        .copied()
        .filter(|&at| at > common)
        .collect();
    for (from, to) in source.iter().zip(caches.iter_mut()) {
        let (Some(from), Some(to)) = (from, to.as_mut()) else {
            continue;
        };
        let snapshot = match from.layer_kind() {
            prefix_trie::LayerKind::Range => from.snapshot(0..common)?,
            _ => from.snapshot(common..common)?,
        };
        to.restore(&snapshot)?;
        to.schedule_captures(&later)?;
    }
    Ok(())
}

/// Ends a job that cannot run with `error`.
fn refuse(job: Job, error: StepError) -> Option<Sequence> {
    let _ = job.events.send(Event::Failed(error.to_string()));
    None
}

/// Row `row` of a call's logprobs, keeping the `top` alternatives its request asked for.
fn logprobs_of_row(
    chosen: &[f32],
    ids: &[u32],
    values: &[f32],
    row: usize,
    top: usize,
) -> TokenLogprobs {
    let per_row = ids.len().checked_div(chosen.len()).unwrap_or(0);
    let start = row * per_row;
    let ids = ids.get(start..start + per_row).unwrap_or(&[]);
    let values = values.get(start..start + per_row).unwrap_or(&[]);
    TokenLogprobs {
        logprob: chosen.get(row).copied().unwrap_or(f32::NEG_INFINITY),
        top: ids
            .iter()
            .copied()
            .zip(values.iter().copied())
            .take(top)
            .collect(),
    }
}

/// How [`check_media_runs`] names one kind of media in its errors.
struct MediaRunNames {
    /// One item ("image", "audio segment").
    item: &'static str,
    /// Its tokens ("image", "audio").
    token: &'static str,
    /// The item before it ("image", "segment").
    previous: &'static str,
    /// Several items ("images", "segments").
    items: &'static str,
}

const IMAGE_RUNS: MediaRunNames = MediaRunNames {
    item: "image",
    token: "image",
    previous: "image",
    items: "images",
};

const AUDIO_RUNS: MediaRunNames = MediaRunNames {
    item: "audio segment",
    token: "audio",
    previous: "segment",
    items: "segments",
};

/// Refuses a prompt whose media `runs` (each item's prompt range and the tokens its input
/// makes) are not, in order, exactly that many `token`s each, or that holds `token` anywhere
/// else. An item that makes no token is refused too.
fn check_media_runs(
    prompt: &[u32],
    runs: &[(std::ops::Range<usize>, usize)],
    token: u32,
    names: &MediaRunNames,
) -> Result<()> {
    let mut previous_end = 0;
    let mut expected_total = 0;
    for (n, (range, expected)) in runs.iter().enumerate() {
        let (range, expected) = (range.clone(), *expected);
        let holds = prompt
            .get(range.clone())
            .is_some_and(|ids| ids.iter().all(|&id| id == token));
        if expected == 0 || range.start < previous_end || range.len() != expected || !holds {
            return Err(StepError::Request(format!(
                "{} {n} at prompt tokens {range:?} is not {expected} {} tokens after the \
                 previous {}",
                names.item, names.token, names.previous
            )));
        }
        previous_end = range.end;
        expected_total += expected;
    }
    let held = prompt.iter().filter(|&&id| id == token).count();
    if held != expected_total {
        return Err(StepError::Request(format!(
            "the prompt holds {held} {} tokens for {} {} of {expected_total} tokens",
            names.token,
            runs.len(),
            names.items
        )));
    }
    Ok(())
}
