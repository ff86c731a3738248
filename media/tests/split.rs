//! Splitting: chunk lengths stay within the limit and cuts land in the pauses.

use media::{AudioClip, SplitConfig, split, split_ranges};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const RATE: u32 = 16_000;

/// Seeded noise standing in for speech, with the given (start, end) second ranges silenced.
fn noise_with_silences(seconds: f64, silences: &[(f64, f64)], seed: u64) -> AudioClip {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = (seconds * f64::from(RATE)) as usize;
    let mut samples: Vec<f32> = (0..n).map(|_| rng.random_range(-0.5f32..0.5)).collect();
    for &(a, b) in silences {
        let (a, b) = (
            (a * f64::from(RATE)) as usize,
            (b * f64::from(RATE)) as usize,
        );
        samples[a..b].fill(0.0);
    }
    AudioClip {
        samples,
        sample_rate: RATE,
    }
}

fn seconds(samples: usize) -> f64 {
    samples as f64 / f64::from(RATE)
}

#[test]
fn cuts_land_in_inserted_silences() {
    // Even shares of 25 s under a 10 s limit fall at 8.33 s and 16.67 s; the pauses sit
    // 0.7 s and 0.8 s away.
    let silences = [(8.9, 9.3), (17.3, 17.7)];
    let clip = noise_with_silences(25.0, &silences, 7);
    let ranges = split_ranges(&clip, 10.0, &SplitConfig::default()).unwrap();
    assert_eq!(ranges.len(), 3);
    for (range, &(a, b)) in ranges.iter().zip(&silences) {
        let cut = seconds(range.end);
        assert!(
            cut > a && cut < b,
            "cut at {cut:.3} s is outside the pause {a}..{b}"
        );
    }
    let chunks = split(&clip, 10.0).unwrap();
    assert!(chunks.iter().all(|c| c.duration_seconds() <= 10.0));
    assert_eq!(
        chunks.iter().map(|c| c.samples.len()).sum::<usize>(),
        clip.samples.len()
    );
}

#[test]
fn a_pause_that_would_overfill_a_chunk_is_not_used() {
    // The only pause is at 10.5 s: cutting there would make the first chunk 10.5 s long.
    let clip = noise_with_silences(19.0, &[(10.4, 10.8)], 11);
    let ranges = split_ranges(&clip, 10.0, &SplitConfig::default()).unwrap();
    assert_eq!(ranges.len(), 2);
    assert!(
        ranges.iter().all(|r| seconds(r.len()) <= 10.0),
        "{ranges:?}"
    );
}

#[test]
fn silence_everywhere_cuts_at_the_even_share() {
    let clip = AudioClip {
        samples: vec![0.0; 30 * RATE as usize],
        sample_rate: RATE,
    };
    let ranges = split_ranges(&clip, 10.0, &SplitConfig::default()).unwrap();
    let cuts: Vec<usize> = ranges.iter().map(|r| r.end).collect();
    assert_eq!(
        cuts,
        vec![10 * RATE as usize, 20 * RATE as usize, 30 * RATE as usize]
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn chunks_cover_the_clip_within_the_limit(
        len in 1usize..120_000,
        rate in 1_000u32..16_000,
        max_seconds in 0.05f64..20.0,
        search_seconds in 0.0f64..5.0,
        seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let samples = (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let clip = AudioClip { samples, sample_rate: rate };
        let config = SplitConfig { search_seconds, ..SplitConfig::default() };
        let max_len = ((max_seconds * f64::from(rate)).floor() as usize).min(len);
        prop_assume!(max_len >= 1);
        let ranges = split_ranges(&clip, max_seconds, &config).unwrap();
        prop_assert_eq!(ranges.len(), len.div_ceil(max_len));
        prop_assert_eq!(ranges[0].start, 0);
        prop_assert_eq!(ranges.last().unwrap().end, len);
        for pair in ranges.windows(2) {
            prop_assert_eq!(pair[0].end, pair[1].start);
        }
        for r in &ranges {
            prop_assert!(!r.is_empty() && r.len() <= max_len, "{:?} over {}", r, max_len);
        }
    }
}
