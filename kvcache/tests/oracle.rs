//! Property tests against a recompute oracle: random appends, snapshots, scheduled captures,
//! rewinds, restores, merges and splits on every cache kind. After every step the cache holds
//! what a fresh cache fed the same logical history holds, and every KV snapshot (lazy or not)
//! still reads the tokens it was taken over.

mod common;

use common::*;
use kvcache::{
    KvCache, LayerCache, LayerSnapshot, RecurrentCache, RotatingConfig, RotatingKvCache,
};
use prefix_trie::Coverage;
use proptest::prelude::*;

#[derive(Clone, Debug)]
pub enum Op {
    Append(usize),
    Snapshot(usize),
    Schedule(Vec<usize>),
    Take,
    Rewind(usize),
    Restore(usize),
    Merge(usize),
    Split(usize, usize),
    Drop(usize),
}

fn op(max_append: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1..=max_append).prop_map(Op::Append),
        2 => any::<usize>().prop_map(Op::Snapshot),
        1 => prop::collection::vec(1usize..=5, 1..=4).prop_map(Op::Schedule),
        1 => Just(Op::Take),
        2 => any::<usize>().prop_map(Op::Rewind),
        2 => any::<usize>().prop_map(Op::Restore),
        1 => any::<usize>().prop_map(Op::Merge),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Op::Split(a, b)),
        1 => any::<usize>().prop_map(Op::Drop),
    ]
}

/// A snapshot the test holds, with the tokens it must reproduce: for a KV range, the ids of
/// its range; for a whole-state snapshot, the whole history up to its offset.
struct Held {
    snapshot: LayerSnapshot,
    ids: Vec<u32>,
    /// For a sliding-window snapshot, the first ring position it holds.
    ring_from: usize,
}

pub struct Harness {
    cache: LayerCache,
    history: Vec<u32>,
    next_id: u32,
    held: Vec<Held>,
    pending: Vec<usize>,
    base: usize,
    fired: Vec<(usize, usize, Vec<u32>, usize)>,
    /// A sliding-window cache's first ring position still valid after rewinds (see
    /// `RotatingKvCache`): the oracle's model of it.
    valid_from: usize,
}

impl Harness {
    pub fn new(cache: LayerCache) -> Harness {
        Harness {
            cache,
            history: Vec::new(),
            next_id: 1,
            held: Vec::new(),
            pending: Vec::new(),
            base: 0,
            fired: Vec::new(),
            valid_from: 0,
        }
    }

    /// The first ring position a sliding-window cache holds after `len` tokens.
    fn ring_from(&self, len: usize) -> usize {
        match &self.cache {
            LayerCache::Rotating(c) => {
                let config = c.config();
                let ring = config.window + config.rewind_slack;
                config
                    .keep
                    .max(len.saturating_sub(ring))
                    .max(self.valid_from)
                    .min(len)
            }
            _ => 0,
        }
    }

    fn is_kv(&self) -> bool {
        matches!(self.cache, LayerCache::Kv(_))
    }

    /// The ids a snapshot taken now over `start..offset` must hold.
    fn expected(&self, start: usize, end: usize) -> Vec<u32> {
        if self.is_kv() {
            self.history[start..end].to_vec()
        } else {
            self.history[..end].to_vec()
        }
    }

    pub fn apply(&mut self, op: &Op) {
        let offset = self.history.len();
        match *op {
            Op::Append(n) => {
                let ids: Vec<u32> = (self.next_id..self.next_id + n as u32).collect();
                self.next_id += n as u32;
                match &mut self.cache {
                    LayerCache::Recurrent(c) => recurrent_forward(c, &ids).unwrap(),
                    cache => {
                        let (k, v) = kv(&ids);
                        let history = cache.update(&k, &v).unwrap();
                        assert_eq!(
                            history.keys.dim(2).unwrap() as usize,
                            history.mask.key_len()
                        );
                    }
                }
                self.history.extend(&ids);
                while let Some(&c) = self.pending.first() {
                    if c > offset + n {
                        break;
                    }
                    self.pending.remove(0);
                    let ids = self.expected(self.base, c);
                    let ring_from = self.ring_from(c);
                    self.fired.push((self.base, c, ids, ring_from));
                    self.base = c;
                }
            }
            Op::Snapshot(start) => {
                if self.is_kv() && offset == 0 {
                    return;
                }
                let start = if self.is_kv() { start % offset } else { offset };
                let snapshot = self.cache.snapshot(start..offset).unwrap();
                let ids = self.expected(start, offset);
                let ring_from = self.ring_from(offset);
                self.check_point(&snapshot, &ids, ring_from);
                self.held.push(Held {
                    snapshot,
                    ids,
                    ring_from,
                });
            }
            Op::Schedule(ref deltas) => {
                let result = {
                    let mut at = offset;
                    let offsets: Vec<usize> = deltas
                        .iter()
                        .map(|d| {
                            at += d;
                            at
                        })
                        .collect();
                    self.cache.schedule_captures(&offsets).map(|_| offsets)
                };
                if !self.fired.is_empty() {
                    assert!(result.is_err(), "scheduling while captures wait must fail");
                    return;
                }
                self.pending = result.unwrap();
                self.base = offset;
            }
            Op::Take => {
                let captures = self.cache.take_captures();
                let fired = std::mem::take(&mut self.fired);
                self.pending.clear();
                assert_eq!(captures.len(), fired.len(), "captures taken");
                for ((at, snapshot), (start, end, ids, ring_from)) in
                    captures.into_iter().zip(fired)
                {
                    assert_eq!(at, end);
                    let expected = if self.is_kv() {
                        Coverage::Range(start..end)
                    } else {
                        Coverage::Point(end)
                    };
                    assert_eq!(snapshot.coverage(), expected);
                    self.check_point(&snapshot, &ids, ring_from);
                    self.held.push(Held {
                        snapshot,
                        ids,
                        ring_from,
                    });
                }
            }
            Op::Rewind(to) => {
                let to = to % (offset + 1);
                let allowed = match &self.cache {
                    LayerCache::Kv(_) => true,
                    LayerCache::Rotating(c) => {
                        rotating_can_rewind(c.config(), offset, to, self.valid_from)
                    }
                    LayerCache::Recurrent(_) => to == offset,
                };
                let result = self.cache.rewind(to);
                assert_eq!(
                    result.is_ok(),
                    allowed,
                    "rewind {offset} -> {to}: {result:?}"
                );
                if allowed {
                    self.history.truncate(to);
                    self.pending.clear();
                    if let LayerCache::Rotating(c) = &self.cache {
                        let ring = c.config().window + c.config().rewind_slack;
                        self.valid_from = self.valid_from.max(offset.saturating_sub(ring)).min(to);
                    }
                }
            }
            Op::Restore(i) => {
                if self.held.is_empty() {
                    return;
                }
                let held = &self.held[i % self.held.len()];
                let result = self.cache.restore(&held.snapshot);
                match held.snapshot.coverage() {
                    Coverage::Range(range) => {
                        assert_eq!(result.is_ok(), range.start <= offset, "{result:?}");
                        if result.is_ok() {
                            self.history.truncate(range.start);
                            self.history.extend(&held.ids);
                        }
                    }
                    Coverage::Point(_) => {
                        result.as_ref().unwrap();
                        self.history = held.ids.clone();
                        self.valid_from = held.ring_from;
                    }
                }
                if result.is_ok() {
                    self.pending.clear();
                }
            }
            Op::Merge(i) => {
                let pairs: Vec<(usize, usize)> = (0..self.held.len())
                    .flat_map(|a| (0..self.held.len()).map(move |b| (a, b)))
                    .filter(|&(a, b)| a != b && self.adjacent(a, b))
                    .collect();
                if pairs.is_empty() {
                    return;
                }
                let (a, b) = pairs[i % pairs.len()];
                let (first, second) = if a < b {
                    let second = self.held.remove(b);
                    (self.held.remove(a), second)
                } else {
                    let first = self.held.remove(a);
                    (first, self.held.remove(b))
                };
                let coverage = (first.snapshot.coverage(), second.snapshot.coverage());
                let merged = first.snapshot.merge(second.snapshot).unwrap();
                let ring_from = second.ring_from;
                let ids = if self.is_kv() {
                    let Coverage::Range(r) = merged.coverage() else {
                        panic!("KV merged to a point")
                    };
                    assert_eq!(r, coverage.0.end() - (first.ids.len())..coverage.1.end());
                    [first.ids, second.ids].concat()
                } else {
                    assert_eq!(merged.coverage(), coverage.1);
                    second.ids
                };
                self.check_point(&merged, &ids, ring_from);
                self.held.push(Held {
                    snapshot: merged,
                    ids,
                    ring_from,
                });
            }
            Op::Split(i, at) => {
                if self.held.is_empty() {
                    return;
                }
                let index = i % self.held.len();
                let Coverage::Range(range) = self.held[index].snapshot.coverage() else {
                    let held = self.held.remove(index);
                    assert!(
                        held.snapshot.split(at).is_err(),
                        "whole states do not split"
                    );
                    return;
                };
                if range.len() < 2 {
                    let held = self.held.remove(index);
                    assert!(
                        held.snapshot.split(range.start).is_err(),
                        "split at the start"
                    );
                    return;
                }
                let at = range.start + 1 + at % (range.len() - 1);
                let held = self.held.remove(index);
                let (head, tail) = held.snapshot.split(at).unwrap();
                assert_eq!(head.coverage(), Coverage::Range(range.start..at));
                assert_eq!(tail.coverage(), Coverage::Range(at..range.end));
                let cut = at - range.start;
                self.held.push(Held {
                    snapshot: head,
                    ids: held.ids[..cut].to_vec(),
                    ring_from: 0,
                });
                self.held.push(Held {
                    snapshot: tail,
                    ids: held.ids[cut..].to_vec(),
                    ring_from: 0,
                });
            }
            Op::Drop(i) => {
                if !self.held.is_empty() {
                    let index = i % self.held.len();
                    self.held.remove(index);
                }
            }
        }
    }

    fn adjacent(&self, a: usize, b: usize) -> bool {
        match (
            self.held[a].snapshot.coverage(),
            self.held[b].snapshot.coverage(),
        ) {
            (Coverage::Range(x), Coverage::Range(y)) => x.end == y.start,
            (Coverage::Point(x), Coverage::Point(y)) => x <= y,
            _ => false,
        }
    }

    /// Checks a whole-state snapshot when it is made (such snapshots own their data).
    fn check_point(&self, snapshot: &LayerSnapshot, ids: &[u32], ring_from: usize) {
        match snapshot {
            LayerSnapshot::Kv(_) => {}
            LayerSnapshot::Rotating(s) => {
                let LayerCache::Rotating(cache) = &self.cache else {
                    panic!("kind")
                };
                let held = held_ids(cache.config(), ids, ring_from);
                match s.arrays() {
                    Some((k, v)) => assert_holds(k, v, &held, "rotating snapshot"),
                    None => assert!(held.is_empty()),
                }
            }
            LayerSnapshot::Recurrent(s) => {
                let oracle = recurrent_oracle(ids);
                assert_same_recurrent(
                    s.conv_state(),
                    s.recurrent_state(),
                    &oracle,
                    "recurrent snapshot",
                );
            }
        }
    }

    /// The cache equals a fresh one fed the history, and every KV snapshot reads its tokens.
    pub fn check(&self) {
        assert_eq!(self.cache.offset(), self.history.len());
        match &self.cache {
            LayerCache::Kv(c) => {
                let mut fresh = KvCache::new();
                match c.view().unwrap() {
                    Some(h) => {
                        assert_holds(&h.keys, &h.values, &self.history, "KV cache");
                        let (k, v) = kv(&self.history);
                        let f = fresh.update(&k, &v).unwrap();
                        assert_eq!(
                            h.keys.to_vec::<f32>().unwrap(),
                            f.keys.to_vec::<f32>().unwrap()
                        );
                    }
                    None => assert!(self.history.is_empty()),
                }
            }
            LayerCache::Rotating(c) => {
                let held = held_ids(
                    c.config(),
                    &self.history,
                    self.ring_from(self.history.len()),
                );
                let mut fresh = RotatingKvCache::new(c.config()).unwrap();
                match c.contents().unwrap() {
                    Some((k, v)) => {
                        assert_holds(&k, &v, &held, "rotating cache");
                        // A fresh cache holds the same, unless rewinds left old slots stale.
                        let (nk, nv) = kv(&self.history);
                        fresh.update(&nk, &nv).unwrap();
                        let (fk, fv) = fresh.contents().unwrap().unwrap();
                        if fk.dim(2).unwrap() == k.dim(2).unwrap() {
                            assert_eq!(k.to_vec::<f32>().unwrap(), fk.to_vec::<f32>().unwrap());
                            assert_eq!(v.to_vec::<f32>().unwrap(), fv.to_vec::<f32>().unwrap());
                        }
                    }
                    None => assert!(held.is_empty()),
                }
            }
            LayerCache::Recurrent(c) => {
                let oracle = recurrent_oracle(&self.history);
                assert_same_recurrent(
                    c.conv_state(),
                    c.recurrent_state(),
                    &oracle,
                    "recurrent cache",
                );
            }
        }
        for held in &self.held {
            if let LayerSnapshot::Kv(s) = &held.snapshot {
                let (k, v) = s.arrays().unwrap();
                assert_holds(&k, &v, &held.ids, &format!("snapshot {s:?}"));
            }
        }
    }
}

/// The ids a rotating cache of `config` holds after `history`: the kept prefix, then the ring's
/// positions from `ring_from` on (the last `window + rewind_slack`, fewer after rewinds).
pub fn held_ids(config: RotatingConfig, history: &[u32], ring_from: usize) -> Vec<u32> {
    let keep = config.keep.min(history.len());
    let ring = config.window + config.rewind_slack;
    let start = keep
        .max(history.len().saturating_sub(ring))
        .max(ring_from)
        .min(history.len());
    [&history[..keep], &history[start..]].concat()
}

/// A rotating cache can rewind from `offset` to `to` when every position the window at `to`
/// needs is still valid: the tokens above `to` overwrote the slots of positions below
/// `offset - ring`, and earlier rewinds left those below `valid_from` stale.
pub fn rotating_can_rewind(
    config: RotatingConfig,
    offset: usize,
    to: usize,
    valid_from: usize,
) -> bool {
    let ring = config.window + config.rewind_slack;
    let valid = valid_from.max(offset.saturating_sub(ring));
    let needed = to.saturating_sub(config.window).max(config.keep);
    to <= offset && (to <= config.keep || valid <= needed)
}

pub fn run(cache: LayerCache, ops: &[Op]) {
    let mut harness = Harness::new(cache);
    for op in ops {
        harness.apply(op);
        harness.check();
    }
}

fn rotating_config() -> impl Strategy<Value = RotatingConfig> {
    (1usize..=5, 0usize..=2, 0usize..=2).prop_map(|(window, keep, rewind_slack)| RotatingConfig {
        window,
        keep,
        rewind_slack,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn kv_cache_matches_recompute(ops in prop::collection::vec(op(300), 1..24)) {
        run(LayerCache::Kv(KvCache::new()), &ops);
    }

    #[test]
    fn rotating_cache_matches_recompute(
        config in rotating_config(),
        ops in prop::collection::vec(op(8), 1..24),
    ) {
        run(LayerCache::Rotating(RotatingKvCache::new(config).unwrap()), &ops);
    }

    #[test]
    fn recurrent_cache_matches_recompute(ops in prop::collection::vec(op(6), 1..20)) {
        run(LayerCache::Recurrent(RecurrentCache::new(RECURRENT).unwrap()), &ops);
    }
}
