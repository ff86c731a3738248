//! Random workloads. One request at a time: shared prefixes, divergences, media, cancellations
//! at random points and evictions under random budgets. Many at once: begin, prefill, attach,
//! close, abandon and evict interleaved over up to four live sessions. After every step: the
//! trie's invariants hold, every stored snapshot holds exactly its edge's keys, every restore
//! equals recomputing the prefix (checked inside the fake engine), eviction meets its budget
//! unless only protected bytes remain, and a request evicted around while live still resumes
//! exactly where its caches rested (or later) once closed.

mod support;

use prefix_trie::{LayerKind, Lookahead, MediaItem, SchedulePolicy};
use proptest::prelude::*;
use support::{Engine, Outcome, Sizes, inside};

#[derive(Clone, Debug)]
struct Setup {
    layers: Vec<LayerKind>,
    lookahead: Lookahead,
    schedule: SchedulePolicy,
    sizes: Sizes,
}

#[derive(Clone, Debug)]
struct Image {
    offset: usize,
    len: usize,
    content_hash: u64,
    causal: bool,
}

#[derive(Clone, Debug)]
enum Op {
    Request {
        base: usize,
        keep: usize,
        extra: Vec<u32>,
        image: Option<Image>,
        turn_start: Option<usize>,
        evict_mid_request: Option<usize>,
        outcome: Outcome,
    },
    Evict {
        budget: usize,
    },
}

fn setup() -> impl Strategy<Value = Setup> {
    use LayerKind::{Point, Range, Stateless};
    let layers = prop_oneof![
        Just(vec![Range]),
        Just(vec![Point]),
        Just(vec![Range, Stateless, Range]),
        Just(vec![Point, Range, Point, Range]),
        Just(vec![Range, Point, Stateless]),
    ];
    let lookahead = prop_oneof![Just(Lookahead::None), Just(Lookahead::NextToken)];
    (
        layers,
        lookahead,
        prop_oneof![Just(0), Just(3), Just(8)],
        0..5usize,
        0..3usize,
        prop_oneof![Just(0), Just(16), Just(64)],
    )
        .prop_map(
            |(layers, lookahead, interval, before_end, range_per_key, point)| Setup {
                layers,
                lookahead,
                schedule: SchedulePolicy {
                    interval,
                    before_end,
                },
                sizes: Sizes {
                    range_per_key,
                    point,
                },
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    // A tiny alphabet makes unrelated requests share prefixes by accident too.
    let tokens = |max| prop::collection::vec(0..4u32, 1..max);
    let image = (0..8usize, 1..6usize, 1..3u64, any::<bool>()).prop_map(
        |(offset, len, content_hash, causal)| Image {
            offset,
            len,
            content_hash,
            causal,
        },
    );
    let outcome = prop_oneof![
        tokens(6).prop_map(Outcome::Finish),
        (0..60usize).prop_map(Outcome::CancelAt),
    ];
    prop_oneof![
        4 => (
            (any::<usize>(), any::<usize>(), tokens(16)),
            prop::option::of(image),
            prop::option::of(0..40usize),
            prop::option::weighted(0.2, 0..600usize),
            outcome,
        )
            .prop_map(|((base, keep, extra), image, turn_start, evict_mid_request, outcome)| {
                Op::Request { base, keep, extra, image, turn_start, evict_mid_request, outcome }
            }),
        1 => (0..1500usize).prop_map(|budget| Op::Evict { budget }),
    ]
}

/// A conversation as recorded: tokens, media, and where the caches rested.
#[derive(Clone, Debug)]
struct Recorded {
    tokens: Vec<u32>,
    media: Vec<MediaItem>,
    /// The prompt that resumes exactly at `rest_at`: the retry of a cancelled prefill, or the
    /// recorded conversation plus one token.
    resume_prompt: Vec<u32>,
    rest_at: usize,
}

fn build_request(
    conversations: &[Recorded],
    base: usize,
    keep: usize,
    extra: &[u32],
    image: Option<&Image>,
) -> (Vec<u32>, Vec<MediaItem>) {
    let (mut tokens, mut media) = match base % (conversations.len() + 1) {
        0 => (Vec::new(), Vec::new()),
        index => {
            let conversation = &conversations[index - 1];
            (conversation.tokens.clone(), conversation.media.clone())
        }
    };
    let mut keep = keep % (tokens.len() + 1);
    // Never cut a media item in two: drop it whole.
    if let Some(item) = media
        .iter()
        .find(|item| item.tokens.start < keep && keep < item.tokens.end)
    {
        keep = item.tokens.start;
    }
    media.retain(|item| item.tokens.end <= keep);
    tokens.truncate(keep);
    if let Some(image) = image {
        let start = keep + image.offset.min(extra.len() - 1);
        let end = (start + image.len).min(keep + extra.len());
        media.push(MediaItem {
            tokens: start..end,
            content_hash: image.content_hash,
            causal: image.causal,
        });
    }
    tokens.extend_from_slice(extra);
    (tokens, media)
}

/// A request just closed must resume no earlier than where its caches rested, whatever
/// eviction did while it was live (later, if an older request had already stored more of the
/// same prompt).
fn assert_resumes_where_it_rested(engine: &Engine, last: &Recorded) {
    let resumed = engine.resume_point(&last.resume_prompt, &last.media);
    assert!(
        resumed >= last.rest_at,
        "resumed at {resumed}, rested at {}\n{}",
        last.rest_at,
        engine.trie.dump()
    );
}

/// Over budget only when nothing left can be released: every node but the root, the nodes
/// live sessions are pinned to and branch points holds no point state, and (for a leaf)
/// nothing at all.
fn assert_only_protected_bytes(engine: &Engine) {
    let layers = &engine.trie.config().layers;
    let nodes: Vec<_> = engine.trie.nodes().collect();
    for node in &nodes {
        if node.parent.is_none() || node.pinned || node.children > 1 {
            continue;
        }
        let child = nodes.iter().find(|other| other.parent == Some(node.id));
        for (layer, kind) in layers.iter().enumerate() {
            let held = node.snapshots[layer].is_some_and(|s| prefix_trie::Snapshot::bytes(s) > 0);
            let releasable = match (child, kind) {
                (None, _) => held,
                (Some(_), LayerKind::Point) => held,
                (Some(child), _) => held && child.snapshots[layer].is_none(),
            };
            assert!(
                !releasable,
                "evictable bytes left in node {:?}:\n{}",
                node.id,
                engine.trie.dump()
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_workloads_keep_every_invariant(setup in setup(), ops in prop::collection::vec(op(), 1..30)) {
        let mut engine = Engine::new(setup.layers.clone(), setup.lookahead, setup.schedule, setup.sizes);
        let mut conversations: Vec<Recorded> = Vec::new();
        for op in &ops {
            match op {
                Op::Request { base, keep, extra, image, turn_start, evict_mid_request, outcome } => {
                    engine.evict_mid_request = *evict_mid_request;
                    let (tokens, media) = build_request(&conversations, *base, *keep, extra, image.as_ref());
                    let turn_starts: Vec<usize> = turn_start.iter().copied().collect();
                    let served = engine.serve(&tokens, &media, &turn_starts, outcome.clone());
                    let prompt = engine.prompt(&tokens, &media);
                    prop_assert!(inside(prompt.non_causal(), served.rest_at).is_none());
                    let resume_prompt = match outcome {
                        Outcome::CancelAt(_) => tokens.clone(),
                        Outcome::Finish(_) => {
                            let mut next = served.tokens.clone();
                            next.push(3);
                            next
                        }
                    };
                    let recorded = Recorded { tokens: served.tokens, media, resume_prompt, rest_at: served.rest_at };
                    assert_resumes_where_it_rested(&engine, &recorded);
                    conversations.push(recorded);
                }
                Op::Evict { budget } => {
                    let report = engine.trie.evict(*budget).unwrap();
                    engine.check();
                    prop_assert_eq!(report.bytes, engine.trie.bytes());
                    if engine.trie.bytes() > *budget {
                        assert_only_protected_bytes(&engine);
                    }
                }
            }
        }
    }
}

/// One step of a workload with several sessions live at once. `which` picks a live session.
#[derive(Clone, Debug)]
enum Event {
    Begin {
        base: usize,
        keep: usize,
        extra: Vec<u32>,
        image: Option<Image>,
        turn_start: Option<usize>,
    },
    /// Prefill a session further; attach what it captured, or keep it for close.
    Prefill {
        which: usize,
        to: usize,
        attach: bool,
    },
    /// Close a session; `CancelAt` below its prefill is a rollback.
    Close {
        which: usize,
        outcome: Outcome,
    },
    Abandon {
        which: usize,
    },
    Evict {
        budget: usize,
    },
}

/// At most this many sessions are live at once; a begin beyond it is skipped.
const MAX_LIVE: usize = 4;

/// The prefixes prompts are drawn from: system prompts sharing parts with one another.
fn system_prompts() -> Vec<Recorded> {
    let systems: [Vec<u32>; 3] = [
        (10..22).collect(),
        [(10..16).collect::<Vec<_>>(), (30..36).collect()].concat(),
        (40..47).collect(),
    ];
    systems
        .into_iter()
        .map(|tokens| Recorded {
            resume_prompt: tokens.clone(),
            tokens,
            media: Vec::new(),
            rest_at: 0,
        })
        .collect()
}

fn event() -> impl Strategy<Value = Event> {
    let tokens = |max| prop::collection::vec(0..4u32, 1..max);
    let image = (0..8usize, 1..6usize, 1..3u64, any::<bool>()).prop_map(
        |(offset, len, content_hash, causal)| Image {
            offset,
            len,
            content_hash,
            causal,
        },
    );
    let outcome = prop_oneof![
        tokens(6).prop_map(Outcome::Finish),
        (0..60usize).prop_map(Outcome::CancelAt),
    ];
    prop_oneof![
        3 => (
            any::<usize>(),
            any::<usize>(),
            tokens(16),
            prop::option::weighted(0.2, image),
            prop::option::of(0..40usize),
        )
            .prop_map(|(base, keep, extra, image, turn_start)| Event::Begin {
                base,
                keep,
                extra,
                image,
                turn_start,
            }),
        3 => (any::<usize>(), 0..60usize, any::<bool>())
            .prop_map(|(which, to, attach)| Event::Prefill { which, to, attach }),
        2 => (any::<usize>(), outcome).prop_map(|(which, outcome)| Event::Close { which, outcome }),
        1 => any::<usize>().prop_map(|which| Event::Abandon { which }),
        1 => (0..1500usize).prop_map(|budget| Event::Evict { budget }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random interleavings of begin, prefill and attach, close (finished, or cancelled at a
    /// random point, possibly below what was attached), abandon and evict over up to four live
    /// sessions with prompts sharing prefixes. After every event: the invariants hold (the
    /// session bookkeeping included), every stored snapshot holds its edge's keys (so no
    /// page-out or capture landed on another session's path), every live session's restore plan
    /// still reproduces its prompt up to its restore point, eviction meets its budget unless only
    /// protected bytes remain, and a session just closed resumes where its caches rested.
    #[test]
    fn interleaved_sessions_keep_every_invariant(
        setup in setup(),
        events in prop::collection::vec(event(), 1..40),
    ) {
        let mut engine = Engine::new(setup.layers.clone(), setup.lookahead, setup.schedule, setup.sizes);
        let mut pool = system_prompts();
        let mut lives: Vec<support::Live> = Vec::new();
        for event in &events {
            match event {
                Event::Begin { base, keep, extra, image, turn_start } => {
                    if lives.len() == MAX_LIVE {
                        continue;
                    }
                    let (tokens, media) = build_request(&pool, *base, *keep, extra, image.as_ref());
                    let turn_starts: Vec<usize> = turn_start.iter().copied().collect();
                    lives.push(engine.begin(&tokens, &media, &turn_starts));
                }
                Event::Prefill { which, to, attach } => {
                    let Some(index) = pick(&lives, *which) else { continue };
                    engine.prefill(&mut lives[index], *to);
                    if *attach {
                        engine.attach(&mut lives[index]);
                    }
                }
                Event::Close { which, outcome } => {
                    let Some(index) = pick(&lives, *which) else { continue };
                    let live = lives.swap_remove(index);
                    let (tokens, media) = (live.tokens.clone(), live.media.clone());
                    let served = engine.close(live, outcome.clone());
                    let prompt = engine.prompt(&tokens, &media);
                    prop_assert!(inside(prompt.non_causal(), served.rest_at).is_none());
                    let resume_prompt = match outcome {
                        Outcome::CancelAt(_) => tokens,
                        Outcome::Finish(_) => {
                            let mut next = served.tokens.clone();
                            next.push(3);
                            next
                        }
                    };
                    let recorded = Recorded { tokens: served.tokens, media, resume_prompt, rest_at: served.rest_at };
                    assert_resumes_where_it_rested(&engine, &recorded);
                    pool.push(recorded);
                }
                Event::Abandon { which } => {
                    let Some(index) = pick(&lives, *which) else { continue };
                    let live = lives.swap_remove(index);
                    engine.trie.abandon(live.session);
                    engine.check();
                }
                Event::Evict { budget } => {
                    let report = engine.trie.evict(*budget).unwrap();
                    engine.check();
                    prop_assert_eq!(report.bytes, engine.trie.bytes());
                    if engine.trie.bytes() > *budget {
                        assert_only_protected_bytes(&engine);
                    }
                }
            }
            prop_assert_eq!(engine.trie.live_sessions(), lives.len());
            for live in &lives {
                engine.check_restore(live);
            }
        }
        // Every live session still closes.
        for live in lives {
            engine.close(live, Outcome::Finish(vec![1]));
        }
        prop_assert_eq!(engine.trie.live_sessions(), 0);
    }
}

fn pick(lives: &[support::Live], which: usize) -> Option<usize> {
    (!lives.is_empty()).then(|| which % lives.len())
}
