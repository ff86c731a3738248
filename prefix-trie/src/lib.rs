//! A compressed trie of cached model states, generic over snapshots.
//!
//! The prefix cache decides what model state is kept and where a request resumes. It knows
//! nothing about tensors: each cache slot's saved state is a [`Snapshot`], which says what it
//! covers, how many bytes it holds, and how to split and merge itself. Full-attention KV
//! snapshots are range-shaped; sliding-window and recurrent ones are point-shaped and restore
//! only at the exact offset they were taken.
//!
//! The engine serves many requests at once; each is a *session*, named by the [`SessionId`]
//! that `begin` returns, with its own keys, restore point, scheduled checkpoints and path
//! through the trie. Each session restores into fresh caches of its own:
//!
//! 1. [`PrefixTrie::begin`] matches the [`Prompt`]'s keys, picks the restore point (the deepest
//!    offset every layer can restore to), splits the edge there if needed, and schedules
//!    captures ([`Begin::capture_at`]);
//! 2. the engine fills the session's caches from [`PrefixTrie::restore_plan`] and prefills
//!    from the restore point, capturing snapshots at the scheduled offsets;
//! 3. [`PrefixTrie::attach`] stores the captures on the session's path, clipped to node edges;
//! 4. [`PrefixTrie::close`] records the request (finished or cancelled) and pages out the new
//!    segment while its caches rest at its end; [`PrefixTrie::abandon`] ends it without that;
//! 5. [`PrefixTrie::evict`] keeps the stored bytes under a budget.
//!
//! Other sessions may begin, attach, close or be abandoned, and eviction may run, at any point
//! between one session's `begin` and its `close`. Sessions with shared prefixes share nodes:
//! the later one's path walks into the nodes the earlier one created and splits where they
//! diverge. Every live session's restore node and frontier are pinned: eviction and compaction
//! never remove or merge them away, so the session's path, its restore plan and its page-out
//! stay correct.
//!
//! ```
//! use prefix_trie::{Config, Coverage, LayerKind, Lookahead, PrefixTrie, Prompt, SchedulePolicy, Snapshot};
//!
//! /// A range snapshot that only remembers what it covers.
//! #[derive(Debug)]
//! struct Span(std::ops::Range<usize>);
//!
//! impl Snapshot for Span {
//!     type Error = std::convert::Infallible;
//!     fn coverage(&self) -> Coverage { Coverage::Range(self.0.clone()) }
//!     fn bytes(&self) -> usize { self.0.len() }
//!     fn split(self, at: usize) -> Result<(Self, Self), Self::Error> {
//!         Ok((Span(self.0.start..at), Span(at..self.0.end)))
//!     }
//!     fn merge(self, later: Self) -> Result<Self, Self::Error> {
//!         Ok(Span(self.0.start..later.0.end))
//!     }
//! }
//!
//! // Each session's caches hold exactly the range they were asked for.
//! fn page_out(_layer: usize, coverage: Coverage) -> Result<Span, std::convert::Infallible> {
//!     match coverage {
//!         Coverage::Range(range) => Ok(Span(range)),
//!         Coverage::Point(_) => unreachable!("no point layers here"),
//!     }
//! }
//!
//! let config = Config {
//!     layers: vec![LayerKind::Range],
//!     lookahead: Lookahead::None,
//!     schedule: SchedulePolicy::default(),
//! };
//! let mut trie = PrefixTrie::<Span>::new(config)?;
//! // Two requests sharing a system prompt (1, 2, 3) are live at once.
//! let a = Prompt::new(&[1, 2, 3, 4, 5], &[], Lookahead::None)?;
//! let b = Prompt::new(&[1, 2, 3, 9, 9], &[], Lookahead::None)?;
//! let first = trie.begin(&a, &[])?;
//! let second = trie.begin(&b, &[])?;
//! assert_eq!((first.restore_at, second.restore_at, trie.live_sessions()), (0, 0, 2));
//! // A generated token 6; its caches rest after 6 tokens. B was cancelled after 4.
//! let recorded = Prompt::new(&[1, 2, 3, 4, 5, 6], &[], Lookahead::None)?;
//! trie.close(first.session, recorded.keys(), 6, Vec::new(), page_out)?;
//! trie.close(second.session, b.keys(), 4, Vec::new(), page_out)?;
//! assert_eq!(trie.live_sessions(), 0);
//! // Both conversations resume where they stopped; they share the node of 1, 2, 3.
//! let next = Prompt::new(&[1, 2, 3, 4, 5, 6, 7, 8], &[], Lookahead::None)?;
//! assert_eq!(trie.find(&next)?.restore_at, 6);
//! assert_eq!(trie.find(&b)?.restore_at, 4);
//! assert_eq!(trie.node_count(), 4);
//! # Ok::<(), prefix_trie::Error>(())
//! ```
//!
//! Files:
//! - `key.rs`: [`Key`] packing of token ids, media hashes and look-ahead pairs.
//! - `prompt.rs`: [`Prompt`] keys built from tokens and [`MediaItem`]s.
//! - `snapshot.rs`: the [`Snapshot`] trait, [`Coverage`] and [`LayerKind`].
//! - `node.rs`: nodes and their arena.
//! - `session.rs`: [`SessionId`], the name of a live request.
//! - `trie.rs`: [`PrefixTrie`], its [`Config`], `begin` and `abandon`.
//! - `restore.rs`: longest match, the restore point, [`LayerRestore`] plans.
//! - `schedule.rs`: [`SchedulePolicy`], the offsets worth capturing.
//! - `edit.rs`: splitting, merging, growing and compacting paths.
//! - `attach.rs`: [`Capture`]s, `attach` and `close`.
//! - `evict.rs`: least-recently-used eviction under a byte budget.
//! - `dump.rs`: the text dump.
//! - `invariants.rs`: the consistency check.
//! - `view.rs`: [`NodeView`], read-only access to nodes.
//! - `error.rs`: [`Error`].
//!
//! Real caches: the `kvcache` crate is meant to implement [`Snapshot`] for its snapshots. A KV
//! snapshot is range-shaped; when it is a lazy view of the live buffer its [`Snapshot::bytes`]
//! is zero until it is copied out, and [`PrefixTrie::evict`] re-reads every count first.
//! Rotating (sliding-window) and recurrent snapshots are point-shaped; the trie never splits or
//! merges them. This crate's tests use a fake snapshot that records the keys it covers, so a
//! restore can be compared with recomputing the prefix; the same comparison with real caches
//! and a tiny model belongs with the engine.

#![deny(missing_docs)]

mod attach;
mod dump;
mod edit;
mod error;
mod evict;
mod invariants;
mod key;
mod node;
mod prompt;
mod restore;
mod schedule;
mod session;
mod snapshot;
mod trie;
mod view;

pub use attach::{AttachReport, Capture, CloseReport};
pub use error::{BoxError, Error, Result};
pub use evict::EvictReport;
pub use key::{Key, Lookahead};
pub use node::NodeId;
pub use prompt::{MediaItem, Prompt};
pub use restore::{LayerRestore, MatchInfo};
pub use schedule::SchedulePolicy;
pub use session::SessionId;
pub use snapshot::{Coverage, LayerKind, Snapshot};
pub use trie::{Begin, Config, PrefixTrie};
pub use view::NodeView;
