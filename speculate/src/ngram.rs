//! Prompt-lookup drafting: propose what followed the last time the context's tail appeared.
//!
//! Prompt lookup decoding (Saxena, 2023, <https://github.com/apoorvumang/prompt-lookup-decoding>;
//! `prompt_lookup_num_tokens` in Hugging Face transformers, vLLM's `ngram` method) needs no
//! draft model: summaries, code edits, retrieval answers and multi-turn chats copy long spans of
//! their own context, so the tokens that followed an earlier occurrence of the context's last
//! few tokens are often what comes next.
//!
//! # Index
//!
//! For each length `n` in `min_n..=max_n` the drafter keeps hash chains, as LZ77 compressors
//! do: `head` maps an n-gram's hash to its most recent start, and `prev[s]` links the n-gram
//! starting at `s` to the previous start with the same hash. Appending a token adds one link per
//! length (`O(max_n)` hashing each), so [`commit`](SequenceDrafter::commit) never rescans the context,
//! and popping a token undoes its links exactly, so [`settle`](SequenceDrafter::settle) only touches
//! the part of the context that changed. Memory per token: the token, one chain link per length
//! and at most one map entry per length. A lookup walks at most `candidates` links and compares
//! tokens, so a hash collision can only hide an occurrence, never invent one.

use std::collections::HashMap;

use crate::{Draft, Error, Result, SequenceDrafter};

/// The longest n-gram length [`NgramConfig`] accepts: hashing costs `O(max_n)` per length per
/// token, and matches longer than this change no continuation in practice.
pub const MAX_NGRAM: usize = 32;

/// The most occurrences [`NgramConfig::candidates`] may consider per lookup (the vote is
/// quadratic in it).
pub const MAX_CANDIDATES: usize = 64;

/// How an [`NgramDrafter`] matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramConfig {
    /// The shortest context suffix worth matching.
    pub min_n: usize,
    /// The longest suffix tried first.
    pub max_n: usize,
    /// How many of the most recent occurrences of the matched suffix vote on the continuation.
    pub candidates: usize,
}

impl Default for NgramConfig {
    /// `min_n` 2: a single repeated token is too common in prose to predict what follows it,
    /// while two tokens already pin down copied identifiers and phrases (transformers defaults
    /// its `max_matching_ngram_size` to 2). `max_n` 4: a longer match rarely picks a different
    /// occurrence than a 4-token one, yet each extra length costs an index entry per token.
    /// `candidates` 4: enough for a majority when a phrase recurs with different endings,
    /// cheap enough to walk every round.
    fn default() -> NgramConfig {
        NgramConfig {
            min_n: 2,
            max_n: 4,
            candidates: 4,
        }
    }
}

impl NgramConfig {
    /// Checks the ranges: `1 <= min_n <= max_n <= MAX_NGRAM`, `1 <= candidates <=
    /// MAX_CANDIDATES`.
    pub fn validate(&self) -> Result<()> {
        let bad = |field, value, reason| {
            Err(Error::InvalidConfig {
                field,
                value,
                reason,
            })
        };
        if self.min_n == 0 {
            return bad("min_n", self.min_n, "must be at least 1");
        }
        if self.max_n < self.min_n {
            return bad("max_n", self.max_n, "must be at least min_n");
        }
        if self.max_n > MAX_NGRAM {
            return bad("max_n", self.max_n, "must be at most 32");
        }
        if self.candidates == 0 || self.candidates > MAX_CANDIDATES {
            return bad("candidates", self.candidates, "must be between 1 and 64");
        }
        Ok(())
    }

    /// The nearest configuration that [`validate`](NgramConfig::validate) accepts: each value
    /// clamped into its range, `max_n` after `min_n`.
    pub fn clamped(&self) -> NgramConfig {
        let min_n = self.min_n.clamp(1, MAX_NGRAM);
        NgramConfig {
            min_n,
            max_n: self.max_n.clamp(min_n, MAX_NGRAM),
            candidates: self.candidates.clamp(1, MAX_CANDIDATES),
        }
    }
}

/// The end of a hash chain.
const NONE: usize = usize::MAX;

/// Hash chains over the n-grams of one length.
#[derive(Debug, Clone, PartialEq)]
struct Chains {
    n: usize,
    /// Most recent start of each n-gram hash.
    head: HashMap<u64, usize>,
    /// `prev[s]`: the previous start of an n-gram with the hash of the one at `s`, or `NONE`.
    /// Holds one entry per n-gram of the context: `len - n + 1` when `len >= n`.
    prev: Vec<usize>,
}

impl Chains {
    fn new(n: usize) -> Chains {
        Chains {
            n,
            head: HashMap::new(),
            prev: Vec::new(),
        }
    }

    /// Links the n-gram that ends the context, which just grew by one token.
    fn push(&mut self, context: &[u32]) {
        let Some(start) = context.len().checked_sub(self.n) else {
            return;
        };
        let h = hash(&context[start..]);
        let prev = self.head.insert(h, start).unwrap_or(NONE);
        self.prev.push(prev);
    }

    /// Unlinks the n-gram that ends the context, which is about to lose its last token.
    fn pop(&mut self, context: &[u32]) {
        let Some(start) = context.len().checked_sub(self.n) else {
            return;
        };
        let h = hash(&context[start..]);
        match self.prev.pop() {
            Some(NONE) | None => self.head.remove(&h),
            Some(prev) => self.head.insert(h, prev),
        };
    }

    /// Where the continuations of the most recent earlier occurrences of the context's last `n`
    /// tokens begin, most recent first: at most `limit` chain links are walked.
    fn continuations(&self, context: &[u32], limit: usize) -> Vec<usize> {
        let Some(start) = context.len().checked_sub(self.n) else {
            return Vec::new();
        };
        let suffix = &context[start..];
        let mut found = Vec::new();
        // The suffix itself heads its chain: start from the link before it.
        let mut at = self.prev.get(start).copied().unwrap_or(NONE);
        for _ in 0..limit {
            if at == NONE {
                break;
            }
            if context.get(at..at + self.n) == Some(suffix) {
                found.push(at + self.n);
            }
            at = self.prev.get(at).copied().unwrap_or(NONE);
        }
        found
    }
}

/// A 64-bit hash of an n-gram (splitmix64's finaliser over a multiplicative fold): stable
/// across runs, unlike the std hasher's keys, so the index is a pure function of the context.
fn hash(tokens: &[u32]) -> u64 {
    let mut h = tokens.len() as u64;
    for &t in tokens {
        h = (h ^ u64::from(t))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(31);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 31)
}

/// A [`SequenceDrafter`] that looks the context's tail up in the context itself (prompt lookup).
///
/// # Rule
///
/// The longest suffix of the context, from `max_n` down to `min_n` tokens, that also occurs
/// earlier wins. Up to `candidates` of its most recent earlier occurrences then vote, token by
/// token, on the continuation: at each step every occurrence that agrees with the proposal so
/// far and still has a token before the end of the context votes for its next token; the token
/// with most votes is proposed (ties go to the most recent occurrence) and the occurrences that
/// voted otherwise drop out. It stops at `max` tokens or when no occurrence is left. So the
/// proposal is always a verbatim continuation of one occurrence: the one the majority agrees
/// with, extended as far as the longest of those occurrences goes. A continuation may run into
/// the suffix itself, which is how a repeating pattern keeps predicting itself; it never runs
/// past the end of the context. Proposals are [`DraftProbs::OneHot`](crate::DraftProbs).
#[derive(Debug, Clone, PartialEq)]
pub struct NgramDrafter {
    config: NgramConfig,
    context: Vec<u32>,
    /// One set of chains per length, `min_n..=max_n`.
    chains: Vec<Chains>,
}

impl Default for NgramDrafter {
    fn default() -> NgramDrafter {
        NgramDrafter::build(NgramConfig::default())
    }
}

impl NgramDrafter {
    /// A drafter with an empty context. Out-of-range values are clamped into range
    /// ([`NgramConfig::clamped`]); use [`try_new`](NgramDrafter::try_new) to refuse them.
    pub fn new(config: NgramConfig) -> NgramDrafter {
        NgramDrafter::build(config.clamped())
    }

    /// A drafter with an empty context.
    ///
    /// Fails with [`Error::InvalidConfig`] when `config` is out of range (see
    /// [`NgramConfig::validate`]).
    pub fn try_new(config: NgramConfig) -> Result<NgramDrafter> {
        config.validate()?;
        Ok(NgramDrafter::build(config))
    }

    fn build(config: NgramConfig) -> NgramDrafter {
        let chains = (config.min_n..=config.max_n).map(Chains::new).collect();
        NgramDrafter {
            config,
            context: Vec::new(),
            chains,
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &NgramConfig {
        &self.config
    }

    /// The committed context it knows.
    pub fn context(&self) -> &[u32] {
        &self.context
    }

    fn push(&mut self, token: u32) {
        self.context.push(token);
        for chains in &mut self.chains {
            chains.push(&self.context);
        }
    }

    fn pop(&mut self) {
        for chains in &mut self.chains {
            chains.pop(&self.context);
        }
        self.context.pop();
    }

    /// The proposal for `context` from the continuations starting at `starts`, most recent
    /// first (the vote described on [`NgramDrafter`]).
    fn vote(context: &[u32], mut alive: Vec<usize>, max: usize) -> Vec<u32> {
        let mut out = Vec::new();
        let mut tally: Vec<(u32, usize)> = Vec::new();
        while out.len() < max {
            let step = out.len();
            tally.clear();
            for &start in &alive {
                let Some(&token) = context.get(start + step) else {
                    continue;
                };
                match tally.iter_mut().find(|(t, _)| *t == token) {
                    Some((_, votes)) => *votes += 1,
                    None => tally.push((token, 1)),
                }
            }
            // `tally` is in order of first vote, so on a tie the earliest entry (the most
            // recent occurrence) stays the winner.
            let Some(&(winner, _)) = tally.iter().reduce(|a, b| if b.1 > a.1 { b } else { a })
            else {
                break;
            };
            out.push(winner);
            alive.retain(|&start| context.get(start + step) == Some(&winner));
        }
        out
    }
}

impl SequenceDrafter for NgramDrafter {
    /// Keeps the index of the prefix it shares with `context` and re-indexes only the rest:
    /// the state is the same as indexing `context` from scratch.
    fn settle(&mut self, context: &[u32]) {
        let shared = self
            .context
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count();
        while self.context.len() > shared {
            self.pop();
        }
        for &token in &context[shared..] {
            self.push(token);
        }
    }

    fn commit(&mut self, tokens: &[u32]) {
        for &token in tokens {
            self.push(token);
        }
    }

    fn propose(&mut self, max: usize) -> Draft {
        if max == 0 {
            return Draft::empty();
        }
        for chains in self.chains.iter().rev() {
            let starts = chains.continuations(&self.context, self.config.candidates);
            if !starts.is_empty() {
                return Draft::one_hot(NgramDrafter::vote(&self.context, starts, max));
            }
        }
        Draft::empty()
    }

    fn name(&self) -> &str {
        "ngram"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DraftProbs;
    use proptest::prelude::*;

    fn drafter(min_n: usize, max_n: usize, candidates: usize) -> NgramDrafter {
        NgramDrafter::try_new(NgramConfig {
            min_n,
            max_n,
            candidates,
        })
        .unwrap()
    }

    fn propose(d: &mut NgramDrafter, context: &[u32], max: usize) -> Vec<u32> {
        d.settle(context);
        let draft = d.propose(max);
        assert_eq!(draft.probs, DraftProbs::OneHot);
        draft.tokens
    }

    #[test]
    fn proposes_what_followed_the_earlier_occurrence() {
        let mut d = NgramDrafter::default();
        // "1 2 3" occurred before, followed by "4 5 6 7".
        let ctx = [1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3];
        assert_eq!(propose(&mut d, &ctx, 3), vec![4, 5, 6]);
        assert_eq!(propose(&mut d, &ctx, 10), vec![4, 5, 6, 7, 9, 1, 2, 3]);
        assert_eq!(propose(&mut d, &ctx, 0), Vec::<u32>::new());
    }

    #[test]
    fn longest_suffix_wins_over_a_more_recent_shorter_one() {
        let mut d = drafter(1, 3, 4);
        // "5 6" also occurs with "9" after it, more recently, but "4 5 6" (longer) says "7".
        let ctx = [4, 5, 6, 7, 0, 5, 6, 9, 0, 4, 5, 6];
        assert_eq!(propose(&mut d, &ctx, 1), vec![7]);
    }

    #[test]
    fn nothing_below_min_n_is_matched() {
        let mut d = drafter(2, 3, 4);
        assert!(propose(&mut d, &[1, 2, 3, 4, 1], 4).is_empty());
        assert!(propose(&mut d, &[], 4).is_empty());
        assert!(propose(&mut d, &[7], 4).is_empty());
        let mut d = drafter(1, 3, 4);
        assert_eq!(propose(&mut d, &[1, 2, 3, 4, 1], 4), vec![2, 3, 4, 1]);
    }

    #[test]
    fn majority_of_recent_occurrences_decides() {
        let mut d = drafter(2, 2, 4);
        // "1 2" is followed by 8, 7, 8 (oldest to newest): 8 has two votes.
        let ctx = [1, 2, 8, 0, 1, 2, 7, 0, 1, 2, 8, 0, 1, 2];
        assert_eq!(propose(&mut d, &ctx, 2), vec![8, 0]);
        // With one candidate only the most recent occurrence counts.
        let mut d = drafter(2, 2, 1);
        assert_eq!(propose(&mut d, &ctx, 1), vec![8]);
        // A tie goes to the most recent occurrence.
        let mut d = drafter(2, 2, 2);
        let ctx = [1, 2, 7, 0, 1, 2, 8, 0, 1, 2];
        assert_eq!(propose(&mut d, &ctx, 1), vec![8]);
    }

    #[test]
    fn older_occurrences_beyond_candidates_are_ignored() {
        let mut d = drafter(2, 2, 2);
        // The two most recent "1 2"s are followed by 8, the three older ones by 7: with 2
        // candidates only the recent ones vote, with 5 the older majority wins.
        let ctx = [1, 2, 7, 1, 2, 7, 1, 2, 7, 1, 2, 8, 1, 2, 8, 1, 2];
        assert_eq!(propose(&mut d, &ctx, 1), vec![8]);
        let mut d = drafter(2, 2, 5);
        assert_eq!(propose(&mut d, &ctx, 1), vec![7]);
    }

    #[test]
    fn a_short_recent_continuation_is_extended_by_an_older_agreeing_one() {
        // "1 2" occurs at 0 and 2 before the suffix at 4. The continuation at 2 reaches the end
        // of the context after "1 2"; the one at 0 agrees and goes two tokens further.
        let ctx = [1, 2, 1, 2, 1, 2];
        let mut d = drafter(2, 2, 2);
        assert_eq!(propose(&mut d, &ctx, 8), vec![1, 2, 1, 2]);
        let mut d = drafter(2, 2, 1);
        assert_eq!(propose(&mut d, &ctx, 8), vec![1, 2]);
    }

    #[test]
    fn a_repeating_pattern_continues_into_the_suffix() {
        let mut d = drafter(2, 4, 1);
        let ctx = [1, 2, 1, 2, 1, 2];
        // The most recent earlier "1 2 1 2" starts at 0; its continuation is "1 2" and then
        // the context ends.
        assert_eq!(propose(&mut d, &ctx, 5), vec![1, 2]);
        let mut d = drafter(1, 1, 1);
        assert_eq!(propose(&mut d, &[5, 5, 5], 4), vec![5]);
    }

    #[test]
    fn commit_extends_and_settle_rewinds() {
        let mut d = NgramDrafter::default();
        d.settle(&[1, 2, 3, 4]);
        d.commit(&[9, 1, 2]);
        assert_eq!(d.context(), &[1, 2, 3, 4, 9, 1, 2]);
        assert_eq!(d.propose(2).tokens, vec![3, 4]);
        d.settle(&[1, 2, 3]);
        assert!(d.propose(2).is_empty());
        assert_eq!(d, {
            let mut fresh = NgramDrafter::default();
            fresh.settle(&[1, 2, 3]);
            fresh
        });
        assert_eq!(d.name(), "ngram");
    }

    #[test]
    fn the_index_holds_one_link_per_token_and_length() {
        let mut d = NgramDrafter::default();
        let context: Vec<u32> = (0..1000u32).map(|i| (i * 7919) % 13).collect();
        d.settle(&context[..10]);
        d.commit(&context[10..]);
        for chains in &d.chains {
            assert_eq!(chains.prev.len(), context.len() - chains.n + 1);
            assert!(chains.head.len() <= chains.prev.len());
        }
        d.settle(&context[..3]);
        assert_eq!(
            d.chains.iter().map(|c| c.prev.len()).collect::<Vec<_>>(),
            vec![2, 1, 0]
        );
        assert_eq!(
            d.chains.iter().map(|c| c.head.len()).collect::<Vec<_>>(),
            vec![2, 1, 0]
        );
    }

    #[test]
    fn invalid_configs_are_refused() {
        for (min_n, max_n, candidates) in [(0, 2, 1), (3, 2, 1), (1, 33, 1), (1, 2, 0), (1, 2, 65)]
        {
            let config = NgramConfig {
                min_n,
                max_n,
                candidates,
            };
            let err = NgramDrafter::try_new(config).unwrap_err();
            assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
            let clamped = NgramDrafter::new(config);
            clamped.config().validate().unwrap();
        }
        let widest = NgramConfig {
            min_n: 1,
            max_n: 32,
            candidates: 64,
        };
        assert_eq!(NgramDrafter::try_new(widest).unwrap().config(), &widest);
        assert_eq!(NgramDrafter::new(widest).config(), &widest);
        let clamped = NgramConfig {
            min_n: 0,
            max_n: 40,
            candidates: 0,
        }
        .clamped();
        assert_eq!(
            clamped,
            NgramConfig {
                min_n: 1,
                max_n: 32,
                candidates: 1
            }
        );
    }

    /// Starts of the most recent earlier occurrences of the longest repeated suffix, by brute
    /// force: `(n, starts most recent first)`.
    fn oracle(context: &[u32], config: &NgramConfig) -> Option<(usize, Vec<usize>)> {
        let len = context.len();
        for n in (config.min_n..=config.max_n).rev() {
            if len <= n {
                continue;
            }
            let suffix = &context[len - n..];
            let starts: Vec<usize> = (0..len - n)
                .rev()
                .filter(|&s| &context[s..s + n] == suffix)
                .collect();
            if !starts.is_empty() {
                return Some((n, starts));
            }
        }
        None
    }

    fn config() -> impl Strategy<Value = NgramConfig> {
        (1usize..4, 0usize..4, 1usize..6).prop_map(|(min_n, extra, candidates)| NgramConfig {
            min_n,
            max_n: min_n + extra,
            candidates,
        })
    }

    proptest! {
        /// Every proposal is a verbatim continuation, within the context, of one of the
        /// `candidates` most recent earlier occurrences of the longest repeated suffix; and
        /// there is a proposal exactly when such an occurrence exists.
        #[test]
        fn proposals_continue_an_occurrence_of_the_longest_suffix(
            config in config(),
            context in proptest::collection::vec(0u32..4, 0..120),
            max in 0usize..12,
        ) {
            let mut d = NgramDrafter::try_new(config).unwrap();
            d.settle(&context);
            let proposal = d.propose(max).tokens;
            prop_assert!(proposal.len() <= max);
            match oracle(&context, &config) {
                None => prop_assert!(proposal.is_empty()),
                Some((n, starts)) => {
                    prop_assert_eq!(proposal.is_empty(), max == 0);
                    let continues = starts.iter().take(config.candidates).any(|&s| {
                        context.get(s + n..s + n + proposal.len()) == Some(&proposal[..])
                    });
                    prop_assert!(continues, "{:?} continues no occurrence", proposal);
                }
            }
        }

        /// `settle(prefix)` + `commit(rest)` in pieces, and `settle` from an unrelated state
        /// (rewinding to the shared prefix), build the same index as `settle(context)`.
        #[test]
        fn incremental_equals_rebuild(
            config in config(),
            context in proptest::collection::vec(0u32..4, 0..120),
            other in proptest::collection::vec(0u32..4, 0..120),
            cuts in proptest::collection::vec(0usize..120, 0..6),
        ) {
            let mut rebuilt = NgramDrafter::try_new(config).unwrap();
            rebuilt.settle(&context);

            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(context.len())).collect();
            cuts.sort_unstable();
            let mut incremental = NgramDrafter::try_new(config).unwrap();
            let first = cuts.first().copied().unwrap_or(context.len());
            incremental.settle(&context[..first]);
            let mut at = first;
            for &cut in cuts.iter().skip(1).chain([context.len()].iter()) {
                incremental.commit(&context[at..cut]);
                at = cut;
            }

            let mut rewound = NgramDrafter::try_new(config).unwrap();
            rewound.settle(&other);
            rewound.settle(&context);

            prop_assert_eq!(&incremental, &rebuilt);
            prop_assert_eq!(&rewound, &rebuilt);
            for max in [1, 3, 8] {
                let want = rebuilt.propose(max);
                prop_assert_eq!(incremental.propose(max), want.clone());
                prop_assert_eq!(rewound.propose(max), want);
            }
        }
    }
}
