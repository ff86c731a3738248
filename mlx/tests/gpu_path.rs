//! The GPU's code path on a CPU: with the custom CPU primitives set aside
//! (`set_cpu_primitives(false)`, or `MLXKIT_CPU_PRIMITIVES=off` at start), every one of them
//! declines before building a graph node, exactly as it does when the default device is a GPU,
//! so none can ever be scheduled on a GPU stream (where it has no kernel and would throw in the
//! middle of a graph). The fused ops that fall back inside (`rms_norm`, `rope`) give MLX's
//! result instead. Every test here sets the switch, so they run one at a time.

use std::sync::Mutex;

use mlx::fast::{Gate, gated_activation, gated_delta_scan, softmax_last_axis, ssd_scan};
use mlx::quantized::QuantSpec;
use mlx::{Array, Dtype, cpu_primitive_paths, set_cpu_primitives};

static SWITCH: Mutex<()> = Mutex::new(());

fn ones(shape: &[i32]) -> Array {
    Array::ones(shape, Dtype::F32).unwrap()
}

/// Whether each primitive that reports declining built a node, in a fixed order.
fn primitives_that_ran() -> Vec<(&'static str, bool)> {
    let x = ones(&[2, 8]);
    let (q, v) = (ones(&[1, 3, 1, 4]), ones(&[1, 3, 1, 4]));
    let (g, beta) = (
        ones(&[1, 3, 1]).multiply(-0.1).unwrap(),
        ones(&[1, 3, 1]).multiply(0.5).unwrap(),
    );
    let state = Array::zeros(&[1, 1, 4, 4], Dtype::F32).unwrap();
    let (dt, a) = (ones(&[1, 3, 1]), ones(&[1]).multiply(-1.0).unwrap());
    let (b, c) = (ones(&[1, 3, 1, 4]), ones(&[1, 3, 1, 4]));
    let ssd_state = Array::zeros(&[1, 1, 4, 4], Dtype::F32).unwrap();
    vec![
        (
            "softmax_last_axis",
            softmax_last_axis(&x).unwrap().is_some(),
        ),
        (
            "gated_activation",
            gated_activation(Gate::Silu, &x, &x).unwrap().is_some(),
        ),
        (
            "gated_delta_scan",
            gated_delta_scan(&q, &q, &v, &g, &beta, &state)
                .unwrap()
                .is_some(),
        ),
        (
            "ssd_scan",
            ssd_scan(&v, &dt, &a, &b, &c, &ssd_state).unwrap().is_some(),
        ),
        (
            "packed_matvec",
            QuantSpec::affine(32, 4).has_packed_cpu_matvec(),
        ),
    ]
}

#[test]
fn set_aside_every_primitive_declines_and_says_so() {
    let _switch = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    set_cpu_primitives(false);
    let ran = primitives_that_ran();
    let paths = cpu_primitive_paths();
    set_cpu_primitives(true);
    for (name, ran) in ran {
        assert!(
            !ran,
            "{name} built a node with the CPU primitives set aside"
        );
    }
    assert_eq!(paths.len(), 9, "one line per primitive: {paths:?}");
    for (name, path) in paths {
        assert!(path.starts_with("MLX's op"), "{name}: {path}");
    }
}

/// On x86-64 every primitive runs when allowed; elsewhere the x86-only kernels stand aside
/// and the compiled loops run.
#[test]
fn allowed_primitives_run_where_their_kernel_suits_the_cpu() {
    let _switch = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    set_cpu_primitives(true);
    let x86 = cfg!(target_arch = "x86_64");
    for (name, ran) in primitives_that_ran() {
        let compiled_loop = matches!(name, "gated_delta_scan" | "ssd_scan");
        assert_eq!(ran, x86 || compiled_loop, "{name}");
    }
    for (name, path) in cpu_primitive_paths() {
        assert!(!path.contains("GPU"), "{name}: {path}");
    }
}

/// The fused ops that fall back inside give MLX's own result on the GPU's path.
#[test]
fn fused_norm_and_rope_fall_back_to_the_same_values() {
    let _switch = SWITCH.lock().unwrap_or_else(|p| p.into_inner());
    let x = Array::arange(0.0, 64.0, 1.0, Dtype::F32)
        .unwrap()
        .reshape(&[1, 2, 4, 8])
        .unwrap()
        .multiply(0.1)
        .unwrap();
    let both = |enabled: bool| {
        set_cpu_primitives(enabled);
        let norm = mlx::fast::rms_norm(&x, None, 1e-5)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let rope = mlx::fast::rope(
            &x,
            8,
            false,
            mlx::fast::RopeFrequencies::Base(10000.0),
            1.0,
            mlx::fast::RopeOffset::Scalar(3),
        )
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
        (norm, rope)
    };
    let (ours, theirs) = (both(true), both(false));
    set_cpu_primitives(true);
    for (a, b) in ours
        .0
        .iter()
        .zip(&theirs.0)
        .chain(ours.1.iter().zip(&theirs.1))
    {
        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
    }
}
