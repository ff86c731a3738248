//! Lossless acceptance of a draft: speculative sampling.
//!
//! Leviathan, Kalman and Matias, "Fast Inference from Transformers via Speculative Decoding"
//! (2023, <https://arxiv.org/abs/2211.17192>), and Chen et al., "Accelerating Large Language
//! Model Decoding with Speculative Sampling" (2023, <https://arxiv.org/abs/2302.01318>): accept
//! draft token `x` drawn from `q` with probability `min(1, p(x)/q(x))`, and at the first
//! rejection draw from `normalize(max(p - q, 0))`. Each committed token is then distributed
//! exactly as `p`, the target's own sampling distribution, whatever the drafter does; a better
//! drafter only makes more of them accepted.
//!
//! Rows are read on the host in f64: each is normalised by its own sum, so a device row that
//! sums to `1 ± 1e-6` after its filters biases nothing.

use rand::Rng;

use crate::error::Row;
use crate::{Draft, DraftProbs, Error, Result};

/// The outcome of verifying one draft.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Drafts accepted, in order from the first.
    pub accepted: usize,
    /// The token after them: drawn from the residual at the first rejection, or the bonus token
    /// from the last row when all were accepted.
    pub next: u32,
}

impl Verdict {
    /// Tokens this round commits: the accepted drafts and [`next`](Verdict::next).
    pub fn committed(&self) -> usize {
        self.accepted + 1
    }
}

/// Accepts a prefix of `draft` and draws the token after it, so that the committed tokens are
/// distributed exactly as the target's.
///
/// `target[i]` is the target's sampling distribution (after every sampler filter) of the token
/// after draft `i` (row 0: after the last committed token); `target.len() == draft.len() + 1`.
/// Draft `i + 1` (0-based `draft.tokens[i]`) is accepted with probability `min(1, p/q)` where
/// `p = target[i][token]` and `q` is its draft probability (1 for
/// [`DraftProbs::OneHot`]); at the first rejection the next token is drawn from
/// `normalize(max(target[i] - q_row, 0))` (for `OneHot`, `q_row` is one-hot at the rejected
/// token); when all are accepted it is drawn from `target[len]`. Rows need not sum to exactly 1:
/// each is normalised by its sum.
///
/// When rounding leaves the residual without mass, the next token is drawn from `target[i]`
/// without the rejected token (the residual's limit as `q_row` approaches `p`'s shape).
///
/// Fails, before drawing anything, when the row counts or widths disagree, a token is outside
/// the vocabulary, a probability is NaN, infinite or negative, a row has no mass, or a dense
/// draft gives its own token probability 0; and with [`Error::NoResidual`] when a rejection
/// leaves nothing to draw from.
pub fn verify<R: Rng + ?Sized>(draft: &Draft, target: &[&[f32]], rng: &mut R) -> Result<Verdict> {
    let k = draft.len();
    let vocab = vocab_of(&draft.tokens, target)?;
    let target_mass = target
        .iter()
        .enumerate()
        .map(|(i, row)| mass(Row::Target(i), row, vocab))
        .collect::<Result<Vec<f64>>>()?;
    let dense: Option<(&[Vec<f32>], Vec<f64>)> = match &draft.probs {
        DraftProbs::OneHot => None,
        DraftProbs::Dense(rows) => {
            if rows.len() != k {
                return Err(Error::DraftRowCount {
                    rows: rows.len(),
                    drafts: k,
                });
            }
            let masses = rows
                .iter()
                .enumerate()
                .map(|(i, row)| mass(Row::Draft(i), row, vocab))
                .collect::<Result<Vec<f64>>>()?;
            Some((rows, masses))
        }
    };
    for (position, &token) in draft.tokens.iter().enumerate() {
        if let Some((rows, _)) = &dense
            && rows[position][token as usize] == 0.0
        {
            return Err(Error::ImpossibleDraft { position, token });
        }
    }

    for (i, &token) in draft.tokens.iter().enumerate() {
        let t = token as usize;
        let p = f64::from(target[i][t]) / target_mass[i];
        let q = match &dense {
            None => 1.0,
            Some((rows, masses)) => f64::from(rows[i][t]) / masses[i],
        };
        // Draw only when the outcome is uncertain: p >= q always accepts, p == 0 never does.
        let accept = p >= q || (p > 0.0 && rng.random::<f64>() < p / q);
        if accept {
            continue;
        }
        let q_row = dense
            .as_ref()
            .map(|(rows, masses)| (&rows[i][..], masses[i]));
        let next = resample(target[i], target_mass[i], q_row, token, rng)
            .ok_or(Error::NoResidual { row: i, token })?;
        return Ok(Verdict { accepted: i, next });
    }
    let next = draw(vocab, |j| f64::from(target[k][j]), rng).ok_or(Error::ZeroMass {
        row: Row::Target(k),
    })?;
    Ok(Verdict { accepted: k, next })
}

/// [`verify`] for a deterministic drafter, with one random number per output position:
/// `uniform(i)` (in `[0, 1)`) draws the target's token at row `i` by inverting its cumulative
/// distribution, and drafts are accepted while they equal those draws.
///
/// This is the one-hot case of speculative sampling, coupled differently: draft `d` is
/// accepted with probability `p(d)`, as `min(1, p/1)` asks, and at a mismatch the token is a
/// draw from `p` conditioned on not being `d`, which is the residual `max(p - onehot(d), 0)`
/// normalised. What it adds is reproducibility: when `uniform` depends only on the absolute
/// output position (and the request's seed), the text a seeded request produces does not
/// depend on how deep any round drafted, or whether it speculated at all.
///
/// Fails as [`verify`] does on malformed rows or out-of-vocabulary drafts.
pub fn verify_positional(
    drafts: &[u32],
    target: &[&[f32]],
    mut uniform: impl FnMut(usize) -> f64,
) -> Result<Verdict> {
    let k = drafts.len();
    let vocab = vocab_of(drafts, target)?;
    let draw_row = |i: usize, u: f64| -> Result<u32> {
        let total = mass(Row::Target(i), target[i], vocab)?;
        invert(target[i], total, u).ok_or(Error::ZeroMass {
            row: Row::Target(i),
        })
    };
    for (i, &draft) in drafts.iter().enumerate() {
        let next = draw_row(i, uniform(i))?;
        if next != draft {
            return Ok(Verdict { accepted: i, next });
        }
    }
    Ok(Verdict {
        accepted: k,
        next: draw_row(k, uniform(k))?,
    })
}

/// The greedy case without reading whole rows: `argmax[i]` is the target's argmax at row `i`.
///
/// Equals [`verify`] with one-hot target rows: drafts are accepted while they equal the
/// argmax, and `next` is the argmax at the first mismatch (or after the last draft).
///
/// Fails with [`Error::ArgmaxCount`] unless `argmax.len() == drafts.len() + 1`.
pub fn verify_greedy(drafts: &[u32], argmax: &[u32]) -> Result<Verdict> {
    if argmax.len() != drafts.len() + 1 {
        return Err(Error::ArgmaxCount {
            argmax: argmax.len(),
            drafts: drafts.len(),
        });
    }
    let accepted = drafts
        .iter()
        .zip(argmax)
        .take_while(|(d, a)| d == a)
        .count();
    Ok(Verdict {
        accepted,
        next: argmax[accepted],
    })
}

/// The vocabulary size of a round's `target` rows, after checking that there is one row per
/// draft plus one and that every draft is inside the vocabulary (row widths are checked with
/// their entries, by [`mass`]).
fn vocab_of(drafts: &[u32], target: &[&[f32]]) -> Result<usize> {
    if target.len() != drafts.len() + 1 {
        return Err(Error::RowCount {
            rows: target.len(),
            drafts: drafts.len(),
        });
    }
    let vocab = target[0].len();
    if vocab == 0 {
        return Err(Error::EmptyVocabulary);
    }
    if let Some((position, &token)) = drafts
        .iter()
        .enumerate()
        .find(|&(_, &t)| t as usize >= vocab)
    {
        return Err(Error::TokenOutOfVocab {
            position,
            token,
            vocab,
        });
    }
    Ok(vocab)
}

/// The f64 sum of a row after checking its width and entries.
fn mass(row: Row, values: &[f32], vocab: usize) -> Result<f64> {
    if values.len() != vocab {
        return Err(Error::RowWidth {
            row,
            width: values.len(),
            vocab,
        });
    }
    let mut sum = 0.0f64;
    for (index, &value) in values.iter().enumerate() {
        if !value.is_finite() || value < 0.0 {
            return Err(Error::InvalidProbability { row, index, value });
        }
        sum += f64::from(value);
    }
    if sum > 0.0 {
        Ok(sum)
    } else {
        Err(Error::ZeroMass { row })
    }
}

/// The draw after rejecting `rejected`: from `max(p - q, 0)`, with `p` and `q` normalised by
/// `p_mass` and `q_mass` (`q` one-hot at `rejected` when `q_row` is `None`); or, when rounding
/// left that without mass, from `p` without `rejected`. `None` when both are empty.
fn resample<R: Rng + ?Sized>(
    p: &[f32],
    p_mass: f64,
    q_row: Option<(&[f32], f64)>,
    rejected: u32,
    rng: &mut R,
) -> Option<u32> {
    let rejected = rejected as usize;
    let without_rejected = |j: usize| if j == rejected { 0.0 } else { f64::from(p[j]) };
    match q_row {
        // One-hot q: max(p - q, 0) is p without the rejected token (p <= 1 there).
        None => draw(p.len(), without_rejected, rng),
        Some((q, q_mass)) => {
            let residual =
                |j: usize| (f64::from(p[j]) / p_mass - f64::from(q[j]) / q_mass).max(0.0);
            draw(p.len(), residual, rng).or_else(|| draw(p.len(), without_rejected, rng))
        }
    }
}

/// The token where the cumulative weight of `row` (summing to `total`) first exceeds
/// `u * total`, in f64; `None` when the row has no weight.
fn invert(row: &[f32], total: f64, u: f64) -> Option<u32> {
    let target = u.clamp(0.0, 1.0) * total;
    let mut cumulative = 0.0;
    let mut last = None;
    for (j, &w) in row.iter().enumerate() {
        if w > 0.0 {
            cumulative += f64::from(w);
            last = Some(j);
            if cumulative > target {
                return u32::try_from(j).ok();
            }
        }
    }
    last.and_then(|j| u32::try_from(j).ok())
}

/// A draw from the unnormalised weights `weight(0..n)`, accumulated in f64; `None` when they
/// sum to zero. `weight` must be non-negative and return the same value on both passes.
fn draw<R: Rng + ?Sized>(n: usize, weight: impl Fn(usize) -> f64, rng: &mut R) -> Option<u32> {
    let total: f64 = (0..n).map(&weight).sum();
    if !(total > 0.0 && total.is_finite()) {
        return None;
    }
    let target = rng.random::<f64>() * total;
    let mut cumulative = 0.0;
    let mut last = None;
    for j in 0..n {
        let w = weight(j);
        if w > 0.0 {
            cumulative += w;
            last = Some(j);
            if cumulative > target {
                return u32::try_from(j).ok();
            }
        }
    }
    // `target` rounded up to `total`: the last token with weight is the one the draw landed
    // on.
    last.and_then(|j| u32::try_from(j).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn rng() -> StdRng {
        StdRng::seed_from_u64(1)
    }

    #[test]
    fn one_hot_draft_matching_a_one_hot_target_is_accepted() {
        let rows: [&[f32]; 3] = [&[0.0, 1.0, 0.0], &[0.0, 0.0, 1.0], &[1.0, 0.0, 0.0]];
        let v = verify(&Draft::one_hot(vec![1, 2]), &rows, &mut rng()).unwrap();
        assert_eq!(
            v,
            Verdict {
                accepted: 2,
                next: 0
            }
        );
        assert_eq!(v.committed(), 3);
        let v = verify(&Draft::one_hot(vec![1, 0]), &rows, &mut rng()).unwrap();
        assert_eq!(
            v,
            Verdict {
                accepted: 1,
                next: 2
            }
        );
    }

    #[test]
    fn identical_dense_rows_are_always_accepted() {
        let p = [0.1f32, 0.2, 0.3, 0.4];
        let rows: [&[f32]; 3] = [&p, &p, &p];
        let mut rng = rng();
        for tokens in [[0, 1], [3, 3], [2, 0]] {
            let draft = Draft::dense(tokens.to_vec(), vec![p.to_vec(), p.to_vec()]);
            assert_eq!(verify(&draft, &rows, &mut rng).unwrap().accepted, 2);
        }
    }

    #[test]
    fn unnormalised_rows_are_normalised() {
        // The same shapes scaled: p = q after normalisation, so always accepted.
        let p = [2.0f32, 6.0];
        let rows: [&[f32]; 2] = [&p, &[0.0, 5.0]];
        let draft = Draft::dense(vec![0], vec![vec![0.25, 0.75]]);
        assert_eq!(
            verify(&draft, &rows, &mut rng()).unwrap(),
            Verdict {
                accepted: 1,
                next: 1
            }
        );
    }

    #[test]
    fn a_rejected_token_is_never_the_next_one_drawn_from_a_one_hot_residual() {
        let p = [0.5f32, 0.5];
        let rows: [&[f32]; 2] = [&p, &p];
        let mut rng = rng();
        for _ in 0..200 {
            let v = verify(&Draft::one_hot(vec![0]), &rows, &mut rng).unwrap();
            if v.accepted == 0 {
                assert_eq!(v.next, 1);
            }
        }
    }

    #[test]
    fn a_residual_lost_to_rounding_falls_back_to_the_target_without_the_token() {
        // p <= q everywhere, as when rows that should be equal round apart: the residual is
        // empty, so the draw comes from p without the rejected token 0.
        let p = [0.2f32, 0.3, 0.0];
        let q = [0.4f32, 0.3, 0.3];
        let mut rng = rng();
        for _ in 0..50 {
            assert_eq!(resample(&p, 1.0, Some((&q, 1.0)), 0, &mut rng), Some(1));
        }
        // Nothing left at all: an error, not a made-up token.
        assert_eq!(
            resample(&[1.0, 0.0], 1.0, Some((&[1.0, 0.0], 1.0)), 0, &mut rng),
            None
        );
        assert_eq!(resample(&[1.0, 0.0], 1.0, None, 0, &mut rng), None);
    }

    #[test]
    fn draw_never_returns_a_zero_weight_token() {
        let mut rng = rng();
        let w = [0.0, 3.0, 0.0, 1.0, 0.0];
        for _ in 0..500 {
            let j = draw(w.len(), |j| w[j], &mut rng).unwrap() as usize;
            assert!(w[j] > 0.0);
        }
        assert_eq!(draw(3, |_| 0.0, &mut rng), None);
        assert_eq!(draw(0, |_| 1.0, &mut rng), None);
    }

    #[test]
    fn bad_input_is_refused_with_the_offending_value() {
        let ok = [0.5f32, 0.5];
        let one = Draft::one_hot(vec![1]);
        let err = |draft: &Draft, rows: &[&[f32]]| verify(draft, rows, &mut rng()).unwrap_err();

        assert!(matches!(
            err(&one, &[&ok]),
            Error::RowCount { rows: 1, drafts: 1 }
        ));
        assert!(matches!(
            err(&Draft::empty(), &[&[]]),
            Error::EmptyVocabulary
        ));
        assert!(matches!(
            err(&one, &[&ok, &[0.2, 0.3, 0.5]]),
            Error::RowWidth {
                row: Row::Target(1),
                width: 3,
                vocab: 2
            }
        ));
        assert!(matches!(
            err(&Draft::one_hot(vec![2]), &[&ok, &ok]),
            Error::TokenOutOfVocab {
                position: 0,
                token: 2,
                vocab: 2
            }
        ));
        assert!(matches!(
            err(&one, &[&ok, &[f32::NAN, 1.0]]),
            Error::InvalidProbability {
                row: Row::Target(1),
                index: 0,
                ..
            }
        ));
        assert!(matches!(
            err(&one, &[&[-0.1, 1.0], &ok]),
            Error::InvalidProbability {
                row: Row::Target(0),
                index: 0,
                ..
            }
        ));
        assert!(matches!(
            err(&one, &[&ok, &[0.0, 0.0]]),
            Error::ZeroMass {
                row: Row::Target(1)
            }
        ));
        let dense = |rows: Vec<Vec<f32>>| Draft::dense(vec![1], rows);
        assert!(matches!(
            err(&dense(vec![]), &[&ok, &ok]),
            Error::DraftRowCount { rows: 0, drafts: 1 }
        ));
        assert!(matches!(
            err(&dense(vec![vec![1.0]]), &[&ok, &ok]),
            Error::RowWidth {
                row: Row::Draft(0),
                width: 1,
                vocab: 2
            }
        ));
        assert!(matches!(
            err(&dense(vec![vec![1.0, f32::INFINITY]]), &[&ok, &ok]),
            Error::InvalidProbability {
                row: Row::Draft(0),
                index: 1,
                ..
            }
        ));
        assert!(matches!(
            err(&dense(vec![vec![1.0, 0.0]]), &[&ok, &ok]),
            Error::ImpossibleDraft {
                position: 0,
                token: 1
            }
        ));
        // The message names the values.
        let message = err(&Draft::one_hot(vec![7]), &[&ok, &ok]).to_string();
        assert_eq!(message, "draft token 0 is 7, outside the vocabulary of 2");
        verify(&one, &[&ok, &ok], &mut rng()).unwrap();
    }

    #[test]
    fn a_token_the_target_rules_out_is_rejected_without_a_draw() {
        // p(token) = 0: rejected whatever the draw, and replaced from the rest of p.
        let rows: [&[f32]; 2] = [&[0.0, 1.0], &[1.0, 0.0]];
        let v = verify(&Draft::one_hot(vec![0]), &rows, &mut rng()).unwrap();
        assert_eq!(
            v,
            Verdict {
                accepted: 0,
                next: 1
            }
        );
    }

    #[test]
    fn greedy_counts_the_matching_prefix() {
        assert_eq!(
            verify_greedy(&[], &[4]).unwrap(),
            Verdict {
                accepted: 0,
                next: 4
            }
        );
        assert_eq!(
            verify_greedy(&[1, 2, 3], &[1, 2, 3, 9]).unwrap().accepted,
            3
        );
        assert_eq!(
            verify_greedy(&[1, 5, 3], &[1, 2, 3, 9]).unwrap(),
            Verdict {
                accepted: 1,
                next: 2
            }
        );
        assert!(matches!(
            verify_greedy(&[1], &[1]).unwrap_err(),
            Error::ArgmaxCount {
                argmax: 1,
                drafts: 1
            }
        ));
    }
}
