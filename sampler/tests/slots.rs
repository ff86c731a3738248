//! Slot bookkeeping: the ring holds exactly the last N tokens, seeds reproduce, logprobs are
//! OpenAI's, the batched and per-slot paths agree, and bad calls are errors.

mod common;

use common::{Lcg, logits_array};
use mlx::{Array, Dtype};
use proptest::prelude::*;
use sampler::{Error, Options, Sampler};

/// Logits whose argmax is `token` by a wide margin.
fn pointing_at(token: u32, vocab: usize) -> Vec<f32> {
    (0..vocab)
        .map(|t| if t as u32 == token { 10.0 } else { 0.0 })
        .collect()
}

#[derive(Debug, Clone)]
enum Step {
    Sample(u32),
    Commit(Vec<u32>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u32..50).prop_map(Step::Sample),
        prop::collection::vec(0u32..50, 0..12).prop_map(Step::Commit),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_ring_holds_exactly_the_last_n_tokens(
        capacity in 1usize..10,
        prompt in prop::collection::vec(0u32..50, 0..20),
        steps in prop::collection::vec(step(), 0..16),
    ) {
        // A tiny frequency penalty keeps a ring without moving the argmax.
        let options = Options {
            repeat_last_n: capacity, frequency_penalty: 1e-3, ..Options::greedy()
        };
        let mut sampler = Sampler::new();
        sampler.add(3, options, &prompt).unwrap();
        let mut all = prompt.clone();
        for step in steps {
            match step {
                Step::Sample(token) => {
                    let logits = logits_array(&[pointing_at(token, 50)]);
                    sampler.sample(&[3], &logits).unwrap();
                    all.push(token);
                }
                Step::Commit(tokens) => {
                    sampler.commit(3, &tokens).unwrap();
                    all.extend(tokens);
                }
            }
            let expected = &all[all.len().saturating_sub(capacity)..];
            prop_assert_eq!(sampler.history(3).unwrap(), expected.to_vec());
        }
    }
}

#[test]
fn same_seed_and_logits_give_the_same_tokens_whatever_the_batch() {
    let vocab = 500;
    let mut rng = Lcg::new(11);
    let rows: Vec<Vec<f32>> = (0..3).map(|_| rng.logits(vocab, 2.0)).collect();
    let seeded = |seed| Options {
        seed: Some(seed),
        ..Options::default()
    };
    let run = |batch: bool| -> Vec<u32> {
        let mut sampler = Sampler::new();
        sampler.add(0, seeded(42), &[]).unwrap();
        // Different options: forces the per-slot path when batched.
        sampler.add(1, Options::plain(1.3), &[]).unwrap();
        sampler.add(2, seeded(43), &[]).unwrap();
        (0..20)
            .map(|_| {
                if batch {
                    let tokens = sampler.sample(&[2, 0, 1], &logits_array(&rows)).unwrap();
                    tokens.tokens.to_vec::<u32>().unwrap()[1]
                } else {
                    let row = logits_array(&[rows[1].clone()]);
                    sampler
                        .sample(&[0], &row)
                        .unwrap()
                        .tokens
                        .item::<u32>()
                        .unwrap()
                }
            })
            .collect()
    };
    let alone = run(false);
    assert_eq!(alone, run(false), "same seed, same tokens");
    assert_eq!(
        alone,
        run(true),
        "a seeded slot ignores who else is in the call"
    );
    // Slots 0 and 2 share options up to the seed, so they run batched, yet differ.
    let mut sampler = Sampler::new();
    sampler.add(0, seeded(42), &[]).unwrap();
    sampler.add(2, seeded(43), &[]).unwrap();
    let both = logits_array(&[rows[1].clone(), rows[1].clone()]);
    let pairs: Vec<Vec<u32>> = (0..20)
        .map(|_| {
            sampler
                .sample(&[0, 2], &both)
                .unwrap()
                .tokens
                .to_vec()
                .unwrap()
        })
        .collect();
    assert_eq!(pairs.iter().map(|p| p[0]).collect::<Vec<_>>(), alone);
    assert!(
        pairs.iter().any(|p| p[0] != p[1]),
        "different seeds drew identical streams"
    );
}

#[test]
fn logprobs_are_the_raw_log_softmax_and_its_sorted_top_n() {
    let vocab = 300;
    let mut rng = Lcg::new(3);
    let rows: Vec<Vec<f32>> = (0..2).map(|_| rng.logits(vocab, 3.0)).collect();
    let mut sampler = Sampler::new();
    let penalized = Options {
        temperature: 0.5,
        repeat_penalty: 1.5,
        logit_bias: [(7, 5.0)].into(),
        logprobs: Some(4),
        ..Options::default()
    };
    sampler.add(0, penalized.clone(), &[1, 2, 3]).unwrap();
    sampler
        .add(
            1,
            Options {
                logprobs: Some(6),
                ..penalized
            },
            &[4],
        )
        .unwrap();
    let sampled = sampler.sample(&[0, 1], &logits_array(&rows)).unwrap();
    let tokens = sampled.tokens.to_vec::<u32>().unwrap();
    let logprobs = sampled.logprobs.expect("requested");
    // Computed for every row with the largest N asked for.
    assert_eq!(logprobs.top_ids.shape(), vec![2, 6]);
    let chosen = logprobs.chosen.to_vec::<f32>().unwrap();
    let top_ids = logprobs.top_ids.to_vec::<u32>().unwrap();
    let top_lp = logprobs.top_logprobs.to_vec::<f32>().unwrap();
    for (r, row) in rows.iter().enumerate() {
        let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = max
            + row
                .iter()
                .map(|&v| (v as f64 - max).exp())
                .sum::<f64>()
                .ln();
        let lp: Vec<f64> = row.iter().map(|&v| v as f64 - lse).collect();
        assert!((chosen[r] as f64 - lp[tokens[r] as usize]).abs() < 1e-5);
        let mut order: Vec<usize> = (0..vocab).collect();
        order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]));
        for k in 0..6 {
            assert_eq!(top_ids[r * 6 + k] as usize, order[k], "row {r} rank {k}");
            assert!((top_lp[r * 6 + k] as f64 - lp[order[k]]).abs() < 1e-5);
        }
    }
    // Not requested: nothing computed.
    let mut plain = Sampler::new();
    plain.add(0, Options::default(), &[]).unwrap();
    let sampled = plain.sample(&[0], &logits_array(&rows[..1])).unwrap();
    assert!(sampled.logprobs.is_none());
}

#[test]
fn batched_and_per_slot_paths_agree() {
    let vocab = 64;
    let mut rng = Lcg::new(19);
    let rows: Vec<Vec<f32>> = (0..3).map(|_| rng.logits(vocab, 2.0)).collect();
    let options = |seed| Options {
        seed: Some(seed),
        top_k: 20,
        top_p: 0.8,
        min_p: 0.02,
        repeat_last_n: 5,
        repeat_penalty: 1.3,
        frequency_penalty: 0.2,
        ..Options::default()
    };
    let mut batched = Sampler::new();
    let mut single = Sampler::new();
    for s in 0..3 {
        batched.add(s, options(s as u64), &[1, 2, 2]).unwrap();
        single.add(s, options(s as u64), &[1, 2, 2]).unwrap();
    }
    for _ in 0..8 {
        let together = batched.sample(&[0, 1, 2], &logits_array(&rows)).unwrap();
        let together = together.tokens.to_vec::<u32>().unwrap();
        for s in 0..3 {
            let row = logits_array(&[rows[s].clone()]);
            let alone = single
                .sample(&[s], &row)
                .unwrap()
                .tokens
                .item::<u32>()
                .unwrap();
            assert_eq!(together[s], alone, "slot {s}");
        }
    }
    for s in 0..3 {
        assert_eq!(batched.history(s).unwrap(), single.history(s).unwrap());
    }
}

#[test]
fn half_precision_logits_are_accepted() {
    let mut sampler = Sampler::new();
    sampler.add(0, Options::greedy(), &[]).unwrap();
    let logits = logits_array(&[vec![0.0, 3.0, 1.0]])
        .astype(Dtype::Bf16)
        .unwrap();
    let token = sampler
        .sample(&[0], &logits)
        .unwrap()
        .tokens
        .item::<u32>()
        .unwrap();
    assert_eq!(token, 1);
}

#[test]
fn bad_calls_are_errors_naming_the_problem() {
    let mut sampler = Sampler::new();
    sampler.add(0, Options::default(), &[1, 2]).unwrap();
    let row = logits_array(&[vec![0.0; 8]]);
    assert_eq!(
        sampler.add(0, Options::default(), &[]),
        Err(Error::SlotInUse(0))
    );
    assert_eq!(
        sampler.sample(&[5], &row).unwrap_err(),
        Error::UnknownSlot(5)
    );
    assert_eq!(sampler.sample(&[], &row).unwrap_err(), Error::NoSlots);
    sampler.add(1, Options::default(), &[]).unwrap();
    let two = logits_array(&[vec![0.0; 8], vec![0.0; 8]]);
    assert_eq!(
        sampler.sample(&[1, 1], &two).unwrap_err(),
        Error::DuplicateSlot(1)
    );
    assert!(matches!(
        sampler.sample(&[0, 1], &row),
        Err(Error::LogitsShape { rows: 2, .. })
    ));
    let ints = Array::from_slice(&[1i32; 8], &[1, 8]).unwrap();
    assert_eq!(
        sampler.sample(&[0], &ints).unwrap_err(),
        Error::LogitsDtype(Dtype::I32)
    );
    let mask = [0u32];
    assert!(matches!(
        sampler.sample_masked(&[0], &row, &[Some(&mask)]),
        Err(Error::MaskEmpty { row: 0 })
    ));
    assert!(matches!(
        sampler.sample_masked(&[0], &row, &[None, None]),
        Err(Error::MaskCount { masks: 2, rows: 1 })
    ));
    // Prompt token 2 is outside a vocabulary of 2.
    let tiny = logits_array(&[vec![0.0; 2]]);
    assert_eq!(
        sampler.sample(&[0], &tiny).unwrap_err(),
        Error::TokenOutOfVocab { token: 2, vocab: 2 }
    );
    sampler.sample(&[0], &row).unwrap();
    let wider = logits_array(&[vec![0.0; 9]]);
    assert!(matches!(
        sampler.sample(&[0], &wider),
        Err(Error::VocabChanged {
            expected: 8,
            found: 9,
            ..
        })
    ));
    assert_eq!(
        sampler.commit(0, &[8]).unwrap_err(),
        Error::TokenOutOfVocab { token: 8, vocab: 8 }
    );
    let biased = Options {
        logit_bias: [(100, 1.0)].into(),
        ..Options::default()
    };
    sampler.add(2, biased, &[]).unwrap();
    assert!(matches!(
        sampler.sample(&[2], &row),
        Err(Error::TokenOutOfVocab { token: 100, .. })
    ));
    let chain = Array::from_slice(&[1i32], &[1]).unwrap();
    let three = logits_array(&[vec![0.0; 8], vec![0.0; 8], vec![0.0; 8]]);
    assert_eq!(
        sampler.distribution(0, &three, Some(&chain)).unwrap_err(),
        Error::TooManyRows { rows: 3, drafts: 1 }
    );
    let bad_chain = Array::from_slice(&[1.0f32], &[1]).unwrap();
    assert!(matches!(
        sampler.distribution(0, &row, Some(&bad_chain)),
        Err(Error::ChainShape { .. })
    ));
    assert_eq!(sampler.remove(7), Err(Error::UnknownSlot(7)));
    sampler.remove(0).unwrap();
    assert!(!sampler.contains(0));
}
