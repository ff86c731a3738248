//! A prefix cache across three requests: a second turn of a conversation resumes where the
//! first ended, a different user with the same system prompt resumes after that prompt, and
//! eviction under a byte budget drops the least recently used branch.
//!
//! ```sh
//! cargo run --example resume_conversation   # from prefix-trie
//! ```
//!
//! The trie knows nothing about tensors. Its snapshots here are `Span`s that only remember the
//! positions they cover (a real engine stores KV arrays, see the `kvcache` crate) and count 1 kB
//! per position and layer, so that the byte budget means something.

use std::convert::Infallible;
use std::ops::Range;

use prefix_trie::{
    Config, Coverage, LayerKind, LayerRestore, Lookahead, PrefixTrie, Prompt, SchedulePolicy,
    Snapshot,
};

/// One layer's cached keys and values for a range of positions (1 kB per position).
#[derive(Debug)]
struct Span(Range<usize>);

const BYTES_PER_POSITION: usize = 1024;

impl Snapshot for Span {
    type Error = Infallible;
    fn coverage(&self) -> Coverage {
        Coverage::Range(self.0.clone())
    }
    fn bytes(&self) -> usize {
        self.0.len() * BYTES_PER_POSITION
    }
    fn split(self, at: usize) -> Result<(Self, Self), Infallible> {
        Ok((Span(self.0.start..at), Span(at..self.0.end)))
    }
    fn merge(self, later: Self) -> Result<Self, Infallible> {
        Ok(Span(self.0.start..later.0.end))
    }
}

/// When a request ends, its caches hold every position so far: hand out whatever range the
/// trie asks for.
fn page_out(_layer: usize, coverage: Coverage) -> Result<Span, Infallible> {
    match coverage {
        Coverage::Range(range) => Ok(Span(range)),
        Coverage::Point(_) => unreachable!("this model has full-attention layers only"),
    }
}

const SYSTEM: [u32; 6] = [1, 100, 101, 102, 103, 2];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config {
        layers: vec![LayerKind::Range; 2],
        lookahead: Lookahead::None,
        schedule: SchedulePolicy::default(),
    };
    let mut trie = PrefixTrie::<Span>::new(config)?;

    // Request 1: system prompt + a question; the model answers with four tokens.
    let turn1: Vec<u32> = [&SYSTEM[..], &[10, 11, 12]].concat();
    let answer = [20, 21, 22, 23];
    serve(&mut trie, "alice, turn 1", &turn1, &answer)?;

    // Request 2: the same conversation, one turn later. Everything request 1 evaluated is
    // cached, so only the answer's last token and the new question need a forward.
    let turn2: Vec<u32> = [&turn1[..], &answer, &[13, 14]].concat();
    serve(&mut trie, "alice, turn 2", &turn2, &[24, 25])?;

    // Request 3: another user, same system prompt: the shared prefix is reused.
    let other: Vec<u32> = [&SYSTEM[..], &[30, 31, 32, 33]].concat();
    serve(&mut trie, "bob, turn 1", &other, &[40])?;

    println!("\n{}", trie.dump());

    // A budget of 24 kB holds the system prompt and bob's branch (10 positions in 2 layers)
    // but not alice's as well: the least recently used branch goes.
    let report = trie.evict(24 * BYTES_PER_POSITION)?;
    println!(
        "evicted to {} bytes: {} removed, {} merged, {} bytes freed",
        report.bytes, report.removed, report.merged, report.freed
    );
    // Alice falls back to the shared system prompt. Bob's exact prompt resumes one short of
    // its end: the last prompt token is always evaluated again, for the logits it yields.
    let alice = trie.find(&Prompt::new(&turn2, &[], Lookahead::None)?)?;
    let bob = trie.find(&Prompt::new(&other, &[], Lookahead::None)?)?;
    println!(
        "after eviction: alice's turn 2 would resume at {}, bob's at {}",
        alice.restore_at, bob.restore_at
    );
    Ok(())
}

/// One request: match, restore, "prefill" the rest, "generate", record.
fn serve(
    trie: &mut PrefixTrie<Span>,
    name: &str,
    prompt: &[u32],
    generated: &[u32],
) -> Result<(), Box<dyn std::error::Error>> {
    let keyed = Prompt::new(prompt, &[], Lookahead::None)?;
    let begin = trie.begin(&keyed, &[])?;

    // The restore plan says, per layer, which snapshots rebuild the cache up to restore_at.
    let plan = trie.restore_plan(begin.session)?;
    let restored: Vec<String> = plan
        .iter()
        .map(|layer| match layer {
            LayerRestore::Range(spans) => {
                format!("{:?}", spans.iter().map(|s| &s.0).collect::<Vec<_>>())
            }
            LayerRestore::Empty => "empty".to_string(),
            other => format!("{other:?}"),
        })
        .collect();
    println!(
        "{name}: {} prompt tokens, {} matched, resume at {} (prefill {}), layer 0 from {}",
        prompt.len(),
        begin.matched,
        begin.restore_at,
        prompt.len() - begin.restore_at,
        restored[0]
    );

    // The engine would prefill and decode here. At the end its caches rest after the last
    // generated token was appended (the very last one is sampled but never fed back).
    let all: Vec<u32> = [prompt, generated].concat();
    let recorded = Prompt::new(&all, &[], Lookahead::None)?;
    let rest_at = all.len() - 1;
    trie.close(
        begin.session,
        recorded.keys(),
        rest_at,
        Vec::new(),
        page_out,
    )?;
    Ok(())
}
