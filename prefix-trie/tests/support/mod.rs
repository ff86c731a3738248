//! A fake snapshot that records the keys it covers, and a fake engine that drives the trie the
//! way the runner will: per session begin, restore into fresh caches, prefill with scheduled
//! captures, attach, close; any number of sessions live at once.
#![allow(dead_code)]

use std::fmt;
use std::ops::Range;

use prefix_trie::{
    AttachReport, Begin, Capture, Config, Coverage, Key, LayerKind, LayerRestore, Lookahead,
    MediaItem, PrefixTrie, Prompt, SchedulePolicy, SessionId, Snapshot,
};

/// Bytes a fake range snapshot holds per key, and a fake point snapshot in all.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub range_per_key: usize,
    pub point: usize,
}

/// A snapshot whose state is the keys it saw: a range snapshot holds the keys of its range,
/// a point snapshot the whole history up to its offset (as a recurrent state depends on it).
#[derive(Clone, PartialEq, Eq)]
pub enum Fake {
    Range {
        start: usize,
        keys: Vec<Key>,
        per_key: usize,
    },
    Point {
        history: Vec<Key>,
        bytes: usize,
    },
}

impl fmt::Debug for Fake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.coverage())
    }
}

#[derive(Debug)]
pub struct FakeError(pub String);

impl fmt::Display for FakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FakeError {}

impl Snapshot for Fake {
    type Error = FakeError;

    fn coverage(&self) -> Coverage {
        match self {
            Fake::Range { start, keys, .. } => Coverage::Range(*start..start + keys.len()),
            Fake::Point { history, .. } => Coverage::Point(history.len()),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Fake::Range { keys, per_key, .. } => keys.len() * per_key,
            Fake::Point { bytes, .. } => *bytes,
        }
    }

    fn split(self, at: usize) -> Result<(Self, Self), FakeError> {
        match self {
            Fake::Range {
                start,
                mut keys,
                per_key,
            } if start < at && at < start + keys.len() => {
                let tail = keys.split_off(at - start);
                Ok((
                    Fake::Range {
                        start,
                        keys,
                        per_key,
                    },
                    Fake::Range {
                        start: at,
                        keys: tail,
                        per_key,
                    },
                ))
            }
            other => Err(FakeError(format!("cannot split {other:?} at {at}"))),
        }
    }

    fn merge(self, later: Self) -> Result<Self, FakeError> {
        match (self, later) {
            (
                Fake::Range {
                    start,
                    mut keys,
                    per_key,
                },
                Fake::Range {
                    start: later_start,
                    keys: later_keys,
                    ..
                },
            ) if start + keys.len() == later_start => {
                keys.extend(later_keys);
                Ok(Fake::Range {
                    start,
                    keys,
                    per_key,
                })
            }
            (earlier, later) => Err(FakeError(format!(
                "cannot merge {earlier:?} with {later:?}"
            ))),
        }
    }
}

/// How a request ends.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Prefill completes and these tokens are generated (the last is never forwarded).
    Finish(Vec<u32>),
    /// The client cancels once the caches hold this many positions (clamped into the prefill).
    CancelAt(usize),
}

/// What a request saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    pub matched: usize,
    pub restore_at: usize,
    /// Where the caches rested at close.
    pub rest_at: usize,
    /// The tokens recorded (prompt, then generated).
    pub tokens: Vec<u32>,
}

/// A session between begin and close, with what its own caches have prefilled.
#[derive(Debug)]
pub struct Live {
    pub session: SessionId,
    pub tokens: Vec<u32>,
    pub media: Vec<MediaItem>,
    pub prompt: Prompt,
    pub begin: Begin,
    /// Where the last capture was taken (the restore point before any): the next range
    /// capture starts here.
    pub captured_to: usize,
    /// How far the session's caches have prefilled.
    pub prefilled: usize,
    /// Captures taken but not yet attached.
    pub pending: Vec<Capture<Fake>>,
}

impl Live {
    /// Where prefill ends: everything but the seed token, which decoding forwards first.
    pub fn prefill_end(&self) -> usize {
        self.prompt.resume_limit().max(self.begin.restore_at)
    }
}

/// Drives a trie like the engine does, checking every restore against recomputation.
pub struct Engine {
    pub trie: PrefixTrie<Fake>,
    pub sizes: Sizes,
    /// When set, the next request evicts down to this budget between prefill and close, as
    /// an engine under memory pressure may.
    pub evict_mid_request: Option<usize>,
}

impl Engine {
    pub fn new(
        layers: Vec<LayerKind>,
        lookahead: Lookahead,
        schedule: SchedulePolicy,
        sizes: Sizes,
    ) -> Self {
        let trie = PrefixTrie::new(Config {
            layers,
            lookahead,
            schedule,
        })
        .unwrap();
        Engine {
            trie,
            sizes,
            evict_mid_request: None,
        }
    }

    /// The production-like hybrid model of the upstream scenario tests: recurrent and full
    /// attention layers interleaved, a drafter with its own KV (look-ahead 1), captures every
    /// 8 keys and 4 before the end.
    pub fn hybrid() -> Self {
        use LayerKind::{Point, Range};
        Engine::new(
            vec![Point, Range, Point, Range],
            Lookahead::NextToken,
            SchedulePolicy {
                interval: 8,
                before_end: 4,
            },
            Sizes {
                range_per_key: 1,
                point: 64,
            },
        )
    }

    pub fn lookahead(&self) -> Lookahead {
        self.trie.config().lookahead
    }

    pub fn prompt(&self, tokens: &[u32], media: &[MediaItem]) -> Prompt {
        Prompt::new(tokens, media, self.lookahead()).unwrap()
    }

    /// Begins a session and checks its decisions and its restore against recomputation.
    pub fn begin(&mut self, tokens: &[u32], media: &[MediaItem], turn_starts: &[usize]) -> Live {
        let prompt = self.prompt(tokens, media);
        let keys = prompt.keys();
        let begin = self.trie.begin(&prompt, turn_starts).unwrap();
        assert!(begin.restore_at <= begin.matched);
        assert!(begin.restore_at <= prompt.resume_limit());
        assert!(
            inside(prompt.non_causal(), begin.restore_at).is_none(),
            "restore inside media"
        );
        for &offset in &begin.capture_at {
            assert!(begin.restore_at < offset && offset <= keys.len());
            assert!(
                inside(prompt.non_causal(), offset).is_none(),
                "capture inside media"
            );
        }
        let live = Live {
            session: begin.session,
            tokens: tokens.to_vec(),
            media: media.to_vec(),
            captured_to: begin.restore_at,
            prefilled: begin.restore_at,
            prompt,
            begin,
            pending: Vec::new(),
        };
        self.check_restore(&live);
        self.check();
        live
    }

    /// Prefills the session's caches up to `to` (clamped into the prefill, and never stopping
    /// inside a non-causal item), taking the scheduled captures on the way.
    pub fn prefill(&self, live: &mut Live, to: usize) {
        let stop = self.stop_at(live, to);
        if stop <= live.prefilled {
            return;
        }
        let keys = live.prompt.keys();
        let due: Vec<usize> = live
            .begin
            .capture_at
            .iter()
            .copied()
            .filter(|&offset| live.prefilled < offset && offset <= stop)
            .collect();
        for offset in due {
            let captures = self.capture(keys, live.captured_to, offset);
            live.pending.extend(captures);
            live.captured_to = offset;
        }
        live.prefilled = stop;
    }

    /// Where a prefill asked to stop at `to` stops: inside the prefill, at an end of any
    /// non-causal item (prefill never splits one).
    pub fn stop_at(&self, live: &Live, to: usize) -> usize {
        let at = to.clamp(live.begin.restore_at, live.prefill_end());
        match inside(live.prompt.non_causal(), at) {
            Some(span) if span.end <= live.prefill_end() => span.end,
            Some(span) => span.start,
            None => at,
        }
    }

    /// Attaches the session's pending captures.
    pub fn attach(&mut self, live: &mut Live) -> AttachReport {
        let captures = std::mem::take(&mut live.pending);
        let report = self.trie.attach(live.session, captures).unwrap();
        self.check();
        report
    }

    /// Closes the session: a finished one prefills to its end and records the generated
    /// tokens; a cancelled one rests where its prefill stopped (or where it already was, if it
    /// got further). Pending captures go with the close; the page-out reads this session's
    /// own keys only, so a page-out of another path's edge shows up as wrong content.
    pub fn close(&mut self, mut live: Live, outcome: Outcome) -> Served {
        let (recorded_tokens, rest_at) = match &outcome {
            Outcome::Finish(generated) => {
                let end = live.prefill_end();
                self.prefill(&mut live, end);
                let mut all = live.tokens.clone();
                all.extend_from_slice(generated);
                // Every token but the last sampled one entered the caches.
                let rest_at = (all.len() - 1).max(end);
                (all, rest_at)
            }
            Outcome::CancelAt(at) => {
                let stop = self.stop_at(&live, *at);
                self.prefill(&mut live, stop);
                (live.tokens.clone(), stop)
            }
        };
        let recorded = Prompt::new(&recorded_tokens, &live.media, self.lookahead()).unwrap();
        let history = recorded.keys().to_vec();
        let sizes = self.sizes;
        self.trie
            .close(
                live.session,
                &history,
                rest_at,
                live.pending,
                |_layer, coverage| page_out(&history, rest_at, coverage, sizes),
            )
            .unwrap();
        self.check();
        Served {
            matched: live.begin.matched,
            restore_at: live.begin.restore_at,
            rest_at,
            tokens: recorded_tokens,
        }
    }

    /// Serves one request alone and returns what happened. Panics when a restore does not
    /// reproduce the prompt's prefix or the trie breaks an invariant.
    pub fn serve(
        &mut self,
        tokens: &[u32],
        media: &[MediaItem],
        turn_starts: &[usize],
        outcome: Outcome,
    ) -> Served {
        let mut live = self.begin(tokens, media, turn_starts);
        match &outcome {
            Outcome::Finish(_) => {
                let end = live.prefill_end();
                self.prefill(&mut live, end);
                self.attach(&mut live);
            }
            Outcome::CancelAt(at) => self.prefill(&mut live, *at),
        }
        if let Some(budget) = self.evict_mid_request.take() {
            self.trie.evict(budget).unwrap();
            self.check();
            self.check_restore(&live);
        }
        self.close(live, outcome)
    }

    /// What every layer captures when the prefill crosses `offset`, its last capture at `base`.
    pub fn capture(&self, keys: &[Key], base: usize, offset: usize) -> Vec<Capture<Fake>> {
        let layers = self.trie.config().layers.clone();
        layers
            .iter()
            .enumerate()
            .filter_map(|(layer, kind)| {
                let snapshot = match kind {
                    LayerKind::Stateless => return None,
                    LayerKind::Range => Fake::Range {
                        start: base,
                        keys: keys[base..offset].to_vec(),
                        per_key: self.sizes.range_per_key,
                    },
                    LayerKind::Point => Fake::Point {
                        history: keys[..offset].to_vec(),
                        bytes: self.sizes.point,
                    },
                };
                Some(Capture { layer, snapshot })
            })
            .collect()
    }

    /// Restores fresh caches from the session's plan and compares every layer with
    /// recomputing the prompt's keys up to the restore point.
    pub fn check_restore(&self, live: &Live) {
        let expected = &live.prompt.keys()[..live.begin.restore_at];
        let plan = self.trie.restore_plan(live.session).unwrap();
        for (layer, step) in plan.into_iter().enumerate() {
            let state: Option<Vec<Key>> = match step {
                LayerRestore::Stateless => None,
                LayerRestore::Empty => Some(Vec::new()),
                LayerRestore::Point(snapshot) => match snapshot {
                    Fake::Point { history, .. } => Some(history.clone()),
                    other => panic!("layer {layer}: point restore from {other:?}"),
                },
                LayerRestore::Range(segments) => {
                    let mut state = Vec::new();
                    for segment in segments {
                        match segment {
                            Fake::Range { start, keys, .. } => {
                                assert_eq!(
                                    *start,
                                    state.len(),
                                    "layer {layer}: segments not adjacent"
                                );
                                state.extend_from_slice(keys);
                            }
                            other => panic!("layer {layer}: range restore from {other:?}"),
                        }
                    }
                    Some(state)
                }
            };
            if let Some(state) = state {
                assert_eq!(state, expected, "layer {layer} restored a different state");
            }
        }
    }

    /// The trie's own invariants, plus: every stored snapshot holds exactly the keys of its edge
    /// (range) or of the whole path to its node (point).
    pub fn check(&self) {
        self.trie.check_invariants().unwrap();
        for node in self.trie.nodes() {
            let path = self.trie.path_keys(node.id).unwrap();
            for (layer, snapshot) in node.snapshots.iter().enumerate() {
                match snapshot {
                    Some(Fake::Range { start, keys, .. }) => {
                        assert_eq!(*start, node.start, "layer {layer}");
                        assert_eq!(keys.as_slice(), node.keys, "layer {layer} range content");
                    }
                    Some(Fake::Point { history, .. }) => {
                        assert_eq!(history, &path, "layer {layer} point content");
                    }
                    None => {}
                }
            }
        }
    }

    /// Where a request for these tokens would resume, without running it.
    pub fn resume_point(&self, tokens: &[u32], media: &[MediaItem]) -> usize {
        self.trie
            .find(&self.prompt(tokens, media))
            .unwrap()
            .restore_at
    }
}

fn page_out(
    history: &[Key],
    rest_at: usize,
    coverage: Coverage,
    sizes: Sizes,
) -> Result<Fake, FakeError> {
    match coverage {
        Coverage::Range(range) if range.end <= rest_at => Ok(Fake::Range {
            start: range.start,
            keys: history[range].to_vec(),
            per_key: sizes.range_per_key,
        }),
        Coverage::Point(at) if at == rest_at => Ok(Fake::Point {
            history: history[..at].to_vec(),
            bytes: sizes.point,
        }),
        other => Err(FakeError(format!(
            "caches rest at {rest_at}; cannot page out {other:?}"
        ))),
    }
}

/// The span `offset` falls strictly inside.
pub fn inside(spans: &[Range<usize>], offset: usize) -> Option<Range<usize>> {
    spans
        .iter()
        .find(|span| span.start < offset && offset < span.end)
        .cloned()
}

/// Tokens `from..to`, handy for building prompts.
pub fn run(from: u32, to: u32) -> Vec<u32> {
    (from..to).collect()
}

/// Concatenates token runs.
pub fn cat(parts: &[&[u32]]) -> Vec<u32> {
    parts.concat()
}
