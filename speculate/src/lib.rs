//! Speculative decoding on the host: drafters, lossless verification and depth control.
//!
//! A [`Drafter`] guesses the next few tokens of a sequence cheaply; the target model scores
//! all of them in one forward; [`verify`] accepts the longest prefix it can while keeping the
//! output distributed exactly as plain sampling would (rejection sampling with a residual
//! draw, Leviathan et al. and Chen et al., 2023), and always adds one token of the target's
//! own. A round therefore commits between 1 and `depth + 1` tokens for one forward. The
//! [`DepthController`] picks `depth` per round from measured acceptance and measured round
//! cost, down to 0 (plain decoding) when drafting does not pay.
//!
//! Everything here works on host slices (token ids, probability rows), so the crate needs no
//! MLX and works with any tensor library: the engine copies the target's sampling
//! distributions (after every sampler filter) to the host, or only their argmax in the greedy
//! case ([`verify_greedy`]), and tells the drafter and the controller what was committed.
//! Drafters that run a model (the target's first layers, a draft model, a model's own
//! prediction heads) implement the same [`Drafter`] trait in the engine, which lends them its
//! tensors through the trait's context type.
//!
//! # Files
//!
//! - `draft`: [`Draft`] and [`DraftProbs`] (what a drafter proposes and the distributions it
//!   drew from); the [`Drafter`] trait every kind of drafter implements, with its
//!   [`Proposal`]s and [`Commit`]s; [`SequenceDrafter`], a host drafter of one sequence, and
//!   [`PerSequence`], which makes one a [`Drafter`] for many.
//! - `ngram`: [`NgramDrafter`] and [`NgramConfig`], prompt lookup over hash chains of the
//!   context's n-grams, updated incrementally on commit.
//! - `verify`: [`verify`], [`verify_greedy`], [`verify_positional`] (deterministic drafts
//!   checked against one draw per output position, so seeded text does not depend on the
//!   depth) and their [`Verdict`].
//! - `depth`: [`DepthController`] (expected tokens per second per depth and batch bucket,
//!   probes, JSON persistence), its [`DecisionLog`] of [`Event`]s and [`replay`].
//! - `error`: [`Error`], [`Row`] and [`Result`].
//!
//! # Example
//!
//! One greedy round with prompt lookup:
//!
//! ```
//! use speculate::{DepthController, NgramDrafter, SequenceDrafter, verify_greedy};
//! use std::time::Duration;
//!
//! let mut drafter = NgramDrafter::default();
//! let mut depth = DepthController::new(4);
//! drafter.settle(&[5, 6, 7, 8, 9, 5, 6]); // "5 6" was followed by "7 8 9" before
//!
//! let k = depth.depth(1);
//! let draft = drafter.propose(k);
//! assert_eq!(draft.tokens, vec![7, 8, 9]);
//!
//! // The target's argmax after the last committed token and after each draft token.
//! let argmax = [7, 8, 4, 1];
//! let verdict = verify_greedy(&draft.tokens, &argmax)?;
//! assert_eq!((verdict.accepted, verdict.next), (2, 4));
//!
//! let mut committed = draft.tokens[..verdict.accepted].to_vec();
//! committed.push(verdict.next);
//! drafter.commit(&committed); // the context is now 5 6 7 8 9 5 6 7 8 4
//! depth.observe(1, draft.len(), verdict.accepted, Duration::from_millis(12));
//! # Ok::<(), speculate::Error>(())
//! ```

#![deny(missing_docs)]

mod depth;
mod draft;
mod error;
mod ngram;
mod verify;

pub use depth::{
    DEFAULT_LOG_CAPACITY, DecisionLog, DepthController, Event, MAX_DEPTH, Mismatch, Replay, replay,
};
pub use draft::{
    Commit, Draft, DraftProbs, Drafter, PerSequence, Proposal, SequenceDrafter, SequenceKey,
};
pub use error::{Error, Result, Row};
pub use ngram::{MAX_CANDIDATES, MAX_NGRAM, NgramConfig, NgramDrafter};
pub use verify::{Verdict, verify, verify_greedy, verify_positional};
