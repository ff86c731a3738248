//! `PrefixCache`: the loaded model's prefix trie of cache snapshots, and the two moments the
//! step loop meets it — a sequence's admission (match, restore, schedule captures) and its
//! retirement, finished or cancelled (attach what its prefill captured, page out the rest of
//! what it evaluated, evict down to the byte budget).

use kvcache::{LayerCache, LayerSnapshot};
use prefix_trie::{
    Capture, CloseReport, Config, EvictReport, LayerKind, LayerRestore, Lookahead, MediaItem,
    PrefixTrie, Prompt, SchedulePolicy, SessionId,
};

use crate::engine::sequence::Sequence;

/// The default periodic capture interval: a prefill that fails mid-way (a cancelled one is
/// paged out whole at retirement) loses at most this many tokens.
pub const CAPTURE_INTERVAL: usize = 2048;

/// What went wrong between the trie and the caches.
#[derive(Debug, thiserror::Error)]
pub enum PrefixError {
    /// The trie refused an operation.
    #[error("prefix cache: {0}")]
    Trie(#[from] prefix_trie::Error),
    /// A cache refused a restore or snapshot.
    #[error("prefix cache: {0}")]
    Cache(#[from] kvcache::Error),
}

/// Where an admitted sequence starts.
pub struct Restored {
    /// Its trie session.
    pub session: SessionId,
    /// Prompt tokens its caches now hold.
    pub restore_at: usize,
    /// The offsets its caches capture at.
    pub capture_at: Vec<usize>,
}

/// The loaded model's prefix trie and its byte budget.
pub struct PrefixCache {
    trie: PrefixTrie<LayerSnapshot>,
    budget: usize,
}

impl PrefixCache {
    /// A trie for caches shaped like `caches` (fresh ones from the model), holding at most
    /// `budget` bytes of snapshots between requests and capturing every `interval` tokens.
    pub fn new(
        caches: &[Option<LayerCache>],
        budget: usize,
        interval: usize,
    ) -> Result<PrefixCache, PrefixError> {
        let layers = caches
            .iter()
            .map(|c| {
                c.as_ref()
                    .map_or(LayerKind::Stateless, LayerCache::layer_kind)
            })
            .collect();
        let trie = PrefixTrie::new(Config {
            layers,
            lookahead: Lookahead::None,
            schedule: SchedulePolicy {
                interval,
                ..SchedulePolicy::default()
            },
        })?;
        Ok(PrefixCache { trie, budget })
    }

    /// Bytes the trie's snapshots hold, as last counted.
    pub fn bytes(&self) -> usize {
        self.trie.bytes()
    }

    /// The byte budget.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Nodes in the trie, the root included.
    pub fn node_count(&self) -> usize {
        self.trie.node_count()
    }

    /// The trie, for inspection (tests, dumps).
    pub fn trie(&self) -> &PrefixTrie<LayerSnapshot> {
        &self.trie
    }

    /// Begins a session for `prompt`, whose `media` positions are keyed by their content
    /// (never restored or captured inside one): restores the fresh `caches` to the deepest
    /// cached prefix and schedules the captures its prefill should take. On failure the session is
    /// abandoned and the caches must be rebuilt empty.
    pub fn begin(
        &mut self,
        prompt: &[u32],
        media: &[MediaItem],
        turn_starts: &[usize],
        caches: &mut [Option<LayerCache>],
    ) -> Result<Restored, PrefixError> {
        let keyed = Prompt::new(prompt, media, Lookahead::None)?;
        let begin = self.trie.begin(&keyed, turn_starts)?;
        let restored = self.restore(begin.session, caches).and_then(|()| {
            for cache in caches.iter_mut().flatten() {
                cache.schedule_captures(&begin.capture_at)?;
            }
            Ok(())
        });
        match restored {
            Ok(()) => Ok(Restored {
                session: begin.session,
                restore_at: begin.restore_at,
                capture_at: begin.capture_at,
            }),
            Err(e) => {
                self.trie.abandon(begin.session);
                Err(e)
            }
        }
    }

    fn restore(
        &self,
        session: SessionId,
        caches: &mut [Option<LayerCache>],
    ) -> Result<(), PrefixError> {
        for (plan, cache) in self.trie.restore_plan(session)?.into_iter().zip(caches) {
            let Some(cache) = cache.as_mut() else {
                continue;
            };
            match plan {
                LayerRestore::Stateless | LayerRestore::Empty => {}
                LayerRestore::Range(segments) => {
                    for segment in segments {
                        cache.restore(segment)?;
                    }
                }
                LayerRestore::Point(snapshot) => cache.restore(snapshot)?,
            }
        }
        Ok(())
    }

    /// Records a retiring sequence — finished or cancelled, its caches resting after
    /// `sequence.tokens` — then evicts down to the budget.
    pub fn close(&mut self, sequence: &mut Sequence) -> Result<CloseReport, PrefixError> {
        let Some(session) = sequence.trie_session.take() else {
            return Ok(CloseReport::default());
        };
        sequence.collect_captures();
        let captures = std::mem::take(&mut sequence.captures);
        // A prefill chunk never ends inside an image: each one is held whole or not at all.
        let media = sequence.job.media_items(sequence.tokens.len());
        self.close_caches(
            session,
            &sequence.tokens,
            &media,
            captures,
            &sequence.caches,
        )
    }

    /// Records `session`, whose `caches` rest after `tokens` (with `media` at their positions)
    /// and took `captures` on the way.
    pub fn close_caches(
        &mut self,
        session: SessionId,
        tokens: &[u32],
        media: &[MediaItem],
        captures: Vec<Capture<LayerSnapshot>>,
        caches: &[Option<LayerCache>],
    ) -> Result<CloseReport, PrefixError> {
        let keys = Prompt::new(tokens, media, Lookahead::None)?;
        let report = self.trie.close(
            session,
            keys.keys(),
            tokens.len(),
            captures,
            |layer, coverage| match caches.get(layer).and_then(Option::as_ref) {
                Some(cache) => cache.snapshot_coverage(&coverage),
                None => Err(kvcache::Error::Config(format!(
                    "layer {layer} has no cache to page out"
                ))),
            },
        )?;
        Ok(report)
    }

    /// Ends a sequence's session without recording it (its caches are in an unknown state).
    pub fn abandon(&mut self, sequence: &mut Sequence) {
        if let Some(session) = sequence.trie_session.take() {
            self.trie.abandon(session);
        }
    }

    /// Ends a session that no sequence holds (yet).
    pub fn abandon_session(&mut self, session: SessionId) {
        self.trie.abandon(session);
    }

    /// Evicts least recently used snapshots until the trie is within its budget.
    pub fn evict(&mut self) -> Result<EvictReport, PrefixError> {
        Ok(self.trie.evict(self.budget)?)
    }
}
