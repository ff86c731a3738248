//! Seeded draws follow the exact filtered distribution: for random small vocabularies and
//! option sets, the empirical distribution of many draws passes a chi-square test against the
//! distribution computed on the host in f64. Keys and cases are fixed, so the test is
//! deterministic: it fails only if the sampler draws from the wrong distribution.

mod common;

use common::{Lcg, bitmask, chi_square, logits_array, reference};
use sampler::{Options, Sampler};

fn random_options(rng: &mut Lcg, vocab: usize) -> Options {
    let mut options = Options::plain(0.3 + rng.unit() as f32 * 1.7);
    if rng.unit() < 0.5 {
        options.top_k = rng.range(1, vocab + 1);
    }
    if rng.unit() < 0.5 {
        options.top_p = 0.3 + rng.unit() as f32 * 0.65;
    }
    if rng.unit() < 0.4 {
        options.min_p = rng.unit() as f32 * 0.3;
    }
    if rng.unit() < 0.5 {
        options.repeat_last_n = rng.range(1, 12);
        options.repeat_penalty = 0.8 + rng.unit() as f32;
        options.presence_penalty = rng.unit() as f32 - 0.3;
        options.frequency_penalty = rng.unit() as f32 * 0.5;
    }
    if rng.unit() < 0.4 {
        for _ in 0..rng.range(1, 4) {
            let token = rng.range(0, vocab) as u32;
            options
                .logit_bias
                .insert(token, (rng.unit() * 4.0 - 2.0) as f32);
        }
    }
    options
}

#[test]
fn batched_seeded_draws_match_the_exact_distribution() {
    const DRAWS: usize = 2000;
    let mut rng = Lcg::new(2026);
    let mut checked = 0;
    for case in 0..28u64 {
        let vocab = rng.range(3, 40);
        let options = random_options(&mut rng, vocab);
        let prompt: Vec<u32> = (0..rng.range(0, 16))
            .map(|_| rng.range(0, vocab) as u32)
            .collect();
        let logits = rng.logits(vocab, 3.0);
        let allowed: Option<Vec<bool>> = (rng.unit() < 0.3).then(|| {
            let mut a: Vec<bool> = (0..vocab).map(|_| rng.unit() < 0.6).collect();
            a[rng.range(0, vocab)] = true;
            a
        });
        let (expected, margin) = reference(&logits, &options, &prompt, allowed.as_deref());
        if margin < 1e-3 {
            continue; // f32 and f64 may disagree on this boundary; no statement to test
        }
        checked += 1;

        let mut sampler = Sampler::new();
        for slot in 0..DRAWS {
            let seeded = Options {
                seed: Some(case * 1_000_003 + slot as u64),
                ..options.clone()
            };
            sampler.add(slot, seeded, &prompt).unwrap();
        }
        let slots: Vec<usize> = (0..DRAWS).collect();
        let rows = logits_array(&vec![logits.clone(); DRAWS]);
        let mask = allowed.as_deref().map(bitmask);
        let masks: Vec<Option<&[u32]>> = vec![mask.as_deref(); DRAWS];
        let tokens = sampler
            .sample_masked(&slots, &rows, if mask.is_some() { &masks } else { &[] })
            .unwrap()
            .tokens
            .to_vec::<u32>()
            .unwrap();
        let mut counts = vec![0usize; vocab];
        for t in tokens {
            counts[t as usize] += 1;
        }
        let (stat, quantile) = chi_square(&counts, &expected);
        assert!(
            stat < quantile,
            "case {case}: chi-square {stat:.1} ≥ {quantile:.1}\noptions {options:?}\n\
             counts {counts:?}\nexpected {expected:?}"
        );
    }
    assert!(
        checked >= 20,
        "only {checked} cases were far enough from a boundary"
    );
}

#[test]
fn one_slot_drawing_step_after_step_matches_the_exact_distribution() {
    // Successive keys split from one seed must be as good as independent seeds.
    const STEPS: usize = 1500;
    let mut rng = Lcg::new(7);
    let vocab = 12;
    let logits = rng.logits(vocab, 2.0);
    let options = Options {
        top_k: 9,
        top_p: 0.93,
        seed: Some(99),
        ..Options::plain(0.9)
    };
    let (expected, margin) = reference(&logits, &options, &[], None);
    assert!(margin > 1e-3);
    let mut sampler = Sampler::new();
    sampler.add(0, options, &[]).unwrap();
    let row = logits_array(&[logits]);
    let mut counts = vec![0usize; vocab];
    for _ in 0..STEPS {
        let token = sampler
            .sample(&[0], &row)
            .unwrap()
            .tokens
            .item::<u32>()
            .unwrap();
        counts[token as usize] += 1;
    }
    let (stat, quantile) = chi_square(&counts, &expected);
    assert!(
        stat < quantile,
        "chi-square {stat:.1} ≥ {quantile:.1}: {counts:?} vs {expected:?}"
    );
}
