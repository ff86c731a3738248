//! `fast::softmax_last_axis`: softmax over the last axis with mlxkit's vectorized `exp`, against
//! f64, on every kernel level.

mod common;

use mlx::Array;
use mlx::fast::softmax_last_axis;

/// Rows of 0 to 37 logits (the 8-lane loop with and without a tail, and a row of one), spread
/// over ±60 with a -inf (a masked score) in some, from a view (a transposed array) as well as
/// contiguous input. The bound, relative: 1e-6 (a few f32 ulps) for `exp`'s ~2 ulps, the
/// sum's rounding and the scale; a wrong maximum or a dropped tail is orders larger.
#[test]
fn softmax_equals_f64_reference() {
    common::each_kernel_level(|_| {
        for n in [1usize, 7, 8, 9, 16, 37] {
            let rows = 5;
            let data: Vec<f32> = (0..rows * n)
                .map(|i| match i % 11 {
                    3 if n > 1 => f32::NEG_INFINITY,
                    _ => ((i * 37) % 121) as f32 - 60.0,
                })
                .collect();
            let x = Array::from_slice(&data, &[rows as i32, n as i32]).unwrap();
            let out = softmax_last_axis(&x)
                .unwrap()
                .expect("the CPU kernel takes f32")
                .to_vec::<f32>()
                .unwrap();
            for r in 0..rows {
                let row = &data[r * n..(r + 1) * n];
                let max = row
                    .iter()
                    .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
                let total: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
                for (i, &v) in row.iter().enumerate() {
                    let want = (f64::from(v) - max).exp() / total;
                    let got = f64::from(out[r * n + i]);
                    assert!(
                        (got - want).abs() <= 1e-6 * want + 1e-38,
                        "n {n}, row {r}, column {i}: got {got}, expected {want}"
                    );
                }
            }
        }
        // A view: the transpose of a [4, 9] array, softmax over its rows of 4.
        let data: Vec<f32> = (0..36).map(|i| (i as f32 * 0.7).sin() * 8.0).collect();
        let x = Array::from_slice(&data, &[4, 9]).unwrap();
        let t = x.transpose(&[1, 0]).unwrap();
        let ours = softmax_last_axis(&t)
            .unwrap()
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let mlx = t.softmax(&[-1], true).unwrap().to_vec::<f32>().unwrap();
        for (a, b) in ours.iter().zip(&mlx) {
            assert!((a - b).abs() <= 1e-6 * b.abs() + 1e-12, "{a} vs {b}");
        }
    });
}

/// Other dtypes and empty arrays are declined, for the caller to use MLX's softmax.
#[test]
fn softmax_declines_what_it_does_not_take() {
    let half = Array::from_slice(&[1.0f32, 2.0], &[2])
        .unwrap()
        .astype(mlx::Dtype::F16)
        .unwrap();
    assert!(softmax_last_axis(&half).unwrap().is_none());
    let empty = Array::from_slice::<f32>(&[], &[0, 3]).unwrap();
    assert!(softmax_last_axis(&empty).unwrap().is_none());
}
