//! Quantization round trips per mode, and quantized matmuls against their dense equivalents.

mod common;

use common::array;
use mlx::quantized::{QuantMode, QuantSpec, gather_mm, quantize};
use mlx::{Array, Dtype};

fn max_abs(a: &Array) -> f32 {
    let axes: Vec<i32> = (0..a.ndim() as i32).collect();
    a.abs()
        .unwrap()
        .max(&axes, false)
        .unwrap()
        .item::<f32>()
        .unwrap()
}

/// The worst error each mode may make on values in [-1, 1):
/// - affine b bits, group range ≤ 2, step 2 / (2^b − 1): MLX snaps each group's bias so that
///   zero is exactly representable, which shifts the grid by up to half a step; with rounding
///   (half a step) an edge value can be off by one whole step, 2 / (2^b − 1), plus f32 rounding;
/// - mxfp8 (E4M3, 3 mantissa bits) with a power-of-two scale: relative step 2⁻³, so half a step
///   of the largest element is ≤ 2⁻⁴ · 2 = 0.125 in the worst group;
/// - mxfp4 / nvfp4 (E2M1): the grid {0, .5, 1, 1.5, 2, 3, 4, 6} has a widest gap of 2 at the top,
///   scaled so the group max lands near 6, i.e. half a gap = 1/6 of the max; nvfp4 stores its
///   scale in E4M3 (relative rounding ≤ 1/16), so ≤ (1/6)(1 + 1/16) < 0.178; mxfp4's
///   power-of-two scale can leave the grid up to twice as coarse: 0.34.
fn bound(mode: QuantMode, bits: i32) -> f32 {
    match mode {
        QuantMode::Affine => 2.0 / ((1 << bits) - 1) as f32 + 1e-5,
        QuantMode::Mxfp8 => 0.125,
        QuantMode::Mxfp4 => 0.34,
        QuantMode::Nvfp4 => 0.178,
    }
}

#[test]
fn quantize_dequantize_error_is_bounded_per_mode() {
    let (_, w) = array(&[64, 256], 21);
    let specs = [
        QuantSpec::affine(64, 8),
        QuantSpec::affine(64, 4),
        QuantSpec::affine(32, 4),
        QuantSpec::affine(32, 2),
        QuantSpec {
            group_size: 32,
            bits: 4,
            mode: QuantMode::Mxfp4,
        },
        QuantSpec {
            group_size: 32,
            bits: 8,
            mode: QuantMode::Mxfp8,
        },
        QuantSpec {
            group_size: 16,
            bits: 4,
            mode: QuantMode::Nvfp4,
        },
    ];
    for spec in specs {
        let q = quantize(&w, spec).unwrap();
        assert_eq!(q.biases.is_some(), spec.mode.has_biases(), "{spec:?}");
        let back = q.dequantize(Some(Dtype::F32)).unwrap();
        assert_eq!(back.shape(), vec![64, 256]);
        let err = max_abs(&back.subtract(&w).unwrap());
        let limit = bound(spec.mode, spec.bits);
        assert!(err <= limit, "{spec:?}: max error {err} exceeds {limit}");
        // Coarser modes must not be suspiciously exact either: the round trip really quantized.
        assert!(err > 0.0, "{spec:?}: no quantization error at all");
    }
}

#[test]
fn quantized_matmul_equals_matmul_with_dequantized_weights() {
    let (_, w) = array(&[48, 128], 22);
    let (_, x) = array(&[3, 128], 23);
    for spec in [
        QuantSpec::affine(64, 4),
        QuantSpec::affine(32, 8),
        QuantSpec {
            group_size: 32,
            bits: 4,
            mode: QuantMode::Mxfp4,
        },
    ] {
        let q = quantize(&w, spec).unwrap();
        let dense = q.dequantize(Some(Dtype::F32)).unwrap();
        let expected = x.matmul(&dense.transpose(&[1, 0]).unwrap()).unwrap();
        let got = q.matmul(&x, true).unwrap();
        let err = max_abs(&got.subtract(&expected).unwrap());
        // Same products in another summation order: 128 terms of size ≤ 1, f32.
        assert!(err < 1e-4, "{spec:?}: {err}");
    }
}

#[test]
fn gather_qmm_equals_per_expert_quantized_matmul() {
    let (experts, out, inp) = (4, 32, 64);
    let (_, w) = array(&[experts, out, inp], 24);
    let q = quantize(&w, QuantSpec::affine(32, 4)).unwrap();
    let (_, x) = array(&[5, 1, inp], 25);
    let chosen = [3i32, 0, 3, 1, 2];
    let rhs = Array::from_slice(&chosen, &[5]).unwrap();
    let got = q.gather_matmul(&x, None, Some(&rhs), true, false).unwrap();
    assert_eq!(got.shape(), vec![5, 1, out]);
    for (row, &e) in chosen.iter().enumerate() {
        let expert = mlx::quantized::Quantized {
            weights: q
                .weights
                .slice_axis(0, e, e + 1)
                .unwrap()
                .squeeze(&[0])
                .unwrap(),
            scales: q
                .scales
                .slice_axis(0, e, e + 1)
                .unwrap()
                .squeeze(&[0])
                .unwrap(),
            biases: q
                .biases
                .as_ref()
                .map(|b| b.slice_axis(0, e, e + 1).unwrap().squeeze(&[0]).unwrap()),
            spec: q.spec,
        };
        let xi = x
            .slice_axis(0, row as i32, row as i32 + 1)
            .unwrap()
            .squeeze(&[0])
            .unwrap();
        let expected = expert.matmul(&xi, true).unwrap();
        let gi = got
            .slice_axis(0, row as i32, row as i32 + 1)
            .unwrap()
            .squeeze(&[0])
            .unwrap();
        let err = max_abs(&gi.subtract(&expected).unwrap());
        assert!(err < 1e-5, "row {row} expert {e}: {err}");
    }

    // Sorted indices take MLX's grouped path and must agree.
    let sorted = Array::from_slice(&[0i32, 1, 2, 3, 3], &[5]).unwrap();
    let a = q
        .gather_matmul(&x, None, Some(&sorted), true, true)
        .unwrap();
    let b = q
        .gather_matmul(&x, None, Some(&sorted), true, false)
        .unwrap();
    assert!(max_abs(&a.subtract(&b).unwrap()) < 1e-5);
}

#[test]
fn gather_mm_equals_per_expert_matmul() {
    let (_, w) = array(&[3, 16, 8], 26);
    let (_, x) = array(&[4, 1, 16], 27);
    let chosen = [2i32, 2, 0, 1];
    let rhs = Array::from_slice(&chosen, &[4]).unwrap();
    let got = gather_mm(&x, &w, None, Some(&rhs), false).unwrap();
    for (row, &e) in chosen.iter().enumerate() {
        let expected = x
            .slice_axis(0, row as i32, row as i32 + 1)
            .unwrap()
            .squeeze(&[0])
            .unwrap()
            .matmul(&w.slice_axis(0, e, e + 1).unwrap().squeeze(&[0]).unwrap())
            .unwrap();
        let gi = got
            .slice_axis(0, row as i32, row as i32 + 1)
            .unwrap()
            .squeeze(&[0])
            .unwrap();
        assert!(max_abs(&gi.subtract(&expected).unwrap()) < 1e-5);
    }
}

#[test]
fn invalid_quantization_is_an_error() {
    let (_, w) = array(&[8, 30], 28);
    // 30 columns do not divide into groups of 32.
    assert!(quantize(&w, QuantSpec::affine(32, 4)).is_err());
    let (_, w) = array(&[8, 64], 29);
    assert!(quantize(&w, QuantSpec::affine(64, 9)).is_err());
    assert!(quantize(&w, QuantSpec::affine(64, 4)).is_ok());
}

/// Products of 4- and 8-bit affine weights go through mlxkit's packed CPU kernel
/// (`mlx-sys/shim/qmv.cc`) at any number of rows: decode-sized ones (one row per batched
/// sequence) and past 16 rows, where the kernel works in bands of weight rows. Each must equal
/// an f64 product with the dequantized weights, for every group size, batch shape and a
/// strided `x`. 200 output rows cross the kernel's 128-row bands.
#[test]
fn packed_cpu_matvec_equals_dense_reference() {
    common::each_kernel_level(|_| {
        let (out, inp) = (200, 256);
        let (_, w) = array(&[out, inp], 26);
        for spec in [
            QuantSpec::affine(32, 4),
            QuantSpec::affine(64, 4),
            QuantSpec::affine(128, 4),
            QuantSpec::affine(32, 8),
            QuantSpec::affine(64, 8),
        ] {
            assert!(spec.has_packed_cpu_matvec(), "{spec:?}");
            let q = quantize(&w, spec).unwrap();
            let dense = q.dequantize(Some(Dtype::F32)).unwrap();
            let dense_t = dense.transpose(&[1, 0]).unwrap().to_vec::<f32>().unwrap();
            for rows in [1, 2, 3, 4, 5, 8, 13, 16, 17, 40] {
                let (xs, x) = array(&[rows, inp], 27 + rows as u64);
                // The same rows as a batch `[rows, 1, in]` and as the transpose of `[in, rows]`.
                let batched = x.reshape(&[rows, 1, inp]).unwrap();
                let strided = Array::from_slice(
                    &common::transpose(&xs, rows as usize, inp as usize),
                    &[inp, rows],
                )
                .unwrap()
                .transpose(&[1, 0])
                .unwrap();
                let expected =
                    common::matmul(&xs, &dense_t, rows as usize, inp as usize, out as usize);
                for (input, what) in [(&x, "plain"), (&batched, "batched"), (&strided, "strided")] {
                    let got = q.matmul(input, true).unwrap();
                    assert_eq!(got.size(), (rows * out) as usize, "{spec:?} {what}");
                    // f32 sums of 256 products of magnitude ≤ 1, in another order than the f64
                    // reference: a random-walk rounding bound of √256 · 2⁻²⁴ · 256 ≈ 2.4e-4.
                    common::assert_close(
                        &got.to_vec::<f32>().unwrap(),
                        &expected,
                        3e-4,
                        &format!("{spec:?}, {rows} rows, {what}"),
                    );
                }
            }
        }
        assert!(!QuantSpec::affine(32, 3).has_packed_cpu_matvec());
        assert!(!QuantSpec::affine(32, 6).has_packed_cpu_matvec());
    });
}

/// A row's product does not depend on the rows it shares the kernel with: the engine batches
/// sequences, and a request's output must equal its output alone.
#[test]
fn packed_cpu_matvec_rows_are_independent() {
    common::each_kernel_level(|_| {
        let (out, inp) = (200, 256);
        let (_, w) = array(&[out, inp], 31);
        for spec in [QuantSpec::affine(32, 4), QuantSpec::affine(64, 8)] {
            let q = quantize(&w, spec).unwrap();
            // Past 16 rows too: a tied head takes a speculative round's rows, up to 17 for one
            // sequence and more for several.
            let (_, x) = array(&[40, inp], 32);
            let together = q.matmul(&x, true).unwrap().to_vec::<f32>().unwrap();
            for row in [0, 3, 4, 7, 12, 16, 17, 39] {
                let alone = q
                    .matmul(&x.slice_axis(0, row, row + 1).unwrap(), true)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap();
                let start = row as usize * out as usize;
                assert_eq!(
                    alone,
                    together[start..start + out as usize],
                    "{spec:?}, row {row}"
                );
            }
        }
    });
}

/// The kernel splits a product's output rows over the shim's threads; each output is summed the
/// same way whichever thread computes it, so the result does not depend on the thread count.
#[test]
fn packed_cpu_matvec_does_not_depend_on_the_thread_count() {
    common::each_kernel_level(|_| {
        let (out, inp) = (1003, 512); // not a multiple of the 8-row tiles
        let (_, w) = array(&[out, inp], 33);
        let before = mlx::cpu_threads();
        for spec in [QuantSpec::affine(32, 4), QuantSpec::affine(64, 8)] {
            let q = quantize(&w, spec).unwrap();
            for rows in [1, 5, 13] {
                let (_, x) = array(&[rows, inp], 34 + rows as u64);
                let mut results = Vec::new();
                for threads in [1, 3, 2] {
                    assert_eq!(mlx::set_cpu_threads(threads), threads);
                    results.push(q.matmul(&x, true).unwrap().to_vec::<f32>().unwrap());
                }
                assert_eq!(
                    results[0], results[1],
                    "{spec:?}, {rows} rows, 1 against 3 threads"
                );
                assert_eq!(
                    results[0], results[2],
                    "{spec:?}, {rows} rows, 1 against 2 threads"
                );
            }
        }
        mlx::set_cpu_threads(before);
    });
}
