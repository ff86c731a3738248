//! A fake snapshot that records the keys it covers, and a fake engine that drives the trie the
//! way the runner will: begin, restore, prefill with scheduled captures, attach, close.
#![allow(dead_code)]

use std::fmt;
use std::ops::Range;

use prefix_trie::{
    Capture, Config, Coverage, Key, LayerKind, LayerRestore, Lookahead, MediaItem, PrefixTrie,
    Prompt, SchedulePolicy, Snapshot,
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

/// Drives a trie like the engine does, checking every restore against recomputation.
pub struct Engine {
    pub trie: PrefixTrie<Fake>,
    pub sizes: Sizes,
    /// What the live caches hold after the last request.
    pub live: Vec<Key>,
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
            live: Vec::new(),
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

    /// Serves one request and returns what happened. Panics when a restore does not reproduce
    /// the prompt's prefix or the trie breaks an invariant.
    pub fn serve(
        &mut self,
        tokens: &[u32],
        media: &[MediaItem],
        turn_starts: &[usize],
        outcome: Outcome,
    ) -> Served {
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
        // The caches left live by the last request hold this prompt up to where they agree.
        let agree = self
            .live
            .iter()
            .zip(keys)
            .take_while(|(a, b)| a == b)
            .count();
        assert_eq!(
            begin.live_common,
            agree.min(begin.restore_at),
            "live_common"
        );
        self.check_restore(&keys[..begin.restore_at]);

        // Prefill evaluates everything but the seed token, which decoding forwards first.
        let prefill_end = prompt.resume_limit().max(begin.restore_at);
        let stop = match &outcome {
            Outcome::Finish(_) => prefill_end,
            Outcome::CancelAt(at) => {
                let at = (*at).clamp(begin.restore_at, prefill_end);
                // Prefill never splits a non-causal item, so a cancel lands at one of its ends.
                match inside(prompt.non_causal(), at) {
                    Some(span) if span.end <= prefill_end => span.end,
                    Some(span) => span.start,
                    None => at,
                }
            }
        };
        let mut captures = Vec::new();
        let mut base = begin.restore_at;
        for &offset in begin.capture_at.iter().filter(|&&offset| offset <= stop) {
            captures.extend(self.capture(keys, base, offset));
            base = offset;
        }

        let (recorded_tokens, rest_at) = match &outcome {
            Outcome::Finish(generated) => {
                self.trie.attach(captures).unwrap();
                captures = Vec::new();
                let mut all = tokens.to_vec();
                all.extend_from_slice(generated);
                // Every token but the last sampled one entered the caches.
                let rest_at = (all.len() - 1).max(stop);
                (all, rest_at)
            }
            Outcome::CancelAt(_) => (tokens.to_vec(), stop),
        };
        if let Some(budget) = self.evict_mid_request.take() {
            self.trie.evict(budget).unwrap();
            self.trie.check_invariants().unwrap();
        }
        let recorded = Prompt::new(&recorded_tokens, media, self.lookahead()).unwrap();
        let history = recorded.keys().to_vec();
        let sizes = self.sizes;
        self.trie
            .close(&history, rest_at, captures, |_layer, coverage| {
                page_out(&history, rest_at, coverage, sizes)
            })
            .unwrap();
        self.check();
        self.live = history[..rest_at].to_vec();
        Served {
            matched: begin.matched,
            restore_at: begin.restore_at,
            rest_at,
            tokens: recorded_tokens,
        }
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

    /// Restores every layer from the live request's plan and compares with recomputation.
    fn check_restore(&self, expected: &[Key]) {
        let plan = self.trie.restore_plan().unwrap();
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
