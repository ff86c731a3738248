//! What a drafter proposes, and the trait every drafter implements.

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

/// A source of draft tokens for one sequence. The engine owns one per speculating sequence.
///
/// The engine tells the drafter what is committed ([`settle`](Drafter::settle),
/// [`commit`](Drafter::commit)) and asks it for proposals ([`propose`](Drafter::propose));
/// a drafter never sees tokens that were drafted but not accepted, so it has nothing to roll
/// back.
pub trait Drafter: Send {
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
}
