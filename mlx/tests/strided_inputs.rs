//! The shim's CPU primitives take inputs of any layout (transposed views, the halves of a
//! split) and give the same bits as on a contiguous copy; rotary embedding and RMS norm give a
//! token and a row the same bits whatever chunk or batch surrounds it, which is what lets
//! batching and speculation leave a request's output unchanged.

mod common;

use mlx::fast::{Gate, RopeFrequencies, RopeOffset, gated_activation, rms_norm, rope};
use mlx::quantized::{QuantSpec, quantize};
use mlx::{Array, Dtype};

fn bits(a: &Array) -> Vec<u32> {
    a.to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn periods(half: usize) -> Array {
    let p: Vec<f32> = (0..half)
        .map(|i| 10000f32.powf(2.0 * i as f32 / (2 * half) as f32) * (1.0 + i as f32 / 7.0))
        .collect();
    Array::from_slice(&p, &[half as i32]).unwrap()
}

#[test]
fn rope_of_a_transposed_view_equals_rope_of_its_copy() {
    // `[batch, tokens, heads, d]` as projections produce it, viewed as `[batch, heads, tokens, d]`.
    let (_, x) = common::array(&[2, 5, 3, 16], 21);
    let view = x.transpose(&[0, 2, 1, 3]).unwrap();
    let copy = view.contiguous().unwrap();
    let freqs = periods(4);
    let offsets = Array::from_slice(&[3i32, 40], &[2]).unwrap();
    for traditional in [false, true] {
        for (dims, frequencies) in [
            (16, RopeFrequencies::Base(10000.0)),
            (8, RopeFrequencies::Base(500.0)),
            (8, RopeFrequencies::Custom(&freqs)),
        ] {
            for offset in [RopeOffset::Scalar(17), RopeOffset::PerRow(&offsets)] {
                let a = rope(&view, dims, traditional, frequencies, 0.5, offset).unwrap();
                let b = rope(&copy, dims, traditional, frequencies, 0.5, offset).unwrap();
                assert_eq!(
                    bits(&a),
                    bits(&b),
                    "traditional={traditional} dims={dims} {frequencies:?} {offset:?}"
                );
            }
        }
    }
}

#[test]
fn rope_gives_a_token_the_same_bits_alone_in_a_chunk_and_in_a_batch() {
    let (batch, heads, tokens, d) = (2, 3, 6, 16);
    let (_, x) = common::array(&[batch, heads, tokens, d], 22);
    let starts = [4i32, 1000];
    let offsets = Array::from_slice(&starts, &[batch]).unwrap();
    for traditional in [false, true] {
        let base = RopeFrequencies::Base(10000.0);
        let all = rope(&x, 12, traditional, base, 1.0, RopeOffset::PerRow(&offsets)).unwrap();
        for b in 0..batch {
            for t in 0..tokens {
                let token = |a: &Array| {
                    a.slice_axis(0, b, b + 1)
                        .unwrap()
                        .slice_axis(2, t, t + 1)
                        .unwrap()
                        .contiguous()
                        .unwrap()
                };
                let alone = rope(
                    &token(&x),
                    12,
                    traditional,
                    base,
                    1.0,
                    RopeOffset::Scalar(starts[b as usize] + t),
                )
                .unwrap();
                assert_eq!(
                    bits(&token(&all)),
                    bits(&alone),
                    "row {b} token {t} traditional={traditional}"
                );
            }
        }
    }
}

#[test]
fn rope_takes_three_axes_as_one_head() {
    let (_, x) = common::array(&[2, 7, 8], 23);
    let four = x.reshape(&[2, 1, 7, 8]).unwrap();
    let base = RopeFrequencies::Base(10000.0);
    let a = rope(&x, 8, false, base, 1.0, RopeOffset::Scalar(5)).unwrap();
    let b = rope(&four, 8, false, base, 1.0, RopeOffset::Scalar(5)).unwrap();
    assert_eq!(a.shape(), vec![2, 7, 8]);
    assert_eq!(bits(&a), bits(&b));
}

#[test]
fn rope_rejects_what_mlx_rejects() {
    let (_, x) = common::array(&[1, 2, 3, 8], 24);
    let base = RopeFrequencies::Base(10000.0);
    let offset = RopeOffset::Scalar(0);
    assert!(rope(&x, 7, false, base, 1.0, offset).is_err(), "odd dims");
    assert!(
        rope(&x, 10, false, base, 1.0, offset).is_err(),
        "dims past the last axis"
    );
    let (_, flat) = common::array(&[3, 8], 25);
    assert!(
        rope(&flat, 8, false, base, 1.0, offset).is_err(),
        "two axes"
    );
    let three = Array::from_slice(&[1i32, 2, 3], &[3]).unwrap();
    let wrong = rope(&x, 8, false, base, 1.0, RopeOffset::PerRow(&three));
    assert!(wrong.is_err(), "three offsets for one row");
    let short = periods(3);
    let custom = rope(&x, 8, false, RopeFrequencies::Custom(&short), 1.0, offset);
    assert!(custom.is_err(), "three periods for four pairs");
}

#[test]
fn rms_norm_reads_strided_rows_and_keeps_rows_independent() {
    let (_, w) = common::array(&[24], 26);
    // Rows whose features are 24 elements apart, and rows of a transposed batch.
    let (_, m) = common::array(&[24, 6], 27);
    let (_, t) = common::array(&[5, 4, 24], 28);
    for view in [
        m.transpose(&[1, 0]).unwrap(),
        t.transpose(&[1, 0, 2]).unwrap(),
    ] {
        let copy = view.contiguous().unwrap();
        for weight in [Some(&w), None] {
            let a = rms_norm(&view, weight, 1e-6).unwrap();
            let b = rms_norm(&copy, weight, 1e-6).unwrap();
            assert_eq!(bits(&a), bits(&b), "weight {}", weight.is_some());
        }
    }
    let (_, rows) = common::array(&[7, 24], 29);
    let all = rms_norm(&rows, Some(&w), 1e-5).unwrap();
    for r in 0..7 {
        let one = rows.slice_axis(0, r, r + 1).unwrap();
        let alone = rms_norm(&one, Some(&w), 1e-5).unwrap();
        assert_eq!(
            bits(&all.slice_axis(0, r, r + 1).unwrap().contiguous().unwrap()),
            bits(&alone),
            "row {r}"
        );
    }
}

#[test]
fn other_dtypes_go_through_mlx_and_agree() {
    let (_, x) = common::array(&[1, 2, 3, 16], 30);
    let (_, w) = common::array(&[16], 31);
    let half = x.astype(Dtype::Bf16).unwrap();
    let base = RopeFrequencies::Base(10000.0);
    let offset = RopeOffset::Scalar(9);
    let pairs = [
        (
            rope(&x, 16, false, base, 1.0, offset).unwrap(),
            rope(&half, 16, false, base, 1.0, offset).unwrap(),
        ),
        (
            rms_norm(&x, Some(&w), 1e-5).unwrap(),
            rms_norm(&half, Some(&w.astype(Dtype::Bf16).unwrap()), 1e-5).unwrap(),
        ),
    ];
    for (f32_result, bf16_result) in pairs {
        assert_eq!(bf16_result.dtype(), Dtype::Bf16);
        let a = f32_result.to_vec::<f32>().unwrap();
        let b = bf16_result
            .astype(Dtype::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        // bf16 keeps 8 significant bits: its results are within a few 2^-8 of f32's.
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() <= 0.05 * p.abs().max(1.0), "{p} against {q}");
        }
    }
}

#[test]
fn packed_matvec_and_gated_activation_take_views() {
    common::each_kernel_level(|level| {
        // The two halves of a fused gate/up output, as the MLP splits it.
        let (_, both) = common::array(&[3, 80], 32);
        let halves = both.split_at(&[40], -1).unwrap();
        let (gate, up) = (&halves[0], &halves[1]);
        let view = gated_activation(Gate::Silu, gate, up).unwrap().unwrap();
        let copy = gated_activation(
            Gate::Silu,
            &gate.contiguous().unwrap(),
            &up.contiguous().unwrap(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(bits(&view), bits(&copy), "gated activation at {level:?}");

        let (_, w) = common::array(&[64, 128], 33);
        let packed = quantize(&w, QuantSpec::affine(32, 4)).unwrap();
        let (_, columns) = common::array(&[128, 3], 34);
        let x = columns.transpose(&[1, 0]).unwrap();
        let a = packed.matmul(&x, true).unwrap();
        let b = packed.matmul(&x.contiguous().unwrap(), true).unwrap();
        assert_eq!(bits(&a), bits(&b), "packed matvec at {level:?}");
    });
}
