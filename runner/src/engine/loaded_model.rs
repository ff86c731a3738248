//! `LoadedModel`: a loaded model, what it holds to serve many sequences at once (the sampler
//! with a slot per sequence, the prefix trie, the drafters and their depth controllers, the
//! kept image and audio encodings, the queue and the running sequences), how it is
//! configured ([`LoopConfig`]) and what it reports ([`LoopStatus`]).
//!
//! Its step is cut into rooms, each a file over this state: `admission`, `prefill`, `decode`,
//! `speculation` and `retirement`, put in order by `step_loop`; what they share (the step's
//! error and state, the batch-row helpers) is in `step`. This file calls none of them.
//!
//! Seams for speculation: a row may carry several tokens (`Batch` rows of any width), caches
//! rewind, and the sampler hands out per-position distributions.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use kvcache::KvStorage;
use mlx::Dtype;
use nn::Model;
use sampler::Sampler;

use crate::engine::assistant::AssistantDrafter;
use crate::engine::block_drafter::BlockDrafter;
use crate::engine::controllers::Controllers;
use crate::engine::draft_model::{DraftModel, DraftServing};
use crate::engine::drafters::Drafters;
use crate::engine::encoded_media::{self, EncodedIds, EncodedMedia};
use crate::engine::job::{DrafterKind, Job};
use crate::engine::memory::{MemoryBudget, default_cache_bytes};
use crate::engine::prefill_pace::PrefillPace;
use crate::engine::prefix_cache::PrefixCache;
use crate::engine::sequence::{Phase, Sequence, SequenceId};
use crate::engine::speculating::MAX_DRAFT_DEPTH;
use crate::engine::step::{Pending, Result, StepError};

/// The default [`LoopConfig::prefill_step_target`]: a cancelled or new request waits about
/// half a second for the prefill step in flight, while a forward that long still amortizes
/// reading the weights on the machines prefill is slowest on.
pub const DEFAULT_PREFILL_STEP_TARGET: Duration = Duration::from_millis(500);

/// Tokens of KV a resident model is planned to need at least, for one request: what an
/// agent's first request takes.
pub const MIN_KV_RESERVATION_TOKENS: usize = 16_384;

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
    /// The time a step's prefill aims at: budgets shrink to what the model's measured pace
    /// fits in it (see [`crate::engine::prefill_pace`]), so a cancellation or a new request
    /// waits about this long, not a whole chunk of a large model. `None`: token budgets only.
    pub prefill_step_target: Option<Duration>,
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
    /// Bytes one sequence of `tokens` tokens of `model` holds in its caches as they store keys
    /// and values; f32 when the model's own dtype decides, the most that can be.
    pub fn kv_bytes(&self, model: &dyn Model, tokens: usize) -> usize {
        let storage = self.kv_storage.unwrap_or(KvStorage::Float(Dtype::F32));
        model.spec().state_bytes_in(tokens, storage)
    }

    /// Defaults, overridable by `MLXKIT_MAX_SEQUENCES`, `MLXKIT_CACHE_BYTES`,
    /// `MLXKIT_KV_BYTES`, `MLXKIT_DRAFT` and `MLXKIT_PREFILL_STEP_MS` (0: no pacing).
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
            prefill_step_target: match std::env::var("MLXKIT_PREFILL_STEP_MS")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
            {
                Some(0) => None,
                Some(ms) => Some(Duration::from_millis(ms)),
                None => Some(DEFAULT_PREFILL_STEP_TARGET),
            },
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
/// values as `kv_storage` when given. Sliding windows keep one position more than the deepest
/// round's rewind needs: a Gemma 4 assistant reads one past the window
/// (`nn::arch::gemma4_assistant`), which must survive a rejected round of any depth.
pub(super) fn fresh_caches(
    model: &dyn Model,
    kv_storage: Option<KvStorage>,
) -> Result<Vec<Option<kvcache::LayerCache>>> {
    let mut caches = model.new_caches_rewindable(MAX_DRAFT_DEPTH + 1)?;
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
    /// Bytes of KV the running sequences reserved (their prompts and budgets, held to the
    /// context).
    pub kv_reserved: usize,
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

/// A loaded model, the sequences it serves and the jobs waiting for it.
pub struct LoadedModel {
    pub(super) model: Box<dyn Model>,
    pub(super) context_length: usize,
    pub(super) config: LoopConfig,
    pub(super) sampler: Sampler,
    pub(super) prefix: PrefixCache,
    pub(super) queue: VecDeque<Job>,
    pub(super) sequences: Vec<Sequence>,
    pub(super) pending: Option<Pending>,
    pub(super) next_id: SequenceId,
    pub(super) controllers: Controllers,
    /// What speculating sequences draft with, the draft model loaded beside this one among
    /// them.
    pub(super) drafters: Drafters,
    /// Whether requests that leave the drafter to the server draft with it (it came from the
    /// model's Modelfile or the server's `--draft`, not from a request naming it).
    pub(super) draft_by_default: bool,
    /// The vision encoder's outputs by image content, for a model that reads images.
    pub(super) encoded: EncodedMedia,
    /// How long prefill forwards take, to keep a step's prefill near its time target.
    pub(super) pace: PrefillPace,
    /// Whether a new sequence may start from a prefix the trie or a running sequence holds.
    pub(super) reuses_prefixes: bool,
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
        mut config: LoopConfig,
    ) -> Result<LoadedModel> {
        check_kv_storage(model.as_ref(), config.kv_storage)?;
        let cache_bytes = config.memory.cache_bytes.unwrap_or_else(|| {
            default_cache_bytes(|tokens| config.kv_bytes(model.as_ref(), tokens))
        });
        config.memory.cache_bytes = Some(cache_bytes);
        let prefix = PrefixCache::new(
            &fresh_caches(model.as_ref(), config.kv_storage)?,
            cache_bytes,
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
            pace: PrefillPace::new(config.prefill_step_target),
            reuses_prefixes: true,
        })
    }

    /// Whether new sequences may start from a prefix already evaluated (the default), or
    /// always from empty caches: a model split across processes whose workers keep caches
    /// per sequence only.
    pub fn reuse_prefixes(&mut self, yes: bool) {
        self.reuses_prefixes = yes;
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
            target_cache_bytes: self.prefix.budget(),
            capture_interval: self.config.capture_interval,
        };
        let draft = DraftModel::new(name, model, self.model.as_ref(), serving)?;
        self.drafters.attach_model(draft);
        self.draft_by_default = by_default;
        Ok(())
    }

    /// Loads `assistant`, called `name`, beside this one as its draft model (a Gemma 4
    /// assistant, fitted to this model when it was loaded), replacing any other; `by_default`
    /// as for [`LoadedModel::attach_draft`].
    pub fn attach_assistant(
        &mut self,
        name: String,
        assistant: Box<dyn nn::Assistant>,
        by_default: bool,
    ) {
        self.drafters
            .attach_assistant(AssistantDrafter::new(name, assistant));
        self.draft_by_default = by_default;
    }

    /// Loads `dflash`, called `name`, beside this one as its draft model (a DFlash block
    /// drafter fitted to this model when it was read), replacing any other; `by_default` as
    /// for [`LoadedModel::attach_draft`]. This model then offers the layers it taps as every
    /// forward's conditioning, and the depth controller searches no deeper than a block. A
    /// model whose checkpoint ships its own head is refused: its head reads the final states
    /// the taps would replace.
    pub fn attach_block_drafter(
        &mut self,
        name: String,
        dflash: nn::arch::dflash::DFlash,
        by_default: bool,
    ) -> Result<()> {
        if self.model.draft_head().is_some() {
            return Err(StepError::Unsupported(format!(
                "`{name}` is a block drafter, and this model drafts with its own head, which \
                 reads the states a block drafter's taps replace"
            )));
        }
        self.model.tap_layers(dflash.taps())?;
        let drafter = BlockDrafter::new(name, dflash);
        self.controllers
            .cap(DrafterKind::Model, drafter.max_depth());
        self.drafters.attach_block(drafter);
        self.draft_by_default = by_default;
        Ok(())
    }

    /// The draft model's name, when one is loaded beside this one.
    pub fn draft_name(&self) -> Option<&str> {
        self.drafters.draft_name()
    }

    /// Keeps what serving teaches the loop (the depth controllers) in `dir`: read now, written
    /// as it learns and when the model is unloaded.
    pub fn keep_state_in(&mut self, dir: std::path::PathBuf) {
        let caps = self.controllers.caps();
        self.controllers = Controllers::persisted(dir, self.draft_name());
        for (kind, deepest) in caps {
            self.controllers.cap(kind, deepest);
        }
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

    /// Bytes it plans for beyond its weights: one sequence's KV of
    /// [`MIN_KV_RESERVATION_TOKENS`] (or its whole context, when shorter) and its prefix
    /// cache's budget.
    pub fn planned_bytes(&self) -> usize {
        let tokens = self.context_length.min(MIN_KV_RESERVATION_TOKENS);
        self.config
            .kv_bytes(self.model.as_ref(), tokens)
            .saturating_add(self.prefix.budget())
    }

    /// KV bytes its running sequences reserve ([`LoadedModel::reservation`]).
    pub fn kv_reserved(&self) -> usize {
        self.sequences
            .iter()
            .map(|s| self.reservation(&s.job))
            .fold(0, usize::saturating_add)
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
            kv_reserved: self.kv_reserved(),
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

    /// The ids of the images and audio segments whose features it keeps, as request handlers
    /// see them.
    pub fn encoded_ids(&self) -> Arc<EncodedIds> {
        self.encoded.ids()
    }

    pub(super) fn index_of(&self, id: SequenceId) -> Option<usize> {
        self.sequences.iter().position(|s| s.id == id)
    }

    pub(super) fn has_grammar(&self, id: SequenceId) -> bool {
        self.index_of(id)
            .is_some_and(|i| self.sequences[i].job.grammar.is_some())
    }
}
