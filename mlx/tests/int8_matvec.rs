//! The packed CPU kernel's integer path (`mlx-sys/shim/qmv8.cc`): activations quantized to 8
//! bits per block of 32, integer dot products with the packed weights.
//!
//! The matrices are built from known integers, scales and biases, so the references need no
//! dequantization: one f64 product with the activations rounded exactly as the kernel
//! documents (what the kernel must compute, up to f32 summation order), and one with the
//! activations as they are (what the integer path approximates, within the bound that
//! half-step rounding gives).

mod common;

use mlx::quantized::{Activations, QuantSpec, Quantized};
use mlx::{Array, Dtype};

/// A packed affine matrix `[out, inp]` of `bits`-bit integers with its scales and biases, and
/// the integers, scales and biases themselves.
struct Matrix {
    packed: Quantized,
    q: Vec<u32>,
    scales: Vec<f32>,
    biases: Vec<f32>,
}

fn matrix(out: usize, inp: usize, group: usize, bits: u32, seed: u64) -> Matrix {
    let levels = 1u32 << bits;
    let q: Vec<u32> = common::values(out * inp, seed)
        .iter()
        .map(|v| (((v + 1.0) / 2.0 * levels as f32) as u32).min(levels - 1))
        .collect();
    let groups = out * inp / group;
    let scales: Vec<f32> = common::values(groups, seed + 1)
        .iter()
        .map(|v| 0.01 + 0.02 * v.abs())
        .collect();
    let biases: Vec<f32> = common::values(groups, seed + 2)
        .iter()
        .map(|v| 0.1 * v)
        .collect();
    // Little-endian bit streams, row after row, in 32-bit words.
    let mut words = vec![0u32; out * inp * bits as usize / 32];
    for (i, &v) in q.iter().enumerate() {
        let bit = i * bits as usize;
        words[bit / 32] |= v << (bit % 32);
    }
    let per_row = (inp * bits as usize / 32) as i32;
    let packed = Quantized {
        weights: Array::from_slice(&words, &[out as i32, per_row]).unwrap(),
        scales: Array::from_slice(&scales, &[out as i32, (inp / group) as i32]).unwrap(),
        biases: Some(Array::from_slice(&biases, &[out as i32, (inp / group) as i32]).unwrap()),
        spec: QuantSpec::affine(group as i32, bits as i32),
    };
    Matrix {
        packed,
        q,
        scales,
        biases,
    }
}

/// `x` as the kernel rounds it: per block of 32, `scale = max|x| / 127` and each value to the
/// nearest multiple of it (ties to even), `x · (127 / max)` rounded in f32 as the kernel does.
fn rounded(x: &[f32]) -> Vec<f64> {
    x.chunks(32)
        .flat_map(|block| {
            let most = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            let (scale, inverse) = if most > 0.0 {
                (most / 127.0, 127.0 / most)
            } else {
                (0.0, 0.0)
            };
            block.iter().map(move |&v| {
                (v * inverse).round_ties_even().clamp(-127.0, 127.0) as f64 * scale as f64
            })
        })
        .collect()
}

/// The integer 8-bit weights are multiplied from (4-bit ones from 0): the kernel computes
/// `scale · (q - c) · x̂ + (bias + c · scale) · x` with `x̂` the rounded activations.
fn centre(m: &Matrix) -> f64 {
    if m.packed.spec.bits == 8 { 128.0 } else { 0.0 }
}

/// `y = x wᵀ` in f64 as the kernel splits it: the centred weights times `scaled_x` (the
/// activations rounded or exact), the rest of the affine map over the exact `x`.
fn reference(
    m: &Matrix,
    x: &[f32],
    scaled_x: &[f64],
    rows: usize,
    inp: usize,
    group: usize,
) -> Vec<f64> {
    let out = m.q.len() / inp;
    let groups = inp / group;
    let c = centre(m);
    let mut y = vec![0f64; rows * out];
    for r in 0..rows {
        for n in 0..out {
            let mut total = 0f64;
            for k in 0..inp {
                let g = n * groups + k / group;
                let scale = m.scales[g] as f64;
                total += scale * (m.q[n * inp + k] as f64 - c) * scaled_x[r * inp + k];
                total += (m.biases[g] as f64 + c * scale) * x[r * inp + k] as f64;
            }
            y[r * out + n] = total;
        }
    }
    y
}

/// How far the integer path may land from the exact product: every activation moves by at most
/// half its block's step, so output `n` moves by at most `Σ_k scale · |q_k - c| · step_k / 2`.
fn rounding_bound(m: &Matrix, x: &[f32], rows: usize, inp: usize, group: usize) -> Vec<f64> {
    let out = m.q.len() / inp;
    let groups = inp / group;
    let c = centre(m);
    let steps: Vec<f64> = x
        .chunks(32)
        .map(|block| block.iter().fold(0f32, |a, v| a.max(v.abs())) as f64 / 127.0)
        .collect();
    let mut bound = vec![0f64; rows * out];
    for r in 0..rows {
        for n in 0..out {
            bound[r * out + n] = (0..inp)
                .map(|k| {
                    let g = n * groups + k / group;
                    let weight = (m.q[n * inp + k] as f64 - c).abs();
                    m.scales[g] as f64 * weight * steps[(r * inp + k) / 32] / 2.0
                })
                .sum();
        }
    }
    bound
}

/// Activations with the spread of a real layer's input: mostly small, one large channel.
fn activations(rows: usize, inp: usize, seed: u64) -> Vec<f32> {
    let mut x = common::values(rows * inp, seed);
    for r in 0..rows {
        x[r * inp + 7] *= 20.0;
    }
    x
}

/// f32 sums of 256 terms of up to ~10 (the large channel) in another order than the f64
/// reference: a random-walk bound of √256 · 2⁻²⁴ · 256 · 10 ≈ 2.4e-3 for the worst case, 2e-4
/// measured on every layout and level here; 5e-4 leaves room for another compiler's order.
const SUMMATION: f64 = 5e-4;

const LAYOUTS: [(usize, u32); 6] = [(32, 4), (64, 4), (128, 4), (16, 8), (32, 8), (64, 8)];

/// The kernel computes exactly the product it documents (activations rounded per block, the
/// bias term over the exact sums), for every layout, row count and instruction set; and that
/// product stays within the half-step bound of the exact one.
#[test]
fn int8_matvec_computes_the_rounded_product() {
    common::each_kernel_level(|level| {
        let (out, inp) = (200, 256);
        for (group, bits) in LAYOUTS {
            let m = matrix(out, inp, group, bits, 40 + group as u64 + bits as u64);
            for rows in [1, 2, 5, 8, 13, 16] {
                let x = activations(rows, inp, 50 + rows as u64);
                let xa = Array::from_slice(&x, &[rows as i32, inp as i32]).unwrap();
                let got = m
                    .packed
                    .matmul_with(&xa, true, Activations::Int8)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap();
                let what = format!("{level:?}, group {group}, {bits} bits, {rows} rows");
                let expected = reference(&m, &x, &rounded(&x), rows, inp, group);
                common::assert_close(&got, &expected, SUMMATION, &what);
                let exact: Vec<f64> = x.iter().map(|&v| v as f64).collect();
                let exact = reference(&m, &x, &exact, rows, inp, group);
                let bound = rounding_bound(&m, &x, rows, inp, group);
                let mut moved = 0f64;
                for i in 0..got.len() {
                    let err = (got[i] as f64 - exact[i]).abs();
                    assert!(
                        err <= bound[i] + SUMMATION,
                        "{what}: output {i} is {err:e} from the exact product, past the \
                         rounding bound {:e}",
                        bound[i]
                    );
                    moved = moved.max((expected[i] - exact[i]).abs());
                }
                // The rounding is visible at the first check's precision, so that check would
                // tell an f32 kernel from the integer one.
                assert!(
                    moved > 10.0 * SUMMATION,
                    "{what}: rounding moved outputs by {moved:e}"
                );
            }
        }
    });
}

/// A row's product does not depend on the rows it is batched with, nor on the thread count.
#[test]
fn int8_matvec_rows_and_threads_are_independent() {
    common::each_kernel_level(|level| {
        let (out, inp) = (1003, 512);
        let before = mlx::cpu_threads();
        for (group, bits) in [(32, 4), (16, 8), (64, 8)] {
            let m = matrix(out, inp, group, bits, 60);
            let x = activations(13, inp, 61);
            let xa = Array::from_slice(&x, &[13, inp as i32]).unwrap();
            let run = |x: &Array| {
                m.packed
                    .matmul_with(x, true, Activations::Int8)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap()
            };
            mlx::set_cpu_threads(1);
            let together = run(&xa);
            for threads in [2, 3] {
                mlx::set_cpu_threads(threads);
                assert_eq!(
                    run(&xa),
                    together,
                    "{level:?} {group}/{bits}: {threads} threads"
                );
            }
            for row in [0, 4, 12] {
                let alone = run(&xa.slice_axis(0, row, row + 1).unwrap());
                let start = row as usize * out;
                assert_eq!(
                    alone,
                    together[start..start + out],
                    "{level:?} {group}/{bits}: row {row}"
                );
            }
        }
        mlx::set_cpu_threads(before);
    });
}

/// Layouts the integer kernel does not take (rows not a multiple of 32) give the f32 kernel's
/// result, and the process-wide setting picks the precision of products built after it.
#[test]
fn int8_matvec_falls_back_and_follows_the_setting() {
    let _serial = common::KERNELS.lock().unwrap_or_else(|e| e.into_inner());
    let m = matrix(40, 48, 16, 8, 70);
    let x = Array::from_slice(&activations(3, 48, 71), &[3, 48]).unwrap();
    let f32_path = m.packed.matmul_with(&x, true, Activations::F32).unwrap();
    let int8_path = m.packed.matmul_with(&x, true, Activations::Int8).unwrap();
    assert_eq!(
        f32_path.to_vec::<f32>().unwrap(),
        int8_path.to_vec::<f32>().unwrap()
    );

    let m = matrix(40, 64, 32, 4, 72);
    let x = Array::from_slice(&activations(3, 64, 73), &[3, 64]).unwrap();
    let before = mlx::quantized::packed_activations();
    for setting in [Activations::Int8, Activations::F32] {
        mlx::quantized::set_packed_activations(setting);
        assert_eq!(mlx::quantized::packed_activations(), setting);
        let by_setting = m
            .packed
            .matmul(&x, true)
            .unwrap()
            .astype(Dtype::F32)
            .unwrap();
        let chosen = m.packed.matmul_with(&x, true, setting).unwrap();
        assert_eq!(
            by_setting.to_vec::<f32>().unwrap(),
            chosen.to_vec::<f32>().unwrap()
        );
    }
    let f32_result = m.packed.matmul_with(&x, true, Activations::F32).unwrap();
    let int8_result = m.packed.matmul_with(&x, true, Activations::Int8).unwrap();
    assert_ne!(
        f32_result.to_vec::<f32>().unwrap(),
        int8_result.to_vec::<f32>().unwrap()
    );
    mlx::quantized::set_packed_activations(before);
}

/// A NaN among the activations makes every output NaN, as it does in f32, instead of being
/// rounded into an arbitrary integer.
#[test]
fn int8_matvec_keeps_nan_visible() {
    let m = matrix(16, 64, 32, 4, 80);
    let mut x = activations(1, 64, 81);
    x[5] = f32::NAN;
    let x = Array::from_slice(&x, &[1, 64]).unwrap();
    let y = m
        .packed
        .matmul_with(&x, true, Activations::Int8)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert!(y.iter().all(|v| v.is_nan()), "{y:?}");
}
