//! A speculating sequence's round state ([`Speculating`]): its drafter's kind, the token its
//! next round starts from, its depth and what its rounds did. The rounds themselves are in
//! `speculation`; the drafters keep what they need of the sequence in `drafters`.

use crate::engine::job::{DrafterKind, SpeculationStats};

/// The deepest round the engine runs. Sliding-window caches hold this many positions beyond
/// their window, so a rejected draft rewinds without a snapshot.
pub const MAX_DRAFT_DEPTH: usize = 16;

/// A speculating sequence's round state; its drafter (of `kind`, among the loaded model's
/// `Drafters`) keeps what it needs of the sequence.
pub struct Speculating {
    pub(super) kind: DrafterKind,
    /// Whether its drafter reads the target's final states (a head, an assistant): only then
    /// does every forward keep them for it.
    pub(super) reads_target_states: bool,
    /// Whether the drafter has been told the context since the prompt was evaluated.
    pub(super) settled: bool,
    /// The last committed token, not yet in the caches: the first token of the next round.
    pub(super) next: Option<u32>,
    pub(super) max_depth: usize,
    /// Keys the random numbers of each output position: a seeded request's text then does not
    /// depend on how deep its rounds drafted (see [`speculate::verify_positional`]).
    pub(super) key: u64,
    /// Whether it may leave rounds for plain decoding: a greedy request decodes the same either
    /// way, an unseeded one promises no particular draw; a seeded sampled one stays in rounds,
    /// whose draws are keyed by position, so its text does not depend on the depths chosen.
    pub(super) may_decode_plainly: bool,
    /// Whether it decodes in the plain forward, its controller having chosen depth 0.
    pub(super) plain: bool,
    /// The depth decided for its next round by `speculation::decide_depths`.
    pub(super) depth: Option<usize>,
    pub(super) stats: SpeculationStats,
}

impl Speculating {
    /// A sequence's speculation with `kind` drafts of at most `max_depth` tokens; seeded
    /// requests draw reproducibly. The drafter of `kind` has been told the sequence begins.
    pub fn new(kind: DrafterKind, max_depth: usize, sampling: &sampler::Options) -> Speculating {
        let seed = sampling.seed;
        let key = match seed {
            // A different stream from the sampler's for the same seed.
            Some(seed) => seed ^ 0x5eed_5bec_u64,
            None => rand::random(),
        };
        Speculating {
            kind,
            reads_target_states: false,
            settled: false,
            next: None,
            max_depth: max_depth.min(MAX_DRAFT_DEPTH),
            key,
            may_decode_plainly: sampling.is_greedy() || seed.is_none(),
            plain: false,
            depth: None,
            stats: SpeculationStats {
                drafter: kind,
                rounds: 0,
                drafted: 0,
                accepted: 0,
                plain: 0,
            },
        }
    }

    /// The same, its drafter reading the target's final states when `reads`.
    pub fn reading_target_states(mut self, reads: bool) -> Speculating {
        self.reads_target_states = reads;
        self
    }

    /// The next round starts from `token`, sampled by the ordinary sampler call: the first
    /// token after prefill, or the last of a plain stretch.
    pub fn resume_from(&mut self, token: u32) {
        self.plain = false;
        self.next = Some(token);
    }

    /// Whether it decodes in the plain forward now, rather than in rounds.
    pub fn decodes_plainly(&self) -> bool {
        self.plain
    }

    /// The round's first token, to feed the plain forward as the stretch starts.
    pub fn take_next(&mut self) -> Option<u32> {
        self.next.take()
    }

    /// Whether its rounds have started: a token the plain forward samples after that belongs
    /// to a plain stretch (before, it is the first token after prefill).
    pub fn rounds_started(&self) -> bool {
        self.settled
    }

    /// What the rounds did so far.
    pub fn stats(&self) -> SpeculationStats {
        self.stats
    }

    /// The kind of drafter it drafts with.
    pub fn kind(&self) -> DrafterKind {
        self.kind
    }
}
