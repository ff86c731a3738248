//! Distribution rows against the host reference: combined filters equal their sequential
//! application, penalties equal the direct formula, greedy equals argmax, masks hold, and
//! draft-chain rows equal the rows of a slot that sampled the drafts.

mod common;

use common::{adjusted, bitmask, logits_array, reference};
use mlx::Array;
use proptest::prelude::*;
use sampler::{Options, Sampler};

fn assert_rows_close(got: &[f32], expected: &[f64], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!(
            (f64::from(*g) - e).abs() < 2e-5,
            "{what}: token {i}: got {g}, expected {e}\n got {got:?}\n expected {expected:?}"
        );
    }
}

fn logits_strategy(max_vocab: usize) -> impl Strategy<Value = Vec<f32>> {
    (2..max_vocab).prop_flat_map(|v| prop::collection::vec(-4.0f32..4.0, v))
}

prop_compose! {
    fn options_strategy()(
        temperature in prop_oneof![Just(0.0f32), 0.2f32..2.0],
        top_k in prop_oneof![Just(0usize), 1usize..40],
        top_p in prop_oneof![Just(1.0f32), 0.05f32..1.0],
        min_p in prop_oneof![Just(0.0f32), 0.0f32..0.5],
        repeat_last_n in 1usize..10,
        repeat_penalty in prop_oneof![Just(1.0f32), 0.5f32..2.0],
        presence_penalty in prop_oneof![Just(0.0f32), -1.0f32..1.0],
        frequency_penalty in prop_oneof![Just(0.0f32), -0.5f32..1.0],
        bias in prop::collection::btree_map(0u32..2, -3.0f32..3.0, 0..2),
    ) -> Options {
        Options {
            temperature, top_k, top_p, min_p, repeat_last_n, repeat_penalty,
            presence_penalty, frequency_penalty, logit_bias: bias, seed: Some(1), logprobs: None,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn distribution_equals_the_sequential_filters(
        logits in logits_strategy(48),
        options in options_strategy(),
        history in prop::collection::vec(0u32..2, 0..12),
    ) {
        let vocab = logits.len() as u32;
        let history: Vec<u32> = history.iter().map(|t| t * 7 % vocab).collect();
        let (expected, margin) = reference(&logits, &options, &history, None);
        prop_assume!(margin > 1e-4);
        let mut sampler = Sampler::new();
        sampler.add(0, options, &history).unwrap();
        let got = sampler.distribution(0, &logits_array(&[logits]), None).unwrap();
        assert_rows_close(&got.probs.to_vec::<f32>().unwrap(), &expected, "distribution");
    }

    #[test]
    fn masked_distribution_equals_the_sequential_filters(
        logits in logits_strategy(40),
        options in options_strategy(),
        history in prop::collection::vec(0u32..40, 0..12),
        allowed in prop::collection::vec(any::<bool>(), 40),
    ) {
        let vocab = logits.len();
        let history: Vec<u32> = history.iter().map(|t| t % vocab as u32).collect();
        let allowed = &allowed[..vocab];
        prop_assume!(allowed.iter().any(|&a| a));
        let (expected, margin) = reference(&logits, &options, &history, Some(allowed));
        prop_assume!(margin > 1e-4);
        let mut sampler = Sampler::new();
        sampler.add(0, options, &history).unwrap();
        let mask = bitmask(allowed);
        let got = sampler
            .distribution_masked(0, &logits_array(&[logits]), None, &[Some(&mask)])
            .unwrap();
        assert_rows_close(&got.probs.to_vec::<f32>().unwrap(), &expected, "masked distribution");
    }

    #[test]
    fn penalties_equal_the_direct_formula(
        logits in logits_strategy(24),
        repeat_penalty in 0.3f32..3.0,
        presence_penalty in -2.0f32..2.0,
        frequency_penalty in -1.0f32..2.0,
        repeat_last_n in 1usize..20,
        history in prop::collection::vec(0u32..5, 0..30),
    ) {
        // Tokens drawn from a small range repeat often, so counts above one are common.
        let history: Vec<u32> = history.iter().map(|t| t % logits.len() as u32).collect();
        let options = Options {
            repeat_last_n, repeat_penalty, presence_penalty, frequency_penalty,
            ..Options::plain(1.0)
        };
        let x = adjusted(&logits, &options, &history, None);
        let max = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = x.iter().map(|v| (v - max).exp()).sum();
        let expected: Vec<f64> = x.iter().map(|v| (v - max).exp() / sum).collect();
        let mut sampler = Sampler::new();
        sampler.add(0, options, &history).unwrap();
        let got = sampler.distribution(0, &logits_array(&[logits]), None).unwrap();
        assert_rows_close(&got.probs.to_vec::<f32>().unwrap(), &expected, "penalties");
    }

    #[test]
    fn greedy_is_the_argmax_of_the_adjusted_logits(
        rows in prop::collection::vec(prop::collection::vec(-4.0f32..4.0, 30), 1..4),
        repeat_penalty in prop_oneof![Just(1.0f32), 0.5f32..2.0],
        history in prop::collection::vec(0u32..30, 0..8),
        bias in prop::collection::btree_map(0u32..30, -3.0f32..3.0, 0..3),
    ) {
        let options = Options {
            repeat_penalty, repeat_last_n: 8, logit_bias: bias, ..Options::greedy()
        };
        let mut sampler = Sampler::new();
        let slots: Vec<usize> = (0..rows.len()).collect();
        for &s in &slots {
            sampler.add(s, options.clone(), &history).unwrap();
        }
        let tokens = sampler.sample(&slots, &logits_array(&rows)).unwrap().tokens;
        let tokens = tokens.to_vec::<u32>().unwrap();
        for (row, token) in rows.iter().zip(tokens) {
            let x = adjusted(row, &options, &history, None);
            let mut sorted = x.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            prop_assume!(sorted[0] - sorted[1] > 1e-4);
            let best = (0..x.len()).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap();
            prop_assert_eq!(token as usize, best);
        }
    }

    #[test]
    fn draft_rows_equal_the_rows_after_appending_the_drafts(
        rows in prop::collection::vec(prop::collection::vec(-4.0f32..4.0, 20), 1..6),
        extra_drafts in 0usize..3,
        chain_seed in prop::collection::vec(0u32..20, 8),
        history in prop::collection::vec(0u32..20, 0..10),
        options in options_strategy(),
    ) {
        let options = Options { repeat_last_n: 4, ..options };
        let drafts = rows.len() - 1 + extra_drafts;
        let chain: Vec<u32> = chain_seed[..drafts].to_vec();
        let mut sampler = Sampler::new();
        sampler.add(0, options.clone(), &history).unwrap();
        let chain_array = Array::from_slice(
            &chain.iter().map(|&t| t as i32).collect::<Vec<_>>(), &[1, drafts as i32],
        ).unwrap();
        let got = sampler
            .distribution(0, &logits_array(&rows), Some(&chain_array))
            .unwrap()
            .probs
            .to_vec::<f32>()
            .unwrap();
        for (i, row) in rows.iter().enumerate() {
            let appended = drafts + 1 + i - rows.len();
            // The same slot, having *sampled* the drafts (logits pointing at each draft by a
            // margin no filter or penalty here can overturn), asked for one row.
            let mut advanced = Sampler::new();
            advanced.add(1, options.clone(), &history).unwrap();
            for &draft in &chain[..appended] {
                let pointing: Vec<f32> =
                    (0..20).map(|t| if t == draft { 1000.0 } else { 0.0 }).collect();
                let token = advanced.sample(&[1], &logits_array(&[pointing])).unwrap();
                prop_assert_eq!(token.tokens.item::<u32>().unwrap(), draft);
            }
            let row_logits = logits_array(std::slice::from_ref(row));
            let direct = advanced.distribution(1, &row_logits, None).unwrap();
            let direct = direct.probs.to_vec::<f32>().unwrap();
            let got_row = &got[i * 20..(i + 1) * 20];
            for (a, b) in got_row.iter().zip(&direct) {
                prop_assert!((a - b).abs() < 1e-6, "row {i}: {got_row:?} vs {direct:?}");
            }
            let window: Vec<u32> = history.iter().chain(&chain[..appended]).copied().collect();
            let (expected, margin) = reference(row, &options, &window, None);
            if margin > 1e-4 {
                assert_rows_close(got_row, &expected, "draft row");
            }
        }
    }
}

#[test]
fn masked_tokens_are_never_sampled_and_logprobs_see_the_mask() {
    let vocab = 70;
    let mut rng = common::Lcg::new(5);
    let slots: Vec<usize> = (0..64).collect();
    let mut sampler = Sampler::new();
    for &s in &slots {
        let options = Options {
            seed: Some(s as u64),
            logprobs: Some(3),
            presence_penalty: 1.0,
            ..Options::plain(3.0)
        };
        sampler.add(s, options, &[1, 2, 3]).unwrap();
    }
    let allowed: Vec<Vec<bool>> = slots
        .iter()
        .map(|_| (0..vocab).map(|_| rng.unit() < 0.2).collect())
        .collect();
    let masks: Vec<Vec<u32>> = allowed.iter().map(|a| bitmask(a)).collect();
    let mask_refs: Vec<Option<&[u32]>> = masks.iter().map(|m| Some(m.as_slice())).collect();
    let rows: Vec<Vec<f32>> = slots.iter().map(|_| rng.logits(vocab, 1.0)).collect();
    let logits = logits_array(&rows);
    for _ in 0..10 {
        let sampled = sampler.sample_masked(&slots, &logits, &mask_refs).unwrap();
        let tokens = sampled.tokens.to_vec::<u32>().unwrap();
        let logprobs = sampled.logprobs.unwrap();
        let chosen = logprobs.chosen.to_vec::<f32>().unwrap();
        let top_ids = logprobs.top_ids.to_vec::<u32>().unwrap();
        for (row, &t) in tokens.iter().enumerate() {
            assert!(
                allowed[row][t as usize],
                "row {row} sampled masked token {t}"
            );
            // Logprobs renormalise over the allowed tokens of the raw logits.
            let x: Vec<f64> = (0..vocab)
                .filter(|&i| allowed[row][i])
                .map(|i| f64::from(rows[row][i]))
                .collect();
            let max = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + x.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
            let expected = f64::from(rows[row][t as usize]) - lse;
            assert!((f64::from(chosen[row]) - expected).abs() < 1e-5);
            for &id in &top_ids[row * 3..row * 3 + 3] {
                if allowed[row].iter().filter(|&&a| a).count() >= 3 {
                    assert!(allowed[row][id as usize]);
                }
            }
        }
    }
}

#[test]
fn greedy_respects_the_mask() {
    let mut sampler = Sampler::new();
    sampler.add(0, Options::greedy(), &[]).unwrap();
    let logits = logits_array(&[vec![5.0, 1.0, 3.0, 4.0]]);
    let mask = bitmask(&[false, true, true, false]);
    let token = sampler
        .sample_masked(&[0], &logits, &[Some(&mask)])
        .unwrap()
        .tokens
        .item::<u32>()
        .unwrap();
    assert_eq!(token, 2);
}
