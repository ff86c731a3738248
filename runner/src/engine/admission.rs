//! Admission: the queue's jobs become running sequences. Cancelled jobs leave the queue; a
//! waiting job is admitted while its KV reservation fits the budget, refused with the error
//! that keeps it from running (an empty or too long prompt, media the model cannot take as
//! laid out, a drafter it cannot draft with), or started with its caches restored to the
//! longest prefix the trie (or a running sequence) holds.

use std::collections::VecDeque;
use std::time::Instant;

use nn::ImageGrid;
use prefix_trie::SessionId;

use crate::engine::job::{DoneReason, DrafterKind, Event, Job, PromptMedia, Speculation, Stats};
use crate::engine::loaded_model::{LoadedModel, fresh_caches};
use crate::engine::prompt_media;
use crate::engine::sequence::{Phase, Sequence, SequenceId};
use crate::engine::speculating::Speculating;
use crate::engine::step::{Result, StepError};

/// Draft tokens per round when a request names no limit.
const DEFAULT_DRAFT_DEPTH: usize = 8;

/// A new sequence's caches, holding the longest prefix of its prompt found cached.
struct Restored {
    caches: Vec<Option<kvcache::LayerCache>>,
    /// Its trie session, when the trie was used.
    session: Option<SessionId>,
    /// Prompt tokens the caches hold.
    at: usize,
}

/// What a new sequence is given besides its caches ([`LoadedModel::enrol`]).
struct Enrolled {
    id: SequenceId,
    rope_delta: i64,
    speculating: Option<Speculating>,
}

impl LoadedModel {
    pub(super) fn drop_cancelled_queued(&mut self) {
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
    pub(super) fn reservation(&self, job: &Job) -> usize {
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
        self.config
            .kv_bytes(self.model.as_ref(), tokens)
            .saturating_add(draft)
    }

    /// The drafter `job` asks for (or the server's, when it leaves the choice to the server)
    /// and its deepest round, if it speculates.
    fn drafter_of(&self, job: &Job) -> Option<(DrafterKind, Option<usize>)> {
        // A draft model the model's Modelfile names drafts unless a request says otherwise.
        let default = match (self.drafters.draft_name(), self.config.draft) {
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

    /// Admits waiting jobs while their reservations, beside this model's running sequences'
    /// and `reserved_elsewhere` (the other resident models'), fit the KV budget. A model with
    /// nothing running always admits one, so no model waits on another's long generation.
    pub(super) fn admit(&mut self, reserved_elsewhere: usize) {
        let mut reserved = self.kv_reserved().saturating_add(reserved_elsewhere);
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
        if let Err(e) = self.check(&job) {
            return refuse(job, e);
        }
        let restored = match self.restore(&job) {
            Ok(restored) => restored,
            Err(e) => return refuse(job, e),
        };
        let enrolled = match self.enrol(&job, restored.at) {
            Ok(enrolled) => enrolled,
            Err(e) => {
                if let Some(session) = restored.session {
                    self.prefix.abandon_session(session);
                }
                return refuse(job, e);
            }
        };
        let prompt_len = job.prompt.len();
        let budget = job.max_tokens.min(self.context_length - prompt_len);
        let tokens = job.prompt[..restored.at].to_vec();
        tracing::debug!(
            sequence = enrolled.id,
            prompt = prompt_len,
            restored = restored.at,
            "admitted"
        );
        Some(Sequence {
            id: enrolled.id,
            caches: restored.caches,
            tokens,
            trie_session: restored.session,
            phase: Phase::Prefilling,
            budget,
            stats: Stats {
                prompt_tokens: prompt_len,
                cached_tokens: restored.at,
                images: job.images.iter().filter(|m| !m.is_audio()).count(),
                audio: job.images.iter().filter(|m| m.is_audio()).count(),
                ..Stats::default()
            },
            admitted: Instant::now(),
            first_token: None,
            captures: Vec::new(),
            speculating: enrolled.speculating,
            rope_delta: enrolled.rope_delta,
            head_states: Default::default(),
            job,
        })
    }

    /// What keeps `job` from running on this model, if anything does: an empty prompt, one
    /// that leaves no room in the context for a generated token, or media the model cannot
    /// take as laid out.
    fn check(&self, job: &Job) -> Result<()> {
        let prompt = job.prompt.len();
        if prompt == 0 {
            return Err(StepError::EmptyPrompt);
        }
        if prompt >= self.context_length {
            return Err(StepError::PromptTooLong {
                prompt,
                context: self.context_length,
            });
        }
        prompt_media::check_media(self.model.as_ref(), job)
    }

    /// Caches for `job` holding the longest prefix of its prompt that the trie holds, or that
    /// a running sequence holds further, with its trie session. Reusing is only a saving: when
    /// the trie or the copy fails, the job starts from fresh caches (an error only when even
    /// those cannot be made).
    fn restore(&mut self, job: &Job) -> Result<Restored> {
        let mut caches = fresh_caches(self.model.as_ref(), self.config.kv_storage)?;
        if !self.reuses_prefixes {
            return Ok(Restored {
                caches,
                session: None,
                at: 0,
            });
        }
        let media = job.media_items(job.prompt.len());
        let begun = self
            .prefix
            .begin(&job.prompt, &media, &job.turn_starts, &mut caches);
        let (session, at, capture_at) = match begun {
            Ok(begun) => (Some(begun.session), begun.restore_at, begun.capture_at),
            Err(e) => {
                tracing::warn!("prefix cache not used for a request: {e}");
                caches = fresh_caches(self.model.as_ref(), self.config.kv_storage)?;
                (None, 0, Vec::new())
            }
        };
        let mut restored = Restored {
            caches,
            session,
            at,
        };
        let Some((from, common)) = self.live_share(job, at) else {
            return Ok(restored);
        };
        let source = &self.sequences[from].caches;
        match copy_from_live(source, &mut restored.caches, common, &capture_at) {
            Ok(()) => restored.at = common,
            Err(e) => {
                tracing::warn!("copying a prefix from a running request failed: {e}");
                if let Some(session) = restored.session.take() {
                    self.prefix.abandon_session(session);
                }
                restored.caches = fresh_caches(self.model.as_ref(), self.config.kv_storage)?;
                restored.at = 0;
            }
        }
        Ok(restored)
    }

    /// Gives `job`, whose caches hold its first `restored` prompt tokens, what a running
    /// sequence needs besides its caches: its rope delta there, an id, a sampler slot and,
    /// when it speculates, its drafter's attention. On failure it holds no sampler slot.
    fn enrol(&mut self, job: &Job, restored: usize) -> Result<Enrolled> {
        // The restored prefix's images place the rotary positions of what follows.
        let rope_delta = self.rope_delta_of(job, restored)?;
        let id = self.next_id;
        self.next_id += 1;
        self.sampler.add(id, job.sampling.clone(), &job.prompt)?;
        let speculating = self.speculation_for(job, id).inspect_err(|_| {
            let _ = self.sampler.remove(id);
        })?;
        Ok(Enrolled {
            id,
            rope_delta,
            speculating,
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
        if drafter == DrafterKind::Mtp && self.model.draft_head().is_none() {
            return Err(StepError::Request(
                "draft `mtp`: this model's checkpoint ships no multi-token-prediction head".into(),
            ));
        }
        self.drafters
            .of(drafter)?
            .begin(id, &job.prompt, &job.turn_starts)?;
        let reads_target_states = drafter == DrafterKind::Mtp
            || (drafter == DrafterKind::Model && self.drafters.model_reads_target_states());
        Ok(Some(
            Speculating::new(
                drafter,
                max_depth.unwrap_or(DEFAULT_DRAFT_DEPTH),
                &job.sampling,
            )
            .reading_target_states(reads_target_states),
        ))
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
