//! Speculative sampling is lossless: whatever the drafter proposes, the committed tokens are
//! distributed exactly as the target's own samples.
//!
//! The target (and the drafter) are pure functions of the prefix, so the exact distribution
//! of the first committed token, `p(x0)`, and of the first two, `p(x0) · p(x1 | x0)`, are known.
//! Each test draws 40,000 seeded sequences through [`verify`], rounds repeated until two tokens
//! are committed, and runs Pearson's chi-square at the 0.9999 level against them. Correct
//! verification passes; two plausible bugs (accepting whatever the target allows, resampling
//! from the target instead of the residual) must fail the same test, which shows it has power.

mod common;

use common::{ChiSquare, argmax, chi_square, draw, exact, mix, row};
use proptest::prelude::*;
use rand::Rng;
use rand::SeedableRng;
use rand::rngs::StdRng;
use speculate::{Draft, DraftProbs, Result, Verdict, verify, verify_greedy, verify_positional};

const DRAWS: usize = 40_000;

/// How the drafter draws.
#[derive(Clone, Copy)]
enum Drafting {
    /// Sampled from `mix(target row, an unrelated row, closeness)`.
    Dense,
    /// The argmax of that mixture: a deterministic drafter.
    OneHot,
}

/// A synthetic target and drafter.
#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    vocab: usize,
    depth: usize,
    /// Fraction of tokens the target rules out (probability 0) in each row.
    zeros: f64,
    /// How close the draft distribution is to the target's (0: unrelated).
    closeness: f32,
    drafting: Drafting,
    seed: u64,
}

impl Case {
    fn target(&self, prefix: &[u32]) -> Vec<f32> {
        row(self.seed, prefix, self.vocab, self.zeros)
    }

    fn draft_row(&self, prefix: &[u32]) -> Vec<f32> {
        let unrelated = row(self.seed ^ 0xd1a7, prefix, self.vocab, self.zeros);
        mix(&self.target(prefix), &unrelated, self.closeness)
    }

    /// A draft of `depth` tokens after `context`.
    fn draft(&self, context: &[u32], rng: &mut StdRng) -> Draft {
        let mut prefix = context.to_vec();
        let mut rows = Vec::new();
        for _ in 0..self.depth {
            let q = self.draft_row(&prefix);
            let token = match self.drafting {
                Drafting::Dense => draw(&q, rng),
                Drafting::OneHot => argmax(&q),
            };
            prefix.push(token);
            rows.push(q);
        }
        let tokens = prefix[context.len()..].to_vec();
        match self.drafting {
            Drafting::Dense => Draft::dense(tokens, rows),
            Drafting::OneHot => Draft::one_hot(tokens),
        }
    }

    /// The exact distributions of the first committed token and of the first two.
    fn exact(&self) -> (Vec<f64>, Vec<f64>) {
        let first = exact(&self.target(&[]));
        let mut pairs = Vec::with_capacity(self.vocab * self.vocab);
        for (x0, &p0) in first.iter().enumerate() {
            let second = exact(&self.target(&[x0 as u32]));
            pairs.extend(second.iter().map(|p1| p0 * p1));
        }
        (first, pairs)
    }
}

type Verifier = fn(&Draft, &[&[f32]], &mut StdRng) -> Result<Verdict>;

struct Outcome {
    first: ChiSquare,
    pairs: ChiSquare,
    acceptance: f64,
}

/// Draws `DRAWS` sequences of at least two committed tokens through `verifier`.
fn run(case: &Case, verifier: Verifier) -> Outcome {
    let v = case.vocab;
    let mut rng = StdRng::seed_from_u64(case.seed);
    let (mut first, mut pairs) = (vec![0usize; v], vec![0usize; v * v]);
    let (mut drafted, mut accepted) = (0usize, 0usize);
    for _ in 0..DRAWS {
        let mut committed: Vec<u32> = Vec::new();
        while committed.len() < 2 {
            let draft = case.draft(&committed, &mut rng);
            let target: Vec<Vec<f32>> = (0..=draft.len())
                .map(|i| case.target(&[&committed[..], &draft.tokens[..i]].concat()))
                .collect();
            let rows: Vec<&[f32]> = target.iter().map(Vec::as_slice).collect();
            let verdict = verifier(&draft, &rows, &mut rng).unwrap();
            drafted += draft.len();
            accepted += verdict.accepted;
            committed.extend_from_slice(&draft.tokens[..verdict.accepted]);
            committed.push(verdict.next);
        }
        let (x0, x1) = (committed[0] as usize, committed[1] as usize);
        first[x0] += 1;
        pairs[x0 * v + x1] += 1;
    }
    let (p_first, p_pairs) = case.exact();
    Outcome {
        first: chi_square(&first, &p_first),
        pairs: chi_square(&pairs, &p_pairs),
        acceptance: accepted as f64 / drafted.max(1) as f64,
    }
}

fn correct(draft: &Draft, rows: &[&[f32]], rng: &mut StdRng) -> Result<Verdict> {
    verify(draft, rows, rng)
}

/// One uniform per row from the round's generator: as the engine's per-position streams, they
/// are independent of each other and of the draft.
fn positional(draft: &Draft, rows: &[&[f32]], rng: &mut StdRng) -> Result<Verdict> {
    let uniforms: Vec<f64> = (0..rows.len()).map(|_| rng.random::<f64>()).collect();
    verify_positional(&draft.tokens, rows, |i| uniforms[i])
}

fn report(case: &Case, label: &str, o: &Outcome) {
    println!(
        "{} [{label}]: first token {}; first two {}; acceptance {:.3}",
        case.name, o.first, o.pairs, o.acceptance
    );
}

fn assert_lossless(case: Case) {
    assert_lossless_with(case, correct, "verify");
}

fn assert_lossless_with(case: Case, verifier: Verifier, label: &str) {
    let o = run(&case, verifier);
    report(&case, label, &o);
    assert!(o.first.passes(), "{}: first token {}", case.name, o.first);
    assert!(
        o.pairs.passes(),
        "{}: first two tokens {}",
        case.name,
        o.pairs
    );
    // The case exercises both branches: some drafts accepted, some rejected.
    assert!(
        o.acceptance > 0.01 && o.acceptance < 0.99,
        "acceptance {}",
        o.acceptance
    );
}

const DENSE: [Case; 3] = [
    Case {
        name: "dense, unrelated draft",
        vocab: 8,
        depth: 3,
        zeros: 0.25,
        closeness: 0.0,
        drafting: Drafting::Dense,
        seed: 1,
    },
    Case {
        name: "dense, close draft",
        vocab: 12,
        depth: 4,
        zeros: 0.1,
        closeness: 0.8,
        drafting: Drafting::Dense,
        seed: 2,
    },
    Case {
        name: "dense, one token deep",
        vocab: 10,
        depth: 1,
        zeros: 0.0,
        closeness: 0.5,
        drafting: Drafting::Dense,
        seed: 3,
    },
];

const ONE_HOT: [Case; 2] = [
    Case {
        name: "one-hot, argmax of a close draft",
        vocab: 8,
        depth: 3,
        zeros: 0.2,
        closeness: 0.7,
        drafting: Drafting::OneHot,
        seed: 4,
    },
    Case {
        name: "one-hot, unrelated draft",
        vocab: 11,
        depth: 2,
        zeros: 0.3,
        closeness: 0.0,
        drafting: Drafting::OneHot,
        seed: 5,
    },
];

#[test]
fn dense_drafts_commit_the_target_distribution() {
    DENSE.into_iter().for_each(assert_lossless);
}

#[test]
fn one_hot_drafts_commit_the_target_distribution() {
    ONE_HOT.into_iter().for_each(assert_lossless);
}

#[test]
fn positional_draws_commit_the_target_distribution() {
    for case in ONE_HOT {
        assert_lossless_with(case, positional, "verify_positional");
    }
}

/// A wrong verifier: accepts a one-hot draft whenever the target allows it (`p > 0`), which
/// overweights whatever the drafter likes.
fn accept_if_possible(draft: &Draft, rows: &[&[f32]], rng: &mut StdRng) -> Result<Verdict> {
    for (i, &token) in draft.tokens.iter().enumerate() {
        if rows[i][token as usize] == 0.0 {
            return Ok(Verdict {
                accepted: i,
                next: draw(rows[i], rng),
            });
        }
    }
    let k = draft.len();
    Ok(Verdict {
        accepted: k,
        next: draw(rows[k], rng),
    })
}

/// A wrong verifier: correct acceptance, but after a rejection it draws from the target row
/// instead of the residual `max(p - q, 0)`, which double-counts what the draft already took.
fn resample_from_target(draft: &Draft, rows: &[&[f32]], rng: &mut StdRng) -> Result<Verdict> {
    let DraftProbs::Dense(q) = &draft.probs else {
        unreachable!("dense drafts only")
    };
    for (i, &token) in draft.tokens.iter().enumerate() {
        let t = token as usize;
        let (p, qt) = (exact(rows[i])[t], exact(&q[i])[t]);
        if p < qt && rand::Rng::random::<f64>(rng) >= p / qt {
            return Ok(Verdict {
                accepted: i,
                next: draw(rows[i], rng),
            });
        }
    }
    let k = draft.len();
    Ok(Verdict {
        accepted: k,
        next: draw(rows[k], rng),
    })
}

/// `verifier` must fail both chi-square tests on `case`.
fn assert_detected(case: Case, verifier: Verifier, label: &str) {
    let o = run(&case, verifier);
    report(&case, label, &o);
    assert!(
        o.first.statistic > o.first.quantile,
        "first token {}",
        o.first
    );
    assert!(
        o.pairs.statistic > o.pairs.quantile,
        "first two {}",
        o.pairs
    );
}

#[test]
fn the_test_detects_a_verifier_that_accepts_whatever_the_target_allows() {
    assert_detected(ONE_HOT[0], accept_if_possible, "accept if p > 0");
}

#[test]
fn the_test_detects_a_verifier_that_resamples_from_the_target() {
    assert_detected(DENSE[0], resample_from_target, "resample from p");
}

#[test]
fn the_chi_square_quantile_matches_published_values() {
    // 0.9999 quantiles of chi-square (NIST/SEMATECH tables, scipy.stats.chi2.ppf).
    for (df, want) in [
        (1, 15.137),
        (2, 18.421),
        (5, 25.745),
        (10, 35.564),
        (100, 161.319),
    ] {
        let got = common::quantile_9999(df);
        assert!((got - want).abs() < 2e-3, "df {df}: {got} vs {want}");
    }
    // Counts exactly at expectation score 0; a token of probability 0 scores infinity.
    assert_eq!(chi_square(&[50, 50], &[0.5, 0.5]).statistic, 0.0);
    assert!(
        chi_square(&[50, 49, 1], &[0.5, 0.5, 0.0])
            .statistic
            .is_infinite()
    );
}

fn one_hot_rows(argmax: &[u32], vocab: usize) -> Vec<Vec<f32>> {
    argmax
        .iter()
        .map(|&a| {
            (0..vocab)
                .map(|j| if j == a as usize { 1.0 } else { 0.0 })
                .collect()
        })
        .collect()
}

proptest! {
    /// `verify_greedy` is `verify` on one-hot target rows, for one-hot and dense drafts.
    #[test]
    fn greedy_agrees_with_verify_on_one_hot_rows(
        (vocab, drafts, argmax, weights) in (1usize..12, 0usize..6).prop_flat_map(|(v, k)| (
            Just(v),
            proptest::collection::vec(0..v as u32, k),
            proptest::collection::vec(0..v as u32, k + 1),
            proptest::collection::vec(proptest::collection::vec(0.01f32..1.0, v), k),
        )),
        seed in any::<u64>(),
    ) {
        let rows = one_hot_rows(&argmax, vocab);
        let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        let greedy = verify_greedy(&drafts, &argmax).unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        let one_hot = verify(&Draft::one_hot(drafts.clone()), &rows, &mut rng).unwrap();
        prop_assert_eq!(one_hot, greedy);
        let dense = verify(&Draft::dense(drafts, weights), &rows, &mut rng).unwrap();
        prop_assert_eq!(dense, greedy);
    }
}

proptest! {
    /// With one uniform per absolute output position, the committed text is the same whatever
    /// the drafts and depths: what a seeded request produces does not depend on speculation.
    #[test]
    fn positional_draws_do_not_depend_on_the_drafts(
        seed in 0u64..1000,
        depths in proptest::collection::vec(0usize..5, 1..12),
        noise in proptest::collection::vec(0u32..8, 64),
    ) {
        let case = ONE_HOT[0];
        let uniform_at = |position: usize| {
            StdRng::seed_from_u64(seed ^ (position as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .random::<f64>()
        };
        let generate = |depths: &[usize]| {
            let mut committed: Vec<u32> = Vec::new();
            let mut round = 0;
            while committed.len() < 12 {
                let depth = depths[round % depths.len()];
                // Drafts: the target's argmax on even rounds, noise on odd ones.
                let mut drafts = Vec::new();
                for i in 0..depth {
                    let prefix = [&committed[..], &drafts[..]].concat();
                    drafts.push(if round % 2 == 0 {
                        argmax(&case.target(&prefix))
                    } else {
                        noise[(round * 5 + i) % noise.len()]
                    });
                }
                let rows: Vec<Vec<f32>> = (0..=depth)
                    .map(|i| case.target(&[&committed[..], &drafts[..i]].concat()))
                    .collect();
                let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
                let start = committed.len();
                let verdict = verify_positional(&drafts, &rows, |i| uniform_at(start + i)).unwrap();
                committed.extend_from_slice(&drafts[..verdict.accepted]);
                committed.push(verdict.next);
                round += 1;
            }
            committed.truncate(12);
            committed
        };
        prop_assert_eq!(generate(&depths), generate(&[0]));
    }
}
