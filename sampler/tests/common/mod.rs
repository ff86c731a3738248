//! Host references in f64: the exact distribution the documented filter order defines.
#![allow(dead_code)]

use mlx::Array;
use sampler::Options;

/// Deterministic pseudo-random numbers (a 64-bit LCG: no dependency, stable forever).
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Lcg {
        Lcg(seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407))
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + ((self.unit() * (hi - lo) as f64) as usize).min(hi - lo - 1)
    }

    /// `n` logits spread over about `[-spread, spread)`.
    pub fn logits(&mut self, n: usize, spread: f64) -> Vec<f32> {
        (0..n)
            .map(|_| ((self.unit() * 2.0 - 1.0) * spread) as f32)
            .collect()
    }
}

/// A `[rows, vocab]` f32 array from rows of logits.
pub fn logits_array(rows: &[Vec<f32>]) -> Array {
    let vocab = rows[0].len();
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    Array::from_slice(&flat, &[rows.len() as i32, vocab as i32]).unwrap()
}

/// An llguidance-style bitmask from booleans.
pub fn bitmask(allowed: &[bool]) -> Vec<u32> {
    let mut words = vec![0u32; allowed.len().div_ceil(32)];
    for (t, &a) in allowed.iter().enumerate() {
        if a {
            words[t / 32] |= 1 << (t % 32);
        }
    }
    words
}

/// Logits after bias, mask and penalties, in f64 (the direct formulas).
pub fn adjusted(
    logits: &[f32],
    options: &Options,
    window: &[u32],
    allowed: Option<&[bool]>,
) -> Vec<f64> {
    let mut x: Vec<f64> = logits.iter().map(|&v| f64::from(v)).collect();
    for (&t, &b) in &options.logit_bias {
        x[t as usize] += f64::from(b);
    }
    if let Some(allowed) = allowed {
        for (v, &a) in x.iter_mut().zip(allowed) {
            if !a {
                *v = f64::NEG_INFINITY;
            }
        }
    }
    let penalizes = options.repeat_penalty != 1.0
        || options.presence_penalty != 0.0
        || options.frequency_penalty != 0.0;
    if penalizes {
        let window = &window[window.len().saturating_sub(options.repeat_last_n)..];
        let mut counts = vec![0usize; x.len()];
        for &t in window {
            counts[t as usize] += 1;
        }
        for (v, &c) in x.iter_mut().zip(&counts) {
            if c == 0 {
                continue;
            }
            let rp = f64::from(options.repeat_penalty);
            *v = if *v > 0.0 { *v / rp } else { *v * rp };
            *v -= f64::from(options.presence_penalty);
            *v -= f64::from(options.frequency_penalty) * c as f64;
        }
    }
    x
}

/// The exact distribution after temperature and the filters, each applied to the renormalised
/// output of the one before; and how close the case came to a filter's boundary (ties in
/// top-k, cumulative mass equal to top_p, ratios equal to min_p), where f32 and f64 may
/// legitimately disagree.
pub fn filtered(x: &[f64], options: &Options) -> (Vec<f64>, f64) {
    let n = x.len();
    if options.temperature == 0.0 {
        let best = (0..n).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap();
        let mut sorted = x.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let margin = if n > 1 { sorted[0] - sorted[1] } else { 1.0 };
        let mut p = vec![0.0; n];
        p[best] = 1.0;
        return (p, margin);
    }
    let t = f64::from(options.temperature);
    let mut margin = f64::INFINITY;
    let scaled: Vec<f64> = x.iter().map(|v| v / t).collect();
    let mut alive: Vec<bool> = scaled.iter().map(|v| v.is_finite()).collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| scaled[b].total_cmp(&scaled[a]));
    let probs = |alive: &[bool]| -> Vec<f64> {
        let max = (0..n)
            .filter(|&i| alive[i])
            .map(|i| scaled[i])
            .fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = (0..n)
            .map(|i| {
                if alive[i] {
                    (scaled[i] - max).exp()
                } else {
                    0.0
                }
            })
            .collect();
        let s: f64 = e.iter().sum();
        e.into_iter().map(|v| v / s).collect()
    };
    if options.top_k > 0 && options.top_k < n {
        let k = options.top_k;
        if scaled[order[k - 1]].is_finite() && scaled[order[k]].is_finite() {
            margin = margin.min(scaled[order[k - 1]] - scaled[order[k]]);
        }
        for &i in &order[k..] {
            alive[i] = false;
        }
    }
    if options.top_p < 1.0 {
        let p = probs(&alive);
        let mut before = 0.0;
        for (rank, &i) in order.iter().enumerate() {
            if !alive[i] {
                continue;
            }
            if rank > 0 {
                margin = margin.min((before - f64::from(options.top_p)).abs());
            }
            if rank > 0 && before >= f64::from(options.top_p) {
                alive[i] = false;
            }
            before += p[i];
        }
    }
    if options.min_p > 0.0 {
        let p = probs(&alive);
        let max = p.iter().cloned().fold(0.0, f64::max);
        for i in 0..n {
            if alive[i] {
                let ratio = p[i] / max;
                margin = margin.min((ratio - f64::from(options.min_p)).abs());
                if ratio < f64::from(options.min_p) {
                    alive[i] = false;
                }
            }
        }
    }
    (probs(&alive), margin)
}

/// `filtered(adjusted(..))`.
pub fn reference(
    logits: &[f32],
    options: &Options,
    window: &[u32],
    allowed: Option<&[bool]>,
) -> (Vec<f64>, f64) {
    filtered(&adjusted(logits, options, window, allowed), options)
}

/// Pearson's chi-square of `counts` against `probs`, bins with expected count under 5 pooled;
/// returns the statistic and the 0.9999 quantile for its degrees of freedom (Wilson–Hilferty).
/// With about 30 cases per test, that keeps the chance that some case of a correct sampler
/// fails near 0.3% for a given key, while wrong distributions score in the hundreds.
pub fn chi_square(counts: &[usize], probs: &[f64]) -> (f64, f64) {
    let total: usize = counts.iter().sum();
    let mut bins: Vec<(f64, f64)> = Vec::new();
    let mut pooled = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(probs) {
        let e = p * total as f64;
        if p == 0.0 {
            assert_eq!(c, 0, "a token of probability 0 was drawn");
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
        bins.push(pooled);
    }
    let stat: f64 = bins.iter().map(|(c, e)| (c - e).powi(2) / e).sum();
    let df = (bins.len().max(2) - 1) as f64;
    let z = 3.719; // the 0.9999 quantile of the standard normal
    let h = 2.0 / (9.0 * df);
    let quantile = df * (1.0 - h + z * h.sqrt()).powi(3);
    (stat, quantile)
}
