//! Match, attach and evict on a 100k-token conversation stored as 1,000 nodes of 100 keys,
//! each with a hybrid model's four layers (two recurrent, two full-attention).
//!
//! Run with `cargo bench -p mlxkit-prefix-trie`.

use std::convert::Infallible;
use std::ops::Range;

use divan::Bencher;
use prefix_trie::{
    Capture, Config, Coverage, LayerKind, Lookahead, PrefixTrie, Prompt, SchedulePolicy, Snapshot,
};

const TURNS: u32 = 1_000;
const TURN_TOKENS: u32 = 100;
/// Full-attention bytes per position and recurrent state bytes, loosely a small model's.
const KV_BYTES_PER_KEY: usize = 4_096;
const RECURRENT_BYTES: usize = 1 << 20;

/// A snapshot that only knows its coverage, so the benchmark times the trie alone.
#[derive(Clone, Debug)]
enum Sized {
    Range(Range<usize>),
    Point(usize),
}

impl Snapshot for Sized {
    type Error = Infallible;
    fn coverage(&self) -> Coverage {
        match self {
            Sized::Range(range) => Coverage::Range(range.clone()),
            Sized::Point(at) => Coverage::Point(*at),
        }
    }
    fn bytes(&self) -> usize {
        match self {
            Sized::Range(range) => range.len() * KV_BYTES_PER_KEY,
            Sized::Point(_) => RECURRENT_BYTES,
        }
    }
    fn split(self, at: usize) -> Result<(Self, Self), Infallible> {
        match self {
            Sized::Range(range) => Ok((Sized::Range(range.start..at), Sized::Range(at..range.end))),
            point => Ok((Sized::Range(at..at), point)),
        }
    }
    fn merge(self, later: Self) -> Result<Self, Infallible> {
        match (self, later) {
            (Sized::Range(a), Sized::Range(b)) => Ok(Sized::Range(a.start..b.end)),
            (_, later) => Ok(later),
        }
    }
}

const LAYERS: [LayerKind; 4] = [
    LayerKind::Point,
    LayerKind::Range,
    LayerKind::Point,
    LayerKind::Range,
];

fn tokens(turns: u32) -> Vec<u32> {
    // Distinct ids so no edge matches another by accident.
    (0..turns * TURN_TOKENS).collect()
}

fn captures(base: usize, end: usize) -> Vec<Capture<Sized>> {
    LAYERS
        .iter()
        .enumerate()
        .map(|(layer, kind)| Capture {
            layer,
            snapshot: match kind {
                LayerKind::Range => Sized::Range(base..end),
                _ => Sized::Point(end),
            },
        })
        .collect()
}

fn page_out(_layer: usize, coverage: Coverage) -> Result<Sized, Infallible> {
    Ok(match coverage {
        Coverage::Range(range) => Sized::Range(range),
        Coverage::Point(at) => Sized::Point(at),
    })
}

/// One turn: resume at the frontier, capture at the prompt's end, close there.
fn serve_turn(trie: &mut PrefixTrie<Sized>, prompt: &Prompt) {
    let begin = trie.begin(prompt, &[]).expect("begin");
    let end = prompt.keys().len();
    trie.attach(begin.session, captures(begin.restore_at, end))
        .expect("attach");
    trie.close(begin.session, prompt.keys(), end, Vec::new(), page_out)
        .expect("close");
}

/// The 100k-token conversation: 1,000 turns, one checkpoint node each.
fn conversation() -> PrefixTrie<Sized> {
    let config = Config {
        layers: LAYERS.to_vec(),
        lookahead: Lookahead::None,
        schedule: SchedulePolicy {
            interval: 0,
            before_end: 0,
        },
    };
    let mut trie = PrefixTrie::new(config).expect("config");
    let all = tokens(TURNS + 1);
    for turn in 1..=TURNS {
        let prompt = Prompt::new(&all[..(turn * TURN_TOKENS) as usize], &[], Lookahead::None)
            .expect("prompt");
        serve_turn(&mut trie, &prompt);
    }
    assert_eq!(trie.node_count(), TURNS as usize + 1);
    trie
}

fn main() {
    divan::main();
}

/// Longest match and restore point for the next turn of the stored conversation.
#[divan::bench]
fn match_full_conversation(bencher: Bencher) {
    let trie = conversation();
    let next = Prompt::new(&tokens(TURNS + 1), &[], Lookahead::None).expect("prompt");
    bencher.bench(|| trie.find(divan::black_box(&next)).expect("find"));
}

/// Longest match for a prompt that diverges halfway, inside an edge.
#[divan::bench]
fn match_divergent_halfway(bencher: Bencher) {
    let trie = conversation();
    let mut edited = tokens(TURNS + 1);
    edited[50_050] = u32::MAX >> 2;
    let prompt = Prompt::new(&edited, &[], Lookahead::None).expect("prompt");
    bencher.bench(|| trie.find(divan::black_box(&prompt)).expect("find"));
}

/// Attaching a new turn's four captures to the live path (grows one node).
#[divan::bench(sample_count = 50, sample_size = 1)]
fn attach_next_turn(bencher: Bencher) {
    let stored = conversation();
    let next = Prompt::new(&tokens(TURNS + 1), &[], Lookahead::None).expect("prompt");
    let end = next.keys().len();
    bencher
        .with_inputs(|| {
            let mut trie = stored.clone();
            let begin = trie.begin(&next, &[]).expect("begin");
            (trie, begin.session, captures(begin.restore_at, end))
        })
        .bench_values(|(mut trie, session, captures)| {
            trie.attach(session, captures).expect("attach");
            trie
        });
}

/// Attaching captures that land inside stored edges (a resumed request splitting them).
#[divan::bench(sample_count = 50, sample_size = 1)]
fn attach_splitting_stored_edges(bencher: Bencher) {
    let stored = conversation();
    let mut edited = tokens(TURNS + 1);
    edited[50_050] = u32::MAX >> 2;
    let prompt = Prompt::new(&edited, &[], Lookahead::None).expect("prompt");
    bencher
        .with_inputs(|| {
            let mut trie = stored.clone();
            let begin = trie.begin(&prompt, &[]).expect("begin");
            (trie, begin.session, captures(begin.restore_at, 50_050))
        })
        .bench_values(|(mut trie, session, captures)| {
            trie.attach(session, captures).expect("attach");
            trie
        });
}

/// Evicting the single least recently used checkpoint.
#[divan::bench(sample_count = 50, sample_size = 1)]
fn evict_one_checkpoint(bencher: Bencher) {
    let stored = conversation();
    bencher
        .with_inputs(|| stored.clone())
        .bench_values(|mut trie| {
            let budget = trie.bytes() - 1;
            trie.evict(budget).expect("evict");
            trie
        });
}

/// Evicting down to half the bytes: merges away about 700 of the 1,000 checkpoints.
#[divan::bench(sample_count = 20, sample_size = 1)]
fn evict_to_half_budget(bencher: Bencher) {
    let stored = conversation();
    bencher
        .with_inputs(|| stored.clone())
        .bench_values(|mut trie| {
            let budget = trie.bytes() / 2;
            let report = trie.evict(budget).expect("evict");
            (trie, report)
        });
}
