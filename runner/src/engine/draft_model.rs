//! A draft model: a second, smaller model with the target's vocabulary, loaded beside it, that
//! drafts for the sequences asking for it (`draft: "<model>"`, Modelfile `DRAFT`).
//!
//! Each such sequence has caches of its own in the draft model ([`DraftCaches`]), holding a
//! prefix of the tokens the target's caches hold. A round first feeds the draft what it has
//! not seen — the tokens committed since its last round (one, or two when every draft was
//! accepted and the last draft was never fed) and the round's first token — then its argmax,
//! fed back, once per further draft token. Rows of every sequence with the same feed width and
//! depth share each forward, and the drafts are read back once. After verification the draft
//! caches rewind with the target's to what was committed.
//!
//! A greedy or seeded request's drafts are the draft model's argmax: deterministic, verified as
//! one-hot proposals, lossless at any temperature (see [`speculate::verify_positional`]), and a
//! seeded request's text does not depend on the depth. An unseeded request at T > 0 draws its
//! drafts from the draft's own sampling distribution — the request's sampler chain applied to
//! the draft's logits, penalties seeing the earlier drafts — and hands those distributions to
//! verification: accepted with min(1, p/q), they are accepted far more often than an argmax
//! that the target would have sampled with probability p.
//!
//! The draft model has a prefix trie of its own beside the target's: a sequence's draft
//! caches start from the longest prefix of its prompt that the draft has seen, and what they
//! hold when the sequence retires (finished or cancelled) is recorded, so the next turn of a
//! conversation does not feed the draft its history again. The rest of the context is caught
//! up a prefill chunk per round, with no drafts in those rounds, so no step stalls behind a
//! long catch-up. The draft's trie holds as many tokens as the target's: its byte budget is the
//! target's scaled by their KV sizes.
//!
//! While the depth controller finds that drafting does not pay, the sequence decodes plainly
//! and the draft is not fed. A probe after such a stretch would first have to catch the draft
//! up on everything it skipped, at the draft's prefill cost per token, however rarely it
//! probes; instead the draft starts again from the last [`PROBE_WINDOW`] tokens (its caches
//! then hold a window of the text rather than a prefix, and are not recorded in its trie).
//! Drafts from a window may be accepted less often; they are verified like any other.

use std::collections::HashMap;

use kvcache::LayerCache;
use mlx::{Array, Dtype};
use nn::{Batch, Model};
use prefix_trie::SessionId;
use sampler::Sampler;
use speculate::{Commit, Draft, Drafter, Proposal};

use crate::engine::draft_context::DraftContext;
use crate::engine::prefix_cache::PrefixCache;
use crate::engine::sequence::{self, Sequence, SequenceId};
use crate::engine::speculating::MAX_DRAFT_DEPTH;
use crate::engine::step::StepError;

/// The tokens a draft restarts from after a plain stretch left it further behind.
pub const PROBE_WINDOW: usize = 32;

/// A loaded draft model.
pub struct DraftModel {
    name: String,
    model: Box<dyn Model>,
    /// The most context tokens it catches up on in one round.
    catch_up: usize,
    /// What earlier sequences fed it, by prefix.
    prefix: PrefixCache,
    /// The caches of each sequence drafting with it.
    live: HashMap<SequenceId, DraftCaches>,
}

/// How a draft model is served beside its target.
#[derive(Debug, Clone, Copy)]
pub struct DraftServing {
    /// The most context tokens it catches up on in one round (the target's prefill chunk).
    pub catch_up: usize,
    /// The target's prefix-cache budget, bytes: the draft's trie holds as many tokens.
    pub target_cache_bytes: usize,
    /// The prefix-cache capture interval.
    pub capture_interval: usize,
}

impl DraftModel {
    /// `model`, called `name`, as a draft for `target`, served as `serving` says: refused
    /// unless both score the same vocabulary (`from_store` also compares their tokenizers token
    /// by token), and unless its caches can be rewound after a rejected draft (recurrent layers
    /// cannot yet).
    pub fn new(
        name: String,
        model: Box<dyn Model>,
        target: &dyn Model,
        serving: DraftServing,
    ) -> Result<DraftModel, StepError> {
        let (ours, theirs) = (model.spec().vocab_size, target.spec().vocab_size);
        if ours != theirs {
            return Err(StepError::Unsupported(format!(
                "draft model `{name}` scores {ours} tokens and the target {theirs}: \
                 a draft model needs the target's vocabulary"
            )));
        }
        let caches = fresh_caches(&name, model.as_ref())?;
        // The same number of tokens as the target's trie, at the draft's bytes per token.
        let sample = 1024;
        let budget = (serving.target_cache_bytes as f64 * model.spec().state_bytes(sample) as f64
            / target.spec().state_bytes(sample).max(1) as f64) as usize;
        let prefix = PrefixCache::new(&caches, budget, serving.capture_interval)?;
        Ok(DraftModel {
            name,
            model,
            catch_up: serving.catch_up.max(1),
            prefix,
            live: HashMap::new(),
        })
    }

    /// Its name, as requests give it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model.
    pub fn model(&self) -> &dyn Model {
        self.model.as_ref()
    }

    /// Bytes its prefix trie holds.
    pub fn cache_bytes(&self) -> usize {
        self.prefix.bytes()
    }

    /// Caches for a sequence whose prompt is `prompt`, holding the longest prefix of it the
    /// draft's trie has, with captures scheduled (at `turn_starts` among others).
    fn start(&mut self, prompt: &[u32], turn_starts: &[usize]) -> Result<DraftCaches, StepError> {
        let mut caches = fresh_caches(&self.name, self.model.as_ref())?;
        match self.prefix.begin(prompt, &[], turn_starts, &mut caches) {
            Ok(restored) => Ok(DraftCaches {
                caches,
                start: 0,
                held: restored.restore_at,
                session: Some(restored.session),
                skipped_plainly: false,
            }),
            Err(e) => {
                tracing::warn!("the draft model's prefix cache not used for a request: {e}");
                Ok(DraftCaches {
                    caches: fresh_caches(&self.name, self.model.as_ref())?,
                    start: 0,
                    held: 0,
                    session: None,
                    skipped_plainly: false,
                })
            }
        }
    }

    /// Records what a retiring sequence's draft caches hold — a prefix of its `tokens` — in
    /// the draft's trie and drops them, then evicts down to its budget.
    fn close(&mut self, tokens: &[u32], caches: &mut DraftCaches) {
        let Some(session) = caches.session.take() else {
            return;
        };
        if caches.start > 0 {
            // A window of the text is no prefix to record.
            self.prefix.abandon_session(session);
            return;
        }
        let held = caches.held.min(tokens.len());
        let recorded = caches
            .rewind(held)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                let captures = sequence::take_captures(&mut caches.caches);
                self.prefix
                    .close_caches(session, &tokens[..held], &[], captures, &caches.caches)
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = recorded {
            tracing::warn!("the draft model's prefix cache: recording a request failed: {e}");
        }
        // Dropping the caches copies out the lazy snapshots the trie took of them, so the
        // eviction below counts their bytes.
        caches.caches.clear();
        caches.held = 0;
        if let Err(e) = self.prefix.evict() {
            tracing::warn!("the draft model's prefix cache: eviction failed: {e}");
        }
    }

    /// Ends a failed sequence's draft session without recording it.
    fn abandon(&mut self, caches: &mut DraftCaches) {
        if let Some(session) = caches.session.take() {
            self.prefix.abandon_session(session);
        }
    }
}

/// The draft model as the engine's drafter: one forward per draft position for every
/// sequence of the same feed width and depth, its caches kept level with the target's.
impl<'a> Drafter<DraftContext<'a>, StepError> for DraftModel {
    fn name(&self) -> &str {
        &self.name
    }

    /// Its caches start from its own prefix trie. (It needs no `settle`: the draft is fed
    /// lazily, when it drafts.)
    fn begin(
        &mut self,
        sequence: SequenceId,
        prompt: &[u32],
        turn_starts: &[usize],
    ) -> Result<(), StepError> {
        let caches = self.start(prompt, turn_starts)?;
        if let Some(mut stale) = self.live.insert(sequence, caches) {
            self.abandon(&mut stale);
        }
        Ok(())
    }

    fn propose(
        &mut self,
        ctx: &mut DraftContext<'a>,
        proposals: &mut [Proposal],
    ) -> Result<(), StepError> {
        draft_by_model(self, ctx, proposals)
    }

    fn commit(&mut self, sequence: SequenceId, commit: Commit<'_>) -> Result<(), StepError> {
        let caches = self.live.get_mut(&sequence).ok_or_else(no_caches)?;
        caches.rewind(commit.held)?;
        if commit.plain {
            caches.skipped_plainly = true;
        }
        Ok(())
    }

    fn end(&mut self, sequence: SequenceId, context: &[u32], intact: bool) {
        let Some(mut caches) = self.live.remove(&sequence) else {
            return;
        };
        if intact {
            self.close(context, &mut caches);
        } else {
            self.abandon(&mut caches);
        }
    }
}

fn no_caches() -> StepError {
    StepError::Internal("a sequence drafting with the draft model has no draft caches".into())
}

/// Fresh caches of `model` for one sequence, refused for layers that cannot roll back.
fn fresh_caches(name: &str, model: &dyn Model) -> Result<Vec<Option<LayerCache>>, StepError> {
    let caches = model.new_caches_rewindable(MAX_DRAFT_DEPTH)?;
    if caches
        .iter()
        .flatten()
        .any(|c| matches!(c, LayerCache::Recurrent(_)))
    {
        return Err(StepError::Unsupported(format!(
            "draft model `{name}` has recurrent layers, which cannot roll a rejected draft \
             back yet"
        )));
    }
    Ok(caches)
}

/// One sequence's caches in the draft model. They hold the sequence's tokens `start..held`
/// (`start` is 0 unless the draft restarted from a window after a plain stretch): never more
/// than the target's caches, often fewer (the draft is fed lazily, when it drafts).
struct DraftCaches {
    caches: Vec<Option<LayerCache>>,
    /// The first of the sequence's tokens the caches hold, at the draft's position 0.
    start: usize,
    held: usize,
    /// Its session in the draft's prefix trie.
    session: Option<SessionId>,
    /// Whether the sequence decoded plainly since the draft last drafted.
    skipped_plainly: bool,
}

impl DraftCaches {
    /// Back to at most `keep` tokens, after a round committed the target's caches to `keep`.
    fn rewind(&mut self, keep: usize) -> Result<(), StepError> {
        if self.held > keep {
            for cache in self.caches.iter_mut().flatten() {
                cache.rewind(keep.saturating_sub(self.start))?;
            }
            self.held = keep;
        }
        Ok(())
    }

    /// The draft's position of the sequence's token `at`, one the caches do not precede.
    fn position(&self, at: usize) -> Result<usize, StepError> {
        at.checked_sub(self.start)
            .ok_or_else(|| StepError::Internal("a draft-model row starts before its window".into()))
    }

    /// Tokens the caches hold, checked against the `held` tokens of the target's.
    fn held_within(&self, target_held: usize) -> Result<usize, StepError> {
        if self.held > target_held {
            return Err(StepError::Internal(
                "a draft model's caches ran ahead of the target's".into(),
            ));
        }
        Ok(self.held)
    }
}

/// What a sequence's draft model does this round.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Work {
    /// Feed this many committed tokens it has not seen, and draft nothing.
    CatchUp(usize),
    /// Feed the unseen committed tokens and the round's first token (this many in all), then
    /// draft `depth` tokens.
    Draft { feed: usize, depth: usize },
}

/// Drafts the proposals of sequences drafting with `draft`, or catches their draft caches up
/// when they are too far behind to draft this round (their drafts stay empty).
fn draft_by_model(
    draft: &mut DraftModel,
    ctx: &mut DraftContext<'_>,
    proposals: &mut [Proposal],
) -> Result<(), StepError> {
    // Each group's proposals, with their sequences' indices in the step.
    let mut groups: HashMap<Work, Vec<(usize, usize)>> = HashMap::new();
    for (p, proposal) in proposals.iter_mut().enumerate() {
        if proposal.depth == 0 {
            continue; // The draft stays behind until it drafts again.
        }
        let index = ctx.index_of(proposal.sequence)?;
        let seq = &ctx.sequences[index];
        let caches = draft
            .live
            .get_mut(&proposal.sequence)
            .ok_or_else(no_caches)?;
        let unseen = seq.tokens.len() - caches.held_within(seq.tokens.len())?;
        let restart = caches.skipped_plainly && unseen > PROBE_WINDOW;
        caches.skipped_plainly = false;
        if restart {
            caches.caches = fresh_caches(&draft.name, draft.model.as_ref())?;
            caches.start = seq.tokens.len() - PROBE_WINDOW;
            caches.held = caches.start;
        }
        let unseen = if restart { PROBE_WINDOW } else { unseen };
        let work = if unseen + 1 > draft.catch_up {
            proposal.catching_up = true;
            Work::CatchUp(draft.catch_up)
        } else {
            Work::Draft {
                feed: unseen + 1,
                depth: proposal.depth,
            }
        };
        groups.entry(work).or_default().push((index, p));
    }
    for (work, mut group) in groups {
        // Rows follow the order of the step's sequences.
        group.sort_unstable();
        let rows: Vec<Row> = group
            .iter()
            .map(|&(index, p)| Row {
                index,
                id: proposals[p].sequence,
                first: proposals[p].first,
            })
            .collect();
        match work {
            Work::CatchUp(width) => catch_up(draft, ctx, &rows, width)?,
            Work::Draft { feed, depth } => {
                let drafts = draft_rows(draft, ctx, &rows, feed, depth)?;
                for (&(_, p), drafted) in group.iter().zip(drafts) {
                    proposals[p].draft = drafted;
                }
            }
        }
    }
    Ok(())
}

/// A sequence drafting this round: its index in the step, its id and its round's first token.
struct Row {
    index: usize,
    id: SequenceId,
    first: u32,
}

/// Runs `f` over the draft caches of `ids`, in that order, lent out of `live` together for
/// one forward and put back whatever `f` returns.
fn with_caches<T>(
    live: &mut HashMap<SequenceId, DraftCaches>,
    ids: &[SequenceId],
    f: impl FnOnce(&mut [DraftCaches]) -> Result<T, StepError>,
) -> Result<T, StepError> {
    let mut lent = Vec::with_capacity(ids.len());
    for id in ids {
        match live.remove(id) {
            Some(caches) => lent.push(caches),
            None => break,
        }
    }
    let result = if lent.len() == ids.len() {
        f(&mut lent)
    } else {
        Err(no_caches())
    };
    for (id, caches) in ids.iter().zip(lent) {
        live.insert(*id, caches);
    }
    result
}

/// The layer caches of each of `lent`, for one forward.
fn layer_caches(lent: &mut [DraftCaches]) -> Vec<&mut [Option<LayerCache>]> {
    lent.iter_mut().map(|c| c.caches.as_mut_slice()).collect()
}

/// Feeds each of `rows`' draft caches the next `width` committed tokens it has not seen.
fn catch_up(
    draft: &mut DraftModel,
    ctx: &DraftContext<'_>,
    rows: &[Row],
    width: usize,
) -> Result<(), StepError> {
    let ids: Vec<SequenceId> = rows.iter().map(|row| row.id).collect();
    let model = draft.model.as_ref();
    with_caches(&mut draft.live, &ids, |lent| {
        let mut feeds = Vec::with_capacity(lent.len());
        for (caches, row) in lent.iter().zip(rows) {
            let seq = &ctx.sequences[row.index];
            let held = caches.held_within(seq.tokens.len())?;
            let tokens = seq.tokens.get(held..held + width).ok_or_else(|| {
                StepError::Internal("a draft model catches up past the target's tokens".into())
            })?;
            feeds.push((tokens.to_vec(), caches.position(held)?));
        }
        let borrowed: Vec<(&[u32], usize)> =
            feeds.iter().map(|(t, at)| (t.as_slice(), *at)).collect();
        let batch = Batch::rows(&borrowed)?;
        let mut caches = layer_caches(lent);
        let out = model.forward_rows(&batch, &mut caches)?;
        // Nothing reads the output: evaluate the caches so the graph does not grow across
        // steps.
        let mut arrays = vec![out.hidden];
        for cache in caches.iter().flat_map(|c| c.iter().flatten()) {
            arrays.extend(cache.state_arrays());
        }
        mlx::eval(&arrays)?;
        for caches in lent.iter_mut() {
            caches.held += width;
        }
        Ok(())
    })
}

/// Runs the draft for `rows` (each a sequence and its round's first token): feeds each its
/// `feed` unseen tokens (the round's first token last), then feeds back each row's next draft
/// until `depth` tokens are drafted; returns each row's draft, read in one go.
fn draft_rows(
    draft: &mut DraftModel,
    ctx: &DraftContext<'_>,
    rows: &[Row],
    feed: usize,
    depth: usize,
) -> Result<Vec<Draft>, StepError> {
    let ids: Vec<SequenceId> = rows.iter().map(|row| row.id).collect();
    let model = draft.model.as_ref();
    let sampler = ctx.sampler;
    with_caches(&mut draft.live, &ids, |lent| {
        let mut feeds = Vec::with_capacity(rows.len());
        let mut drawers = Vec::with_capacity(rows.len());
        for (caches, row) in lent.iter().zip(rows) {
            let seq = &ctx.sequences[row.index];
            let held = caches.held_within(seq.tokens.len())?;
            let mut tokens = seq.tokens[held..].to_vec();
            tokens.push(row.first);
            debug_assert_eq!(tokens.len(), feed);
            feeds.push((tokens, caches.position(held)?));
            drawers.push(draws_drafts(seq).then_some(seq.id));
        }
        // Where the round's first token lands (the draft's position): every draft token
        // follows.
        let firsts: Vec<usize> = feeds.iter().map(|(t, at)| at + t.len() - 1).collect();
        let borrowed: Vec<(&[u32], usize)> =
            feeds.iter().map(|(t, at)| (t.as_slice(), *at)).collect();
        let mut caches = layer_caches(lent);
        let out = model.forward_rows(&Batch::rows(&borrowed)?, &mut caches)?;
        let last = out.hidden.slice_axis(1, feed as i32 - 1, feed as i32)?;
        let mut next = next_drafts(model, sampler, &drawers, &last, &[])?;
        let mut drafted = vec![next.tokens.clone()];
        let mut drawn = vec![next.probs];
        for step in 1..depth {
            let positions = firsts.iter().map(|&first| first + step).collect();
            let out =
                model.forward_rows(&Batch::from_device(&next.tokens, positions)?, &mut caches)?;
            next = next_drafts(model, sampler, &drawers, &out.hidden, &drafted)?;
            drafted.push(next.tokens.clone());
            drawn.push(next.probs);
        }
        drop(caches);
        let (drafted, drawn) = read_drafts(&drafted, &drawn, drawers.len())?;
        // The caches hold the round's first token and every draft but the last.
        for (caches, &first) in lent.iter_mut().zip(&firsts) {
            caches.held = caches.start + first + depth;
        }
        drafts_of(&drafted, drawn, depth)
    })
}

/// Reads a round's drafts in one evaluation: `drafted` holds each draft step's `[rows, 1]`
/// tokens, `drawn` each step's distribution of every drawing row. Returns the tokens,
/// `[rows, depth]` row after row, and each drawing row's distributions `[depth, V]`, still on
/// the device but evaluated.
fn read_drafts(
    drafted: &[Array],
    drawn: &[Vec<Option<Array>>],
    rows: usize,
) -> Result<(Vec<i32>, Vec<Option<Array>>), StepError> {
    // Each drawing row's distributions, `[depth, V]`, read with the drafts.
    let drawn: Vec<Option<Array>> = (0..rows)
        .map(|row| {
            let per_step: Option<Vec<Array>> = drawn.iter().map(|step| step[row].clone()).collect();
            per_step.map(|rows| mlx::concatenate(&rows, 0)).transpose()
        })
        .collect::<Result<_, _>>()?;
    let drafted = mlx::concatenate(drafted, 1)?;
    let mut to_read = vec![drafted.clone()];
    to_read.extend(drawn.iter().flatten().cloned());
    mlx::eval(&to_read)?;
    Ok((drafted.to_vec::<i32>()?, drawn))
}

/// Each row's draft of `depth` tokens from the host's `drafted` ids: one-hot where the row
/// took the argmax, with its distributions where it drew its drafts (`drawn`).
fn drafts_of(
    drafted: &[i32],
    drawn: Vec<Option<Array>>,
    depth: usize,
) -> Result<Vec<Draft>, StepError> {
    let mut drafts = Vec::with_capacity(drawn.len());
    for (row, probs) in drawn.into_iter().enumerate() {
        let tokens: Vec<u32> = drafted[row * depth..(row + 1) * depth]
            .iter()
            .map(|&t| u32::try_from(t).unwrap_or(0))
            .collect();
        drafts.push(match probs {
            None => Draft::one_hot(tokens),
            Some(probs) => {
                let probs = probs.to_vec::<f32>()?;
                let vocab = probs.len() / depth.max(1);
                Draft::dense(
                    tokens,
                    probs.chunks(vocab.max(1)).map(<[f32]>::to_vec).collect(),
                )
            }
        });
    }
    Ok(drafts)
}

/// Whether `seq` draws its drafts from the draft's sampling distribution rather than taking
/// its argmax: an unseeded request at T > 0 (a seeded one keeps argmax drafts, whose
/// positional verification keeps its text independent of the depth).
fn draws_drafts(seq: &Sequence) -> bool {
    !seq.job.sampling.is_greedy() && seq.job.sampling.seed.is_none()
}

/// One draft step's proposals: `[rows, 1]` ids, and each drawing row's `[1, V]` distribution.
struct NextDrafts {
    tokens: Array,
    probs: Vec<Option<Array>>,
}

/// The next draft of each row of `hidden` `[rows, 1, H]`: the argmax, or for a row whose
/// `drawers` entry names its sampler slot, a draw from the request's sampling distribution over
/// the draft's logits after the row's earlier drafts (`drafted`, `[rows, 1]` per step).
fn next_drafts(
    model: &dyn Model,
    sampler: &Sampler,
    drawers: &[Option<SequenceId>],
    hidden: &Array,
    drafted: &[Array],
) -> Result<NextDrafts, StepError> {
    let logits = model.unembed(hidden)?;
    let argmax = logits.argmax(2, false)?.astype(Dtype::I32)?;
    if drawers.iter().all(Option::is_none) {
        return Ok(NextDrafts {
            tokens: argmax,
            probs: vec![None; drawers.len()],
        });
    }
    let logits = logits.astype(Dtype::F32)?;
    let earlier = match drafted {
        [] => None,
        steps => Some(mlx::concatenate(steps, 1)?),
    };
    let mut tokens = Vec::with_capacity(drawers.len());
    let mut probs = Vec::with_capacity(drawers.len());
    for (row, drawer) in drawers.iter().enumerate() {
        let r = row as i32;
        let Some(slot) = drawer else {
            tokens.push(argmax.slice_axis(0, r, r + 1)?);
            probs.push(None);
            continue;
        };
        let row_logits = logits.slice_axis(0, r, r + 1)?.squeeze(&[0])?;
        let chain = match &earlier {
            Some(earlier) => Some(earlier.slice_axis(0, r, r + 1)?.squeeze(&[0])?),
            None => None,
        };
        let q = sampler
            .distribution(*slot, &row_logits, chain.as_ref())?
            .probs;
        let key = mlx::random::key(rand::random::<u64>())?;
        let token = mlx::random::categorical(&q.log()?, 1, &key)?;
        tokens.push(token.astype(Dtype::I32)?.reshape(&[1, 1])?);
        probs.push(Some(q));
    }
    Ok(NextDrafts {
        tokens: mlx::concatenate(&tokens, 0)?,
        probs,
    })
}
