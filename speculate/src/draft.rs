//! What a drafter proposes, and the traits drafters implement: [`Drafter`], which drafts for
//! every speculating sequence of a step at once (so a model drafter runs one forward for all
//! of them), and [`SequenceDrafter`], a host drafter of one sequence's tokens, which
//! [`PerSequence`] makes a [`Drafter`].

use std::collections::HashMap;

/// What a drafter proposes: tokens and the distributions they were drawn from.
///
/// Verification needs `q`, the probability the drafter gave each token, to accept it with
/// probability `min(1, p/q)` and to resample from the residual after a rejection; see
/// [`verify`](crate::verify).
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    /// The proposed tokens, in order.
    pub tokens: Vec<u32>,
    /// The distributions they came from.
    pub probs: DraftProbs,
}

/// The distributions a [`Draft`]'s tokens were drawn from.
#[derive(Debug, Clone, PartialEq)]
pub enum DraftProbs {
    /// Deterministic drafter: each token had probability 1.
    OneHot,
    /// One row per token, each a full-vocabulary probability vector the token was drawn from.
    Dense(Vec<Vec<f32>>),
}

impl Draft {
    /// No proposal: the round decodes one token as without speculation.
    pub fn empty() -> Draft {
        Draft::one_hot(Vec::new())
    }

    /// Tokens from a deterministic drafter (an n-gram lookup, a greedy draft model).
    pub fn one_hot(tokens: Vec<u32>) -> Draft {
        Draft {
            tokens,
            probs: DraftProbs::OneHot,
        }
    }

    /// Tokens drawn from `rows`, one full-vocabulary distribution per token. Whether the rows
    /// match the tokens is checked by [`verify`](crate::verify), not here.
    pub fn dense(tokens: Vec<u32>, rows: Vec<Vec<f32>>) -> Draft {
        Draft {
            tokens,
            probs: DraftProbs::Dense(rows),
        }
    }

    /// The number of proposed tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether there is no proposal.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Keeps the first `len` tokens (and their rows); a no-op when the draft is shorter.
    /// Cutting a draft keeps it lossless: each token's row still describes how it was drawn.
    pub fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
        if let DraftProbs::Dense(rows) = &mut self.probs {
            rows.truncate(len);
        }
    }
}

/// How an engine names a sequence to its drafters.
pub type SequenceKey = usize;

/// One sequence about to run a round, handed to [`Drafter::propose`] with the others of its
/// step.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    /// The sequence.
    pub sequence: SequenceKey,
    /// The round's first token: the last one committed, not yet in the target's caches.
    pub first: u32,
    /// The most tokens to draft (the depth the controller chose).
    pub depth: usize,
    /// What the drafter proposes: at most `depth` tokens; empty when it has none.
    pub draft: Draft,
    /// Set by a drafter that spends this round catching up on context instead of drafting
    /// (a draft model behind a long prompt): the round was not run at the depth the controller
    /// chose, so the controller does not learn from it.
    pub catching_up: bool,
}

impl Proposal {
    /// A round of `sequence` from `first`, to draft at most `depth` tokens for.
    pub fn new(sequence: SequenceKey, first: u32, depth: usize) -> Proposal {
        Proposal {
            sequence,
            first,
            depth,
            draft: Draft::empty(),
            catching_up: false,
        }
    }
}

/// Tokens a sequence committed, as [`Drafter::commit`] hears of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit<'a> {
    /// The tokens, in order, after the context the drafter was last told of.
    pub tokens: &'a [u32],
    /// How many tokens of the context the target's caches now hold: a round's rejected
    /// drafts are gone from them, and the last committed token is not in them yet. A drafter
    /// with caches of its own keeps them no further ahead.
    pub held: usize,
    /// Whether they were decoded plainly, without a round: the drafter drafted nothing for
    /// them (and a draft model was not fed them).
    pub plain: bool,
}

/// What drafts for speculating sequences, in any of its kinds: prompt lookup on the host, the
/// target's own first layers, a draft model with caches of its own, a model-native head.
///
/// A drafter serves every sequence of a model that speculates with it, named by
/// [`SequenceKey`]. The engine drives each sequence through it in order: [`begin`] when it is
/// admitted, [`settle`] once its prompt is evaluated, then per round a [`propose`] (every
/// sequence of the step at once, so a model drafter runs one forward for all of them) and a
/// [`commit`] of what the round committed, plus a [`commit`] for every token decoded plainly
/// between rounds, and [`end`] when it retires, finished, cancelled or failed. Nothing
/// drafted but rejected is ever committed, so a drafter's own state follows the target's.
///
/// `Ctx` is what the engine lends a drafter to draft with (its target model, its sampler, the
/// sequences' caches), and `E` the engine's error: a host drafter ([`PerSequence`]) implements
/// the trait for every `Ctx` and `E`, and a model drafter for its engine's.
///
/// A drafter that keeps nothing per sequence (the target's own first layers, whose keys and
/// values are the target's) implements only [`name`](Drafter::name) and [`propose`]: the
/// others do nothing by default.
///
/// [`begin`]: Drafter::begin
/// [`settle`]: Drafter::settle
/// [`propose`]: Drafter::propose
/// [`commit`]: Drafter::commit
/// [`end`]: Drafter::end
pub trait Drafter<Ctx: ?Sized, E> {
    /// A short name for logs and statistics (`ngram`, `self:8`, a draft model's name).
    fn name(&self) -> &str;

    /// `sequence` is admitted with `prompt`; `turn_starts` are the prompt positions where
    /// conversation turns begin (where a drafter with a prefix cache of its own captures).
    fn begin(
        &mut self,
        sequence: SequenceKey,
        prompt: &[u32],
        turn_starts: &[usize],
    ) -> std::result::Result<(), E> {
        let _ = (sequence, prompt, turn_starts);
        Ok(())
    }

    /// The whole committed context of `sequence` (prompt and output), after its prompt is
    /// evaluated or whenever the engine's view and the drafter's may differ. Replaces what it
    /// knew of the sequence's text.
    fn settle(&mut self, sequence: SequenceKey, context: &[u32]) {
        let _ = (sequence, context);
    }

    /// Fills each proposal's [`draft`](Proposal::draft) with at most its `depth` tokens and
    /// the distributions they were drawn from.
    fn propose(&mut self, ctx: &mut Ctx, proposals: &mut [Proposal]) -> std::result::Result<(), E>;

    /// `sequence` committed `commit.tokens` after the context the drafter knows.
    fn commit(&mut self, sequence: SequenceKey, commit: Commit<'_>) -> std::result::Result<(), E> {
        let _ = (sequence, commit);
        Ok(())
    }

    /// `sequence` retired, its committed context `context`; `intact` is false after a failure,
    /// when its caches may be half-written and nothing of them may be kept.
    fn end(&mut self, sequence: SequenceKey, context: &[u32], intact: bool) {
        let _ = (sequence, context, intact);
    }
}

/// A host drafter for one sequence, which needs nothing but that sequence's committed tokens:
/// made a [`Drafter`] for many by [`PerSequence`].
///
/// It is told what is committed ([`settle`](SequenceDrafter::settle),
/// [`commit`](SequenceDrafter::commit)) and asked for proposals
/// ([`propose`](SequenceDrafter::propose)); it never sees tokens that were drafted but not
/// accepted, so it has nothing to roll back.
pub trait SequenceDrafter: Send {
    /// The whole committed context (prompt + committed output), after prefill, after a
    /// cancellation, or whenever the engine's view and the drafter's may differ. Replaces what
    /// it knew.
    fn settle(&mut self, context: &[u32]);

    /// Tokens committed after the context it knows (accepted drafts and the round's new token).
    fn commit(&mut self, tokens: &[u32]);

    /// Up to `max` tokens to follow the context; empty when it has no proposal.
    fn propose(&mut self, max: usize) -> Draft;

    /// A short name for logs and statistics ("ngram").
    fn name(&self) -> &str;
}

/// A [`Drafter`] that keeps one [`SequenceDrafter`] per sequence, each a copy of a template.
#[derive(Debug, Clone)]
pub struct PerSequence<D> {
    template: D,
    live: HashMap<SequenceKey, D>,
}

impl<D: SequenceDrafter + Clone> PerSequence<D> {
    /// Drafters for sequences, each starting as `template` (with an empty context).
    pub fn new(template: D) -> PerSequence<D> {
        PerSequence {
            template,
            live: HashMap::new(),
        }
    }

    /// How many sequences it drafts for.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether it drafts for none.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    fn of(&mut self, sequence: SequenceKey) -> &mut D {
        self.live
            .entry(sequence)
            .or_insert_with(|| self.template.clone())
    }
}

impl<Ctx: ?Sized, E, D: SequenceDrafter + Clone> Drafter<Ctx, E> for PerSequence<D> {
    fn name(&self) -> &str {
        self.template.name()
    }

    fn begin(
        &mut self,
        sequence: SequenceKey,
        _prompt: &[u32],
        _turn_starts: &[usize],
    ) -> std::result::Result<(), E> {
        self.live.insert(sequence, self.template.clone());
        Ok(())
    }

    fn settle(&mut self, sequence: SequenceKey, context: &[u32]) {
        self.of(sequence).settle(context);
    }

    fn propose(
        &mut self,
        _ctx: &mut Ctx,
        proposals: &mut [Proposal],
    ) -> std::result::Result<(), E> {
        for proposal in proposals {
            let mut draft = self.of(proposal.sequence).propose(proposal.depth);
            draft.truncate(proposal.depth);
            proposal.draft = draft;
        }
        Ok(())
    }

    fn commit(&mut self, sequence: SequenceKey, commit: Commit<'_>) -> std::result::Result<(), E> {
        self.of(sequence).commit(commit.tokens);
        Ok(())
    }

    fn end(&mut self, sequence: SequenceKey, _context: &[u32], _intact: bool) {
        self.live.remove(&sequence);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_draft_has_no_tokens() {
        let d = Draft::empty();
        assert!(d.is_empty());
        assert_eq!(d.len(), 0);
        assert_eq!(d.probs, DraftProbs::OneHot);
    }

    #[test]
    fn truncate_cuts_tokens_and_rows_together() {
        let mut d = Draft::dense(vec![1, 2, 3], vec![vec![1.0; 4]; 3]);
        d.truncate(2);
        assert_eq!(d.tokens, vec![1, 2]);
        assert_eq!(d.probs, DraftProbs::Dense(vec![vec![1.0; 4]; 2]));
        d.truncate(5);
        assert_eq!(d.len(), 2);
    }

    /// A stand-in host drafter: proposes the context's last `max` tokens again.
    #[derive(Clone, Default)]
    struct Echo(Vec<u32>);

    impl SequenceDrafter for Echo {
        fn settle(&mut self, context: &[u32]) {
            self.0 = context.to_vec();
        }
        fn commit(&mut self, tokens: &[u32]) {
            self.0.extend_from_slice(tokens);
        }
        fn propose(&mut self, max: usize) -> Draft {
            let from = self.0.len().saturating_sub(max);
            // One more than asked, to see the adapter cut it.
            let mut tokens = self.0[from..].to_vec();
            tokens.push(0);
            Draft::one_hot(tokens)
        }
        fn name(&self) -> &str {
            "echo"
        }
    }

    #[test]
    fn per_sequence_keeps_one_drafter_per_sequence_and_cuts_to_the_depth() {
        let mut drafter = PerSequence::new(Echo::default());
        let d: &mut dyn Drafter<(), ()> = &mut drafter;
        d.begin(1, &[1, 2], &[]).unwrap();
        d.begin(2, &[7], &[]).unwrap();
        d.settle(1, &[1, 2, 3]);
        d.settle(2, &[7, 8]);
        let commit = Commit {
            tokens: &[4],
            held: 3,
            plain: true,
        };
        d.commit(1, commit).unwrap();
        let mut proposals = [Proposal::new(1, 4, 2), Proposal::new(2, 8, 3)];
        d.propose(&mut (), &mut proposals).unwrap();
        // Cut to its depth of 2; the other's three tokens fit its depth.
        assert_eq!(proposals[0].draft.tokens, [3, 4]);
        assert_eq!(proposals[1].draft.tokens, [7, 8, 0]);
        assert!(!proposals[0].catching_up);
        d.end(1, &[1, 2, 3, 4], true);
        assert_eq!(d.name(), "echo");
        assert_eq!(drafter.len(), 1, "the ended sequence's drafter is dropped");
    }
}
