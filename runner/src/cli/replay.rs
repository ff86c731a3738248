//! `mlxkit bench --replay`: a depth controller's decision log fed back to it, to see what it
//! chose and whether it still chooses the same.

use anyhow::{Context, Result, bail};

/// `bench --replay`: re-feeds a depth controller's decision log to the state it started from,
/// and prints what it decided, how often, and whether the replay agrees.
pub(super) fn replay_decisions(path: &std::path::Path) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let log = speculate::DecisionLog::from_json(&text).with_context(|| {
        format!(
            "{} is not a depth controller's decision log",
            path.display()
        )
    })?;
    let mut by_depth = std::collections::BTreeMap::<usize, usize>::new();
    let (mut drafted, mut accepted, mut rounds) = (0, 0, 0);
    for event in log.events() {
        match *event {
            speculate::Event::Depth { depth, .. } => *by_depth.entry(depth).or_default() += 1,
            speculate::Event::Observe {
                depth, accepted: a, ..
            } => {
                rounds += 1;
                drafted += depth;
                accepted += a;
            }
        }
    }
    let replay = log.replay();
    println!(
        "{} events: {} decisions, {rounds} rounds, {accepted} of {drafted} drafts accepted",
        log.len(),
        replay.decisions
    );
    for (depth, count) in &by_depth {
        println!("  depth {depth:>2}: chosen {count} times");
    }
    let best: Vec<String> = [1, 2, 4, 8, 16]
        .iter()
        .map(|&batch| format!("batch {batch}: {}", replay.controller.best(batch)))
        .collect();
    println!("best depth now: {}", best.join(", "));
    println!(
        "expected tokens per round at each depth: {}",
        (0..=replay.controller.max_depth().min(8))
            .map(|d| format!("{d}: {:.2}", replay.controller.expected_tokens(d)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if replay.mismatches.is_empty() {
        println!("the replay reproduces every decision");
        Ok(())
    } else {
        bail!(
            "the replay differs at {} of {} decisions (first: event {:?})",
            replay.mismatches.len(),
            replay.decisions,
            replay.mismatches.first()
        )
    }
}
