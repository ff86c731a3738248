//! Helpers for the statistical tests: distributions that are pure functions of a prefix, draws,
//! and Pearson's chi-square.
#![allow(dead_code)]

use rand::Rng;

/// splitmix64 over a seed and a token prefix: the same prefix always gives the same row.
pub fn hash(seed: u64, prefix: &[u32]) -> u64 {
    let mut h = seed ^ 0x243F_6A88_85A3_08D3;
    for &t in prefix.iter().chain([&(prefix.len() as u32)]) {
        h = h
            .wrapping_add(u64::from(t))
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        h ^= h >> 31;
    }
    h
}

/// Deterministic numbers in [0, 1) from a hash (a 64-bit LCG).
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Lcg {
        Lcg(seed)
    }

    pub fn unit(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A probability row over `vocab` tokens that depends only on `(seed, prefix)`: softmax of
/// logits in [-2.5, 2.5), with each token zeroed with probability `zeros` (two always kept).
pub fn row(seed: u64, prefix: &[u32], vocab: usize, zeros: f64) -> Vec<f32> {
    let mut lcg = Lcg::new(hash(seed, prefix));
    let mut w: Vec<f64> = (0..vocab)
        .map(|_| ((lcg.unit() * 5.0) - 2.5).exp())
        .collect();
    let kept = (lcg.unit() * vocab as f64) as usize % vocab;
    for (j, v) in w.iter_mut().enumerate() {
        let keep = j == kept || j == (kept + 1) % vocab;
        if !keep && lcg.unit() < zeros {
            *v = 0.0;
        }
    }
    let sum: f64 = w.iter().sum();
    w.iter().map(|v| (v / sum) as f32).collect()
}

/// `a * p + (1 - a) * q`, renormalised.
pub fn mix(p: &[f32], q: &[f32], a: f32) -> Vec<f32> {
    let m: Vec<f32> = p
        .iter()
        .zip(q)
        .map(|(x, y)| a * x + (1.0 - a) * y)
        .collect();
    let sum: f32 = m.iter().sum();
    m.iter().map(|v| v / sum).collect()
}

/// The exact distribution a row describes: its entries over their f64 sum (as `verify` reads
/// it).
pub fn exact(row: &[f32]) -> Vec<f64> {
    let sum: f64 = row.iter().map(|&v| f64::from(v)).sum();
    row.iter().map(|&v| f64::from(v) / sum).collect()
}

/// A draw from a row (f64 cumulative sums).
pub fn draw<R: Rng + ?Sized>(row: &[f32], rng: &mut R) -> u32 {
    let p = exact(row);
    let u = rng.random::<f64>();
    let mut cumulative = 0.0;
    for (j, &pj) in p.iter().enumerate() {
        cumulative += pj;
        if pj > 0.0 && u < cumulative {
            return j as u32;
        }
    }
    p.iter().rposition(|&pj| pj > 0.0).unwrap() as u32
}

/// The index of the largest entry (the first on ties).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (j, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = j;
        }
    }
    best as u32
}

/// The outcome of Pearson's chi-square test.
#[derive(Debug, Clone, Copy)]
pub struct ChiSquare {
    /// The statistic; infinite when a token of probability 0 was observed.
    pub statistic: f64,
    /// Degrees of freedom after pooling.
    pub df: usize,
    /// The 0.9999 quantile of chi-square with `df` degrees of freedom.
    pub quantile: f64,
}

impl ChiSquare {
    /// Whether the counts are consistent with the probabilities at the 0.9999 level.
    pub fn passes(&self) -> bool {
        self.statistic <= self.quantile
    }
}

impl std::fmt::Display for ChiSquare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "chi2 {:.1} (df {}, 0.9999 quantile {:.1})",
            self.statistic, self.df, self.quantile
        )
    }
}

/// Pearson's chi-square of `counts` against the exact `probs`. Bins with an expected count
/// under 5 are pooled into one (and that one into the smallest regular bin if it is still under
/// 5), so the chi-square approximation holds.
pub fn chi_square(counts: &[usize], probs: &[f64]) -> ChiSquare {
    assert_eq!(counts.len(), probs.len());
    let total: usize = counts.iter().sum();
    let mut bins: Vec<(f64, f64)> = Vec::new();
    let mut pooled = (0.0, 0.0);
    let mut impossible = false;
    for (&c, &p) in counts.iter().zip(probs) {
        let e = p * total as f64;
        if p == 0.0 {
            impossible |= c > 0;
            continue;
        }
        if e < 5.0 {
            pooled.0 += c as f64;
            pooled.1 += e;
        } else {
            bins.push((c as f64, e));
        }
    }
    if pooled.1 > 0.0 {
        if pooled.1 < 5.0 && !bins.is_empty() {
            let smallest = (0..bins.len()).min_by(|&a, &b| bins[a].1.total_cmp(&bins[b].1));
            let smallest = smallest.unwrap();
            bins[smallest].0 += pooled.0;
            bins[smallest].1 += pooled.1;
        } else {
            bins.push(pooled);
        }
    }
    let statistic = if impossible {
        f64::INFINITY
    } else {
        bins.iter().map(|(c, e)| (c - e).powi(2) / e).sum()
    };
    let df = bins.len().max(2) - 1;
    ChiSquare {
        statistic,
        df,
        quantile: quantile_9999(df),
    }
}

/// The 0.9999 quantile of chi-square with `df` degrees of freedom.
pub fn quantile_9999(df: usize) -> f64 {
    quantile(df, 0.9999)
}

/// The `p` quantile of chi-square with `df` degrees of freedom: bisection on its CDF.
pub fn quantile(df: usize, p: f64) -> f64 {
    let (mut lo, mut hi) = (0.0, 100.0 + 10.0 * df as f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if cdf(mid, df) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The chi-square CDF, `P(df/2, x/2)`: the regularised lower incomplete gamma function by its
/// power series, which converges for every `x` (slowly only far beyond the quantiles used
/// here).
pub fn cdf(x: f64, df: usize) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    let a = df as f64 / 2.0;
    let y = x / 2.0;
    let (mut term, mut sum, mut n) = (1.0 / a, 1.0 / a, 1.0);
    while term > 1e-17 * sum {
        term *= y / (a + n);
        sum += term;
        n += 1.0;
    }
    (-y + a * y.ln() - ln_gamma_half(df) + sum.ln())
        .exp()
        .min(1.0)
}

/// `ln Γ(k / 2)`, exact for the half-integers a chi-square needs: `Γ(n) = (n - 1)!` and
/// `Γ(n + 1/2) = √π · Π_{i<n} (i + 1/2)`.
fn ln_gamma_half(k: usize) -> f64 {
    if k.is_multiple_of(2) {
        (1..k / 2).map(|i| (i as f64).ln()).sum()
    } else {
        0.5 * std::f64::consts::PI.ln() + (0..k / 2).map(|i| (i as f64 + 0.5).ln()).sum::<f64>()
    }
}
