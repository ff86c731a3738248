//! `fast::gated_activation`: `act(gate) · up` with mlxkit's vectorized `exp`, against f64.

mod common;

use mlx::Array;
use mlx::fast::{Gate, gated_activation};

/// The argument `z` of `g / (1 + exp(-z))`.
fn argument(kind: Gate, g: f64) -> f64 {
    match kind {
        Gate::Silu => g,
        Gate::GeluTanh => 2.0 * (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g),
    }
}

fn reference(kind: Gate, g: f64) -> f64 {
    match kind {
        Gate::Silu => g / (1.0 + (-g).exp()),
        Gate::GeluTanh => {
            let y = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
            // 0.5 · (1 + tanh y), without f64's cancellation where tanh y is near -1.
            g / (1.0 + (-2.0 * y).exp())
        }
    }
}

/// Gates from -120 to 120 (both saturated ends, where `exp` under- and overflows, and the
/// region near 0) times `up` values of either sign; 1001 elements, so the 8-lane loop leaves a
/// tail. The bound, relative: 8e-7 (≈ 7 f32 ulps) for `exp`'s own ~2 ulps, the division and
/// the products, plus 3e-7·|z| because `exp(-z)` passes on the f32 rounding of its argument `z`
/// (a few ulps of GELU's cubic) multiplied by |z|; an error in a coefficient or the range
/// reduction is orders larger.
#[test]
fn gated_activation_equals_f64_reference() {
    common::each_kernel_level(|_| {
        let n = 1001;
        let gate: Vec<f32> = (0..n)
            .map(|i| -120.0 + 240.0 * i as f32 / (n - 1) as f32)
            .collect();
        let up: Vec<f32> = (0..n)
            .map(|i| if i % 3 == 0 { -1.5 } else { 0.75 })
            .collect();
        let g = Array::from_slice(&gate, &[7, 143]).unwrap();
        let u = Array::from_slice(&up, &[7, 143]).unwrap();
        for kind in [Gate::Silu, Gate::GeluTanh] {
            let out = gated_activation(kind, &g, &u)
                .unwrap()
                .expect("the CPU kernel takes f32")
                .to_vec::<f32>()
                .unwrap();
            assert_eq!(out.len(), n);
            for i in 0..n {
                let expected = reference(kind, f64::from(gate[i])) * f64::from(up[i]);
                let err = (f64::from(out[i]) - expected).abs();
                let bound =
                    (8e-7 + 3e-7 * argument(kind, f64::from(gate[i])).abs()) * expected.abs();
                assert!(
                    err <= bound + 1e-30,
                    "{kind:?} at gate {}: got {}, expected {expected} (error {err:e})",
                    gate[i],
                    out[i]
                );
            }
        }
    });
}

/// Other dtypes and mismatched shapes are declined, for the caller to use MLX's ops.
#[test]
fn gated_activation_declines_what_it_does_not_take() {
    let a = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let b = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    assert!(gated_activation(Gate::Silu, &a, &b).unwrap().is_none());
    let half = a.astype(mlx::Dtype::F16).unwrap();
    assert!(
        gated_activation(Gate::Silu, &half, &half)
            .unwrap()
            .is_none()
    );
}
