//! Splitting a long clip into evenly sized chunks for encoders with a maximum input length,
//! each cut moved to the quietest point near its even share so words are not cut in half.

use std::ops::Range;

use crate::audio::AudioClip;
use crate::error::{Error, Result};

/// How far a cut may move and how quietness is measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SplitConfig {
    /// A cut may land this many seconds either side of its even share (less where the length
    /// limit forbids it).
    pub search_seconds: f64,
    /// Quietness at a point is the energy of a window this long centred on it.
    pub window_seconds: f64,
}

impl Default for SplitConfig {
    /// Three seconds either way; a 25 ms window, about one speech frame.
    fn default() -> Self {
        SplitConfig {
            search_seconds: 3.0,
            window_seconds: 0.025,
        }
    }
}

/// Splits `clip` into the fewest chunks of at most `max_seconds`, cut at quiet points.
///
/// See [`split_ranges`]; this copies the samples of each range into its own clip.
pub fn split(clip: &AudioClip, max_seconds: f64) -> Result<Vec<AudioClip>> {
    let ranges = split_ranges(clip, max_seconds, &SplitConfig::default())?;
    Ok(ranges
        .into_iter()
        .map(|r| AudioClip {
            samples: clip.samples[r].to_vec(),
            sample_rate: clip.sample_rate,
        })
        .collect())
}

/// The sample ranges [`split`] cuts: contiguous, covering the clip, each at most
/// `floor(max_seconds * rate)` samples, as many as `ceil(len / max)`.
///
/// Cut `k` of `n` lands at the quietest point within `config.search_seconds` of `k * len / n`,
/// restricted so that no chunk, including the ones still to come, exceeds the limit. Among
/// equally quiet points the one nearest the even share wins.
///
/// Fails with [`Error::InvalidSplit`] when `max_seconds` is not finite or is under one sample,
/// and [`Error::EmptyAudio`] on an empty clip.
pub fn split_ranges(
    clip: &AudioClip,
    max_seconds: f64,
    config: &SplitConfig,
) -> Result<Vec<Range<usize>>> {
    let rate = f64::from(clip.sample_rate);
    let max_len_f = max_seconds * rate;
    if !max_len_f.is_finite() || max_len_f < 1.0 {
        return Err(Error::InvalidSplit(max_seconds));
    }
    let len = clip.samples.len();
    if len == 0 {
        return Err(Error::EmptyAudio);
    }
    let max_len = (max_len_f.floor() as usize).min(len);
    let chunks = len.div_ceil(max_len);
    let search = seconds_to_samples(config.search_seconds, rate);
    let half_window = seconds_to_samples(config.window_seconds, rate) / 2;

    let mut ranges = Vec::with_capacity(chunks);
    let mut start = 0usize;
    for k in 1..chunks {
        let ideal = (len as u128 * k as u128 / chunks as u128) as usize;
        // Whatever follows this cut must still fit in the chunks that remain.
        let tail_floor = len.saturating_sub((chunks - k) * max_len);
        let lo = ideal.saturating_sub(search).max(tail_floor).max(start + 1);
        let hi = ideal
            .saturating_add(search)
            .min(start + max_len)
            .min(len - 1);
        let cut = quietest(&clip.samples, lo, hi.max(lo), ideal, half_window);
        ranges.push(start..cut);
        start = cut;
    }
    ranges.push(start..len);
    Ok(ranges)
}

fn seconds_to_samples(seconds: f64, rate: f64) -> usize {
    let samples = seconds * rate;
    if samples.is_finite() && samples > 0.0 {
        samples as usize
    } else {
        0
    }
}

/// The point in `lo..=hi` whose surrounding window holds the least energy.
fn quietest(samples: &[f32], lo: usize, hi: usize, ideal: usize, half_window: usize) -> usize {
    let from = lo.saturating_sub(half_window);
    let to = (hi + half_window + 1).min(samples.len());
    // prefix[i] = energy of samples[from..from + i].
    let mut prefix = Vec::with_capacity(to - from + 1);
    let mut acc = 0.0f64;
    prefix.push(acc);
    for &s in &samples[from..to] {
        acc += f64::from(s) * f64::from(s);
        prefix.push(acc);
    }
    let mut best = (f64::INFINITY, usize::MAX, lo);
    for point in lo..=hi {
        let a = point.saturating_sub(half_window).max(from) - from;
        let b = (point + half_window + 1).min(to) - from;
        let energy = prefix[b] - prefix[a];
        let distance = point.abs_diff(ideal);
        // Tolerance relative to the running sum so float noise cannot decide the tie.
        let tol = acc * 1e-12;
        if energy < best.0 - tol || (energy <= best.0 + tol && distance < best.1) {
            best = (energy, distance, point);
        }
    }
    best.2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clip_within_the_limit_is_one_chunk() {
        let clip = AudioClip {
            samples: vec![0.1; 100],
            sample_rate: 10,
        };
        assert_eq!(
            split_ranges(&clip, 10.0, &SplitConfig::default()).unwrap(),
            vec![0..100]
        );
        assert_eq!(split(&clip, 30.0).unwrap(), vec![clip.clone()]);
    }

    #[test]
    fn invalid_lengths_are_errors() {
        let clip = AudioClip {
            samples: vec![0.1; 100],
            sample_rate: 10,
        };
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 0.01] {
            assert!(
                matches!(split(&clip, bad), Err(Error::InvalidSplit(_))),
                "{bad}"
            );
        }
        let empty = AudioClip {
            samples: vec![],
            sample_rate: 10,
        };
        assert!(matches!(split(&empty, 1.0), Err(Error::EmptyAudio)));
    }
}
