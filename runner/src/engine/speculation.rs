//! Speculative rounds inside the step loop.
//!
//! A speculating sequence leaves the pipelined decode forward: each step it runs one *round*
//! (while its depth controller finds that drafting does not pay, it decodes in the plain
//! forward instead, see [`decide_depths`] and [`plain_step`]). [`Rounds`] runs them.
//! The host knows the round's first token (the last one committed, not yet in the caches); the
//! sequence's drafter proposes up to `k` more, the depth controller picking `k`; one forward
//! over `[next, d1..dk]` yields the target's logits at every position; the sampler turns them
//! into the distributions it would draw from (penalties see the drafts before each position);
//! one host read; [`speculate::verify`] accepts a prefix of the drafts losslessly and draws
//! the token after it; the caches rewind past the rejected drafts. Rounds of every speculating
//! sequence in a step share their forwards (one per draft width) and their one host read.
//!
//! Under a grammar, drafts are cut where the grammar stops allowing them, and each position's
//! distribution is masked by the grammar as it stands after the drafts before it (the matcher
//! walks the draft and rolls back). Drafts come from the sequence's drafter, whatever its kind,
//! through [`speculate::Drafter`] (`drafters`): the rounds of a step hand each drafter all of
//! its sequences' proposals at once, and tell it every committed run. Recurrent layers roll
//! back through captures taken inside the round (`rollback`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use mlx::{Array, Dtype};
use nn::{Batch, Model};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sampler::Sampler;
use speculate::{Commit, Draft, DraftProbs, Proposal, Verdict};

use crate::engine::controllers::Controllers;
use crate::engine::draft_context::DraftContext;
use crate::engine::drafters::Drafters;
use crate::engine::job::{DoneReason, DrafterKind, TokenLogprobs};
use crate::engine::rollback::{self, RoundCaptures};
use crate::engine::sequence::{Outcome, Sequence};
use crate::engine::speculating::Speculating;
use crate::engine::step::{Ending, Result, Step, caches_of, equal_width_groups, of_sequences};

/// This step's speculative rounds, over what they borrow from the loaded model and the step:
/// every speculating sequence that knows its next token runs one round (see the module docs).
/// [`Rounds::run`] reads as the round does: plan, draft, constrain, verify, one host read,
/// settle.
pub struct Rounds<'a> {
    /// The target model.
    pub model: &'a dyn Model,
    /// The drafters, one per kind.
    pub drafters: &'a mut Drafters,
    /// The sampler, one slot per sequence.
    pub sampler: &'a mut Sampler,
    /// The depth controllers, one per drafter kind.
    pub controllers: &'a mut Controllers,
    /// The step's sequences.
    pub sequences: &'a mut [Sequence],
    /// The step's state: a sequence whose round fails or ends it is added to its ending.
    pub step: &'a mut Step,
}

/// A planned round: the sequence, its first token and its drafts, and under a grammar the
/// mask before each draft and after the last.
struct Planned {
    /// The sequence's index in the step's sequences.
    index: usize,
    /// The kind of its drafter.
    kind: DrafterKind,
    /// How many drafts the round asks for (0: the round verifies its first token alone).
    depth: usize,
    /// The round's first token, then (once drafted) its drafts.
    tokens: Vec<u32>,
    /// The drafts, once its drafter proposed them.
    draft: Draft,
    /// Whether its drafter spends the round catching up instead of drafting
    /// ([`Proposal::catching_up`]): not a round the depth controller chose, so not one it
    /// learns from.
    catching_up: bool,
    masks: Option<Vec<Vec<u32>>>,
}

impl Planned {
    /// A round of sequence `index` starting from `next`, asking its drafter of `kind` for
    /// `depth` drafts.
    fn new(index: usize, kind: DrafterKind, next: u32, depth: usize) -> Planned {
        Planned {
            index,
            kind,
            depth,
            tokens: vec![next],
            draft: Draft::empty(),
            catching_up: false,
            masks: None,
        }
    }

    /// Cuts the round to `width` tokens, the width of the forward it shares.
    fn cut_to(&mut self, width: usize) {
        self.tokens.truncate(width);
        self.draft.truncate(width - 1);
        if let Some(masks) = &mut self.masks {
            masks.truncate(width);
        }
    }
}

/// A dispatched round, waiting for the host read.
struct Dispatched {
    index: usize,
    tokens: Vec<u32>,
    draft: Draft,
    /// Greedy: `[w]` argmax per position; sampled: `[w, V]` probabilities.
    picks: Array,
    greedy: bool,
    /// `[w, V]` f32 logits, kept when the request wants logprobs.
    logits: Option<Array>,
    /// The grammar's masks of the round's positions (logprobs see only what they allow).
    masks: Option<Vec<Vec<u32>>>,
    /// As [`Planned::catching_up`].
    catching_up: bool,
    /// The target's final states over the round's positions (`[1, w, hidden]`), for the
    /// accepted ones to reach the sequence's drafter head, when it has one.
    states: Option<Array>,
}

impl Dispatched {
    /// What the host read evaluates for this round: its picks, then its logits if kept.
    fn outputs(&self) -> impl Iterator<Item = &Array> {
        std::iter::once(&self.picks).chain(self.logits.as_ref())
    }
}

/// What the depth controllers learn from a step's rounds: they cost `cost` together, among
/// `batch` speculating sequences.
#[derive(Clone, Copy)]
struct RoundCost {
    batch: usize,
    cost: Duration,
}

/// A verified round applied to its sequence: what it commits, and where its caches stand.
struct Accepted {
    /// Drafts the target accepted.
    accepted: usize,
    /// The tokens the round commits: the accepted drafts, then the token drawn after them.
    committed: Vec<u32>,
    /// Where the round's first token sits: the sequence's length before the round.
    start: usize,
    /// What the caches hold now: the round's first token and the accepted drafts.
    keep: usize,
    /// What the recurrent layers captured in the round, to roll back further when the
    /// stream stops early.
    captures: RoundCaptures,
}

impl Accepted {
    /// Applies `verdict` to `round`'s sequence: its caches rewind past the rejected drafts
    /// and its tokens take the round's first token and the accepted drafts.
    fn rewind(seq: &mut Sequence, round: &Dispatched, verdict: Verdict) -> Result<Accepted> {
        let Verdict { accepted, next } = verdict;
        // The caches hold the round's first token and the accepted drafts.
        let start = seq.tokens.len();
        let keep = start + 1 + accepted;
        let captures = rollback::round_captures(&mut seq.caches);
        rollback::rewind_round(&mut seq.caches, &captures, keep)?;
        seq.tokens.extend_from_slice(&round.tokens[..1 + accepted]);
        let mut committed = round.draft.tokens[..accepted].to_vec();
        committed.push(next);
        Ok(Accepted {
            accepted,
            committed,
            start,
            keep,
            captures,
        })
    }

    /// The token drawn after the accepted drafts: the next round's first.
    fn next(&self) -> u32 {
        self.committed[self.accepted]
    }
}

impl Rounds<'_> {
    /// Runs this step's round for every speculating sequence that knows its next token.
    pub fn run(mut self) -> Result<()> {
        let started = Instant::now();
        let mut planned = self.plan()?;
        if planned.is_empty() {
            return Ok(());
        }
        let batch = planned.len();
        self.draft(&mut planned)?;
        let planned = self.constrain(planned);
        let dispatched = self.verify(planned)?;
        // The round's one host read.
        mlx::eval(dispatched.iter().flat_map(Dispatched::outputs))?;
        let cost = RoundCost {
            batch,
            cost: started.elapsed(),
        };
        for round in dispatched {
            self.settle(round, cost)?;
        }
        Ok(())
    }

    /// The rounds starting now, one per sequence that [`starts_round`]: its drafter told the
    /// context once, its depth decided among them all.
    fn plan(&mut self) -> Result<Vec<Planned>> {
        let ready: Vec<usize> = (0..self.sequences.len())
            .filter(|&i| starts_round(&self.sequences[i], &self.step.ending))
            .collect();
        let batch = ready.len();
        let mut planned = Vec::with_capacity(batch);
        for index in ready {
            let seq = &mut self.sequences[index];
            let room = seq.budget.saturating_sub(seq.stats.generated_tokens);
            let id = seq.id;
            let Some(spec) = seq.speculating.as_mut() else {
                continue;
            };
            let Some(next) = spec.next else {
                continue;
            };
            if !spec.settled {
                let mut context = seq.tokens.clone();
                context.push(next);
                self.drafters.of(spec.kind)?.settle(id, &context);
            }
            spec.settled = true;
            let depth = decided_depth(self.controllers, spec, batch, room);
            planned.push(Planned::new(index, spec.kind, next, depth));
        }
        Ok(planned)
    }

    /// Hands each drafter all of its rounds' proposals at once; each draft comes back cut to
    /// the depth its round asked for.
    fn draft(&mut self, planned: &mut [Planned]) -> Result<()> {
        // Each drafter's proposals, with the round each belongs to.
        let mut proposals: HashMap<DrafterKind, Vec<(usize, Proposal)>> = HashMap::new();
        for (p, plan) in planned.iter().enumerate() {
            if plan.depth > 0 {
                let id = self.sequences[plan.index].id;
                let proposal = Proposal::new(id, plan.tokens[0], plan.depth);
                proposals.entry(plan.kind).or_default().push((p, proposal));
            }
        }
        for (kind, rounds) in proposals {
            let (plans, mut rows): (Vec<usize>, Vec<Proposal>) = rounds.into_iter().unzip();
            let mut ctx = DraftContext {
                target: self.model,
                sampler: self.sampler,
                sequences: self.sequences,
            };
            self.drafters.of(kind)?.propose(&mut ctx, &mut rows)?;
            for (p, mut proposal) in plans.into_iter().zip(rows) {
                proposal.draft.truncate(proposal.depth);
                planned[p].draft = proposal.draft;
                planned[p].catching_up = proposal.catching_up;
            }
        }
        Ok(())
    }

    /// Under a grammar, cuts each draft where the grammar stops allowing it and keeps the mask
    /// of each of the round's positions; a sequence whose grammar fails ends, its round with
    /// it. Each round's tokens take its drafts.
    fn constrain(&mut self, mut planned: Vec<Planned>) -> Vec<Planned> {
        for plan in &mut planned {
            let seq = &mut self.sequences[plan.index];
            if let Some(grammar) = seq.job.grammar.as_mut() {
                match masks_along(grammar, &mut plan.draft) {
                    Ok(masks) => plan.masks = Some(masks),
                    Err(e) => {
                        let outcome = Outcome::Failed(format!("structured output: {e}"));
                        self.step.ending.add(seq.id, outcome);
                        continue;
                    }
                }
            }
            plan.tokens.extend_from_slice(&plan.draft.tokens);
        }
        planned.retain(|plan| !self.step.ending.contains(self.sequences[plan.index].id));
        planned
    }

    /// Dispatches the rounds: one verification forward per width (drafts cut to the width of
    /// the forward they share), then each round's distributions from its row of the logits.
    fn verify(&mut self, planned: Vec<Planned>) -> Result<Vec<Dispatched>> {
        let widths: Vec<(usize, usize)> = planned
            .iter()
            .enumerate()
            .map(|(p, plan)| (p, plan.tokens.len()))
            .collect();
        let mut slots: Vec<Option<Planned>> = planned.into_iter().map(Some).collect();
        let mut dispatched = Vec::with_capacity(slots.len());
        for (width, group) in equal_width_groups(widths) {
            let mut plans: Vec<Planned> = group.iter().filter_map(|&p| slots[p].take()).collect();
            // The batch's rows follow the order of `sequences`.
            plans.sort_by_key(|plan| plan.index);
            for plan in &mut plans {
                plan.cut_to(width);
            }
            let (logits, states) = self.forward(&plans, width)?;
            let vocab = usize::try_from(logits.dim(2)?).unwrap_or(0);
            for (row, plan) in plans.into_iter().enumerate() {
                let row_logits = logits
                    .slice_axis(0, row as i32, row as i32 + 1)?
                    .squeeze(&[0])?;
                let row_states = match self.sequences[plan.index].wants_head_states() {
                    true => Some(states.slice_axis(0, row as i32, row as i32 + 1)?),
                    false => None,
                };
                dispatched.push(self.dispatch(plan, row_logits, row_states, vocab)?);
            }
        }
        Ok(dispatched)
    }

    /// The target's f32 logits `[rows, width, V]` over `plans`' tokens, a row each, from one
    /// forward, and the final states a drafter head reads (`nn::Forward::conditioning`).
    /// Wider than one token, the recurrent layers capture after each position, so the round
    /// can roll back to any of them.
    fn forward(&mut self, plans: &[Planned], width: usize) -> Result<(Array, Array)> {
        let rows: Vec<(&[u32], usize)> = plans
            .iter()
            .map(|plan| {
                let held = self.sequences[plan.index].tokens.len();
                (plan.tokens.as_slice(), held)
            })
            .collect();
        let indices: Vec<usize> = plans.iter().map(|plan| plan.index).collect();
        let forward_batch = of_sequences(Batch::rows(&rows)?, self.sequences, &indices)?;
        if width > 1 {
            for &i in &indices {
                let seq = &mut self.sequences[i];
                // What prefill captured for the trie moves out first: the round's own
                // captures are only for rolling it back.
                seq.collect_captures();
                let start = seq.tokens.len();
                rollback::capture_round(&mut seq.caches, start, width)?;
            }
        }
        let out = {
            let mut caches = caches_of(self.sequences, &indices)?;
            self.model.forward_rows(&forward_batch, &mut caches)?
        };
        let logits = self.model.unembed(&out.hidden)?.astype(Dtype::F32)?;
        Ok((logits, out.conditioning().clone()))
    }

    /// `plan`'s distributions, from its `[width, V]` logits: the sampler's chain with the
    /// drafts before each position (penalties see them) and the grammar's masks; a greedy
    /// round keeps only each position's argmax.
    fn dispatch(
        &mut self,
        mut plan: Planned,
        logits: Array,
        states: Option<Array>,
        vocab: usize,
    ) -> Result<Dispatched> {
        let seq = &self.sequences[plan.index];
        let chain = match plan.draft.len() {
            0 => None,
            n => Some(token_array(&plan.draft.tokens, n)?),
        };
        // The model may have more output rows than the tokenizer has tokens (padding); the
        // grammar never allows those.
        for mask in plan.masks.iter_mut().flatten() {
            mask.resize(sampler::mask_words(vocab), 0);
        }
        let masks: Vec<Option<&[u32]>> = plan
            .masks
            .iter()
            .flatten()
            .map(|m| Some(m.as_slice()))
            .collect();
        let distribution =
            self.sampler
                .distribution_masked(seq.id, &logits, chain.as_ref(), &masks)?;
        let greedy = seq.job.sampling.is_greedy();
        let picks = if greedy {
            distribution.probs.argmax(1, false)?
        } else {
            distribution.probs
        };
        Ok(Dispatched {
            index: plan.index,
            tokens: plan.tokens,
            draft: plan.draft,
            picks,
            greedy,
            logits: seq.job.sampling.logprobs.map(|_| logits),
            masks: plan.masks,
            catching_up: plan.catching_up,
            states,
        })
    }

    /// Settles one evaluated round: verifies it, rolls its caches back to what was accepted,
    /// tells the drafter, the sampler and the controller, and streams what it committed. A
    /// round that fails verification ends its sequence.
    fn settle(&mut self, round: Dispatched, cost: RoundCost) -> Result<()> {
        let seq = &self.sequences[round.index];
        let verdict = match verdict_of(&round, seq)? {
            Ok(verdict) => verdict,
            Err(e) => {
                let outcome = Outcome::Failed(format!("speculative verification: {e}"));
                self.step.ending.add(seq.id, outcome);
                return Ok(());
            }
        };
        let logits = round
            .logits
            .as_ref()
            .map(Array::to_vec::<f32>)
            .transpose()?;
        let seq = &mut self.sequences[round.index];
        let accepted = Accepted::rewind(seq, &round, verdict)?;
        // The target's states of the positions its caches now hold reach its head.
        if let Some(states) = &round.states {
            let kept = states.slice_axis(1, 0, 1 + accepted.accepted as i32)?;
            seq.keep_head_states(accepted.start, kept)?;
        }
        self.commit(&round, &accepted, cost)?;
        self.stream(&round, &accepted, logits.as_deref())
    }

    /// Tells the round's drafter and sampler slot what it committed, and its depth controller
    /// what it cost (unless the drafter spent it catching up); counts it in the statistics.
    fn commit(&mut self, round: &Dispatched, accepted: &Accepted, cost: RoundCost) -> Result<()> {
        let seq = &mut self.sequences[round.index];
        let id = seq.id;
        if let Some(spec) = seq.speculating.as_mut() {
            spec.stats.rounds += 1;
            spec.stats.drafted += round.draft.len();
            spec.stats.accepted += accepted.accepted;
            let commit = Commit {
                tokens: &accepted.committed,
                held: accepted.keep,
                plain: false,
            };
            self.drafters.of(spec.kind)?.commit(id, commit)?;
            spec.next = None;
            if !round.catching_up {
                let drafted = round.draft.len();
                let RoundCost { batch, cost } = cost;
                self.controllers
                    .observe(spec.kind, batch, drafted, accepted.accepted, cost);
            }
        }
        self.sampler.commit(id, &accepted.committed)?;
        Ok(())
    }

    /// Streams what the round committed, with logprobs from `logits` (`[width × V]`, when
    /// the request asks for them). A token that ends the sequence keeps nothing after it in
    /// the caches; a sequence that spent its budget or was cancelled ends; any other starts
    /// its next round from the drawn token.
    fn stream(
        &mut self,
        round: &Dispatched,
        accepted: &Accepted,
        logits: Option<&[f32]>,
    ) -> Result<()> {
        let seq = &mut self.sequences[round.index];
        let id = seq.id;
        let now = Instant::now();
        let vocab = logits.map_or(0, |l| l.len() / round.tokens.len().max(1));
        for (position, &token) in accepted.committed.iter().enumerate() {
            let entry = match (logits, seq.job.sampling.logprobs) {
                (Some(l), Some(top)) => {
                    l.get(position * vocab..(position + 1) * vocab).map(|row| {
                        let mask = round.masks.as_ref().and_then(|m| m.get(position));
                        logprobs_of(row, mask.map(Vec::as_slice), token, top)
                    })
                }
                _ => None,
            };
            if let Some(outcome) = self.step.deliver(seq, token, entry, now) {
                // Nothing after this token was streamed: the caches end where it stands.
                let held = (accepted.start + 1 + position).min(accepted.keep);
                // The drafter hears where it ends when the sequence retires.
                rollback::rewind_round(&mut seq.caches, &accepted.captures, held)?;
                seq.tokens.truncate(held);
                self.step.ending.add(id, outcome);
                return Ok(());
            }
        }
        if !seq.has_budget() || seq.cancelled() {
            let reason = if seq.cancelled() {
                DoneReason::Cancelled
            } else {
                DoneReason::Length
            };
            self.step.ending.add(id, Outcome::Done(reason));
        } else if let Some(spec) = seq.speculating.as_mut() {
            spec.next = Some(accepted.next());
        }
        Ok(())
    }
}

/// Whether `seq` starts a round in this step: it speculates, knows its round's first token,
/// does not decode in the plain forward, and does not end in this step.
fn starts_round(seq: &Sequence, ending: &Ending) -> bool {
    !ending.contains(seq.id)
        && seq
            .speculating
            .as_ref()
            .is_some_and(|s| s.next.is_some() && !s.decodes_plainly())
}

/// The depth of `spec`'s next round among `batch` speculating sequences, with `room` tokens
/// left in its budget.
fn round_depth(
    controllers: &mut Controllers,
    spec: &Speculating,
    batch: usize,
    room: usize,
) -> usize {
    controllers
        .depth(spec.kind, batch)
        .min(depth_limit(spec, room))
}

/// The deepest round `spec` may draft with `room` tokens left: a round commits up to depth + 1
/// tokens, never more than the budget has left.
fn depth_limit(spec: &Speculating, room: usize) -> usize {
    spec.max_depth.min(room.saturating_sub(1))
}

/// The depth of `spec`'s round starting now: the one already decided for it (when a plain
/// stretch ended, with a token then still in flight, so clamped to the room left now), else
/// the controller's.
fn decided_depth(
    controllers: &mut Controllers,
    spec: &mut Speculating,
    batch: usize,
    room: usize,
) -> usize {
    match spec.depth.take() {
        Some(depth) => depth.min(depth_limit(spec, room)),
        None => round_depth(controllers, spec, batch, room),
    }
}

/// Decides this step's depth for every sequence about to start a round. One whose controller
/// says that drafting does not pay, and that may, decodes in the pipelined plain forward
/// instead (a round is a host sync per token even at depth 0), until [`plain_step`] hears
/// otherwise from the controller; the others run their rounds at the decided depth.
pub fn decide_depths(controllers: &mut Controllers, sequences: &mut [Sequence], ending: &Ending) {
    let batch = sequences
        .iter()
        .filter(|seq| starts_round(seq, ending))
        .count();
    for seq in sequences.iter_mut() {
        if !starts_round(seq, ending) {
            continue;
        }
        let room = seq.budget.saturating_sub(seq.stats.generated_tokens);
        // The plain forward feeds only sequences with more than this token to go.
        let may_continue = seq.may_continue();
        let Some(spec) = seq.speculating.as_mut() else {
            continue;
        };
        let depth = decided_depth(controllers, spec, batch, room);
        if depth == 0 && spec.may_decode_plainly && spec.settled && may_continue {
            spec.plain = true;
        } else {
            spec.depth = Some(depth);
        }
    }
}

/// A token the plain forward sampled for a speculating sequence whose rounds have started (a
/// plain stretch's) was read, in a step of `batch` rows: the drafter and the statistics hear of
/// it, the controller learns the cost of depth 0 from the plain forward rather than from
/// depth-0 rounds, and decides again, per token as it does per round; when it picks a depth,
/// the stretch ends and the next round uses it.
///
/// `cost` is the step's cost when the token was read a step after its forward was dispatched,
/// with the sequence's next forward dispatched meanwhile; `None` for the stretch's last token,
/// read with nothing dispatched behind it, whose wait measures no step (it read as 0 s, and
/// those zeros pulled depth 0's cost down by a tenth each).
pub fn plain_step(
    drafters: &mut Drafters,
    controllers: &mut Controllers,
    seq: &mut Sequence,
    token: u32,
    batch: usize,
    cost: Option<Duration>,
) -> Result<()> {
    // Counting the token being read.
    let room = seq.budget.saturating_sub(seq.stats.generated_tokens + 1);
    let held = seq.tokens.len();
    let Some(spec) = seq.speculating.as_mut() else {
        return Ok(());
    };
    spec.stats.plain += 1;
    let commit = Commit {
        tokens: &[token],
        held,
        plain: true,
    };
    drafters.of(spec.kind)?.commit(seq.id, commit)?;
    if let Some(cost) = cost {
        controllers.observe(spec.kind, batch, 0, 0, cost);
    }
    if spec.plain {
        let depth = round_depth(controllers, spec, batch, room);
        if depth > 0 {
            spec.plain = false;
            spec.depth = Some(depth);
        }
    }
    Ok(())
}

/// Verifies one evaluated round of `seq`: a greedy round's drafts against the target's
/// argmax; a sampled one's with `min(1, p/q)` and the residual, under random numbers keyed by
/// output position. The outer error is reading the round; the inner, verification refusing it.
fn verdict_of(round: &Dispatched, seq: &Sequence) -> Result<speculate::Result<Verdict>> {
    if round.greedy {
        let argmax = round.picks.to_vec::<u32>()?;
        return Ok(speculate::verify_greedy(&round.draft.tokens, &argmax));
    }
    let probs = round.picks.to_vec::<f32>()?;
    let vocab = probs.len() / round.tokens.len().max(1);
    let rows: Vec<&[f32]> = probs.chunks(vocab.max(1)).collect();
    let key = seq.speculating.as_ref().map_or(0, |s| s.key);
    // Output position of the round's first committed token.
    let start = seq.stats.generated_tokens;
    Ok(match &round.draft.probs {
        DraftProbs::OneHot => speculate::verify_positional(&round.draft.tokens, &rows, |i| {
            StdRng::seed_from_u64(position_seed(key, start + i)).random::<f64>()
        }),
        DraftProbs::Dense(_) => speculate::verify(
            &round.draft,
            &rows,
            &mut StdRng::seed_from_u64(position_seed(key, start)),
        ),
    })
}

/// The seed of output position `position`'s random numbers under `key`.
fn position_seed(key: u64, position: usize) -> u64 {
    key ^ (position as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// `n` host token ids as a `[n]` i32 device array.
fn token_array(tokens: &[u32], n: usize) -> Result<Array> {
    let ids: Vec<i32> = tokens
        .iter()
        .map(|&t| i32::try_from(t).unwrap_or(i32::MAX))
        .collect();
    Ok(Array::from_slice(&ids, &[n as i32])?)
}

/// The grammar's mask before each token of `draft` and after the last, with `draft` first cut
/// where the grammar stops allowing it (the target could not accept those tokens). The
/// grammar is back where it started.
fn masks_along(
    grammar: &mut grammar::Grammar,
    draft: &mut Draft,
) -> grammar::Result<Vec<Vec<u32>>> {
    let allowed = grammar.validate(&draft.tokens)?;
    draft.truncate(allowed);
    let mut masks = Vec::with_capacity(draft.len() + 1);
    let mut consumed = 0;
    let mut walk = || -> grammar::Result<()> {
        for &token in &draft.tokens {
            masks.push(grammar.mask()?);
            grammar.consume(token)?;
            consumed += 1;
        }
        masks.push(grammar.mask()?);
        Ok(())
    };
    let walked = walk();
    grammar.rollback(consumed)?;
    walked.map(|()| masks)
}

/// The logprob of `token` and the `top` most likely tokens, from one row of raw logits: a
/// full-vocabulary log-softmax (OpenAI's definition) over what `mask` allows (all when
/// `None`), computed on the host in f64.
fn logprobs_of(row: &[f32], mask: Option<&[u32]>, token: u32, top: usize) -> TokenLogprobs {
    let allowed =
        |t: usize| mask.is_none_or(|m| m.get(t / 32).is_some_and(|w| w >> (t % 32) & 1 == 1));
    let masked: Vec<f32> = row
        .iter()
        .enumerate()
        .map(|(t, &v)| if allowed(t) { v } else { f32::NEG_INFINITY })
        .collect();
    let row = masked.as_slice();
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
    let lse = f64::from(max) + sum.ln();
    let logprob = |v: f32| (f64::from(v) - lse) as f32;
    let mut best: Vec<u32> = (0..row.len() as u32).collect();
    let top = top.min(best.len());
    let by_value = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]);
    if top > 0 && top < best.len() {
        best.select_nth_unstable_by(top - 1, by_value);
    }
    best.truncate(top);
    best.sort_by(by_value);
    TokenLogprobs {
        logprob: row
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&v| logprob(v)),
        top: best
            .into_iter()
            .map(|t| (t, logprob(row[t as usize])))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::logprobs_of;

    #[test]
    fn host_logprobs_are_a_log_softmax_with_the_best_first() {
        let row = [0.0f32, 2.0, 1.0, -1.0];
        let lp = logprobs_of(&row, None, 2, 2);
        let lse = row.iter().map(|&v| f64::from(v).exp()).sum::<f64>().ln();
        assert!((f64::from(lp.logprob) - (1.0 - lse)).abs() < 1e-6);
        assert_eq!(lp.top.iter().map(|&(t, _)| t).collect::<Vec<_>>(), [1, 2]);
        assert!((f64::from(lp.top[0].1) - (2.0 - lse)).abs() < 1e-6);
        // Token 1 masked out: the mass renormalises over 0, 2 and 3.
        let masked = logprobs_of(&row, Some(&[0b1101]), 2, 2);
        let lse = [0.0f64, 1.0, -1.0]
            .iter()
            .map(|v| v.exp())
            .sum::<f64>()
            .ln();
        assert!((f64::from(masked.logprob) - (1.0 - lse)).abs() < 1e-6);
        assert_eq!(
            masked.top.iter().map(|&(t, _)| t).collect::<Vec<_>>(),
            [2, 0]
        );
    }
}
