//! MLX ops against plain-Rust f64 references.
//!
//! Tolerances: f32 results of sums over k terms of values in [-1, 1) carry rounding error of
//! about k · 2⁻²⁴ relative; 1e-4 absolute covers k ≤ 256 with margin and still catches any
//! indexing or formula mistake (those give errors of order 0.1–1).

mod common;

use common::{array, assert_close, matmul, softmax_rows, transpose, values};
use mlx::{Array, Dtype, Error};

#[test]
fn matmul_matches_reference() {
    let (a, xa) = array(&[7, 33], 1);
    let (b, xb) = array(&[33, 5], 2);
    let got = xa.matmul(&xb).unwrap().to_vec::<f32>().unwrap();
    assert_close(&got, &matmul(&a, &b, 7, 33, 5), 1e-5, "matmul");
}

/// One-row products take the `sgemv` route on OpenBLAS builds (`mlx-sys/shim/gemv.cc`); every
/// operand layout MLX hands BLAS must still give the same product.
#[test]
fn single_row_matmul_matches_reference_in_every_layout() {
    let (k, n) = (40, 9);
    let (a, xa) = array(&[1, k], 5);
    let (b, xb) = array(&[k, n], 6);
    let expected = matmul(&a, &b, 1, k as usize, n as usize);
    // B as stored (`[k, n]`) and as the transpose of an `[n, k]` weight, the way `Linear` runs.
    let b_t = Array::from_slice(&transpose(&b, k as usize, n as usize), &[n, k]).unwrap();
    let by_weight = xa.matmul(&b_t.transpose(&[1, 0]).unwrap()).unwrap();
    // A as the transpose of a `[k, 1]` column.
    let a_col = Array::from_slice(&a, &[k, 1]).unwrap();
    let by_column = a_col.transpose(&[1, 0]).unwrap().matmul(&xb).unwrap();
    for (got, what) in [
        (xa.matmul(&xb).unwrap(), "row x matrix"),
        (by_weight, "row x transposed weight"),
        (by_column, "transposed column x matrix"),
    ] {
        assert_eq!(got.shape(), vec![1, n], "{what}");
        assert_close(&got.to_vec::<f32>().unwrap(), &expected, 1e-5, what);
    }
}

#[test]
fn batched_matmul_broadcasts() {
    let (a, xa) = array(&[3, 4, 6], 3);
    let (b, xb) = array(&[6, 2], 4);
    let got = xa.matmul(&xb).unwrap();
    assert_eq!(got.shape(), vec![3, 4, 2]);
    let got = got.to_vec::<f32>().unwrap();
    let expected: Vec<f64> = a.chunks(24).flat_map(|m| matmul(m, &b, 4, 6, 2)).collect();
    assert_close(&got, &expected, 1e-5, "batched matmul");
}

#[test]
fn shape_mismatch_is_an_error_with_mlx_message() {
    let (_, a) = array(&[2, 3], 5);
    let (_, b) = array(&[4, 5], 6);
    match a.matmul(&b) {
        Err(Error::Mlx(message)) => assert!(
            message.contains("matmul") && message.contains("(2,3)") && message.contains("(4,5)"),
            "unexpected message: {message}"
        ),
        other => panic!("expected an MLX error, got {other:?}"),
    }
    // The process is still usable after the exception.
    assert_eq!(a.sum(&[0, 1], false).unwrap().shape(), Vec::<i32>::new());
}

#[test]
fn constructor_checks_length_against_shape() {
    let err = Array::from_slice(&[1.0f32, 2.0, 3.0], &[2, 2]).unwrap_err();
    assert_eq!(
        err,
        Error::ShapeMismatch {
            shape: vec![2, 2],
            expected: 4,
            len: 3
        }
    );
    assert_eq!(
        err.to_string(),
        "3 elements do not fill shape [2, 2] (4 elements)"
    );
    assert!(Array::from_slice(&[1.0f32], &[-1]).is_err());
}

#[test]
fn typed_reads_require_the_exact_dtype() {
    let a = Array::from_slice(&[1i32, 2, 3], &[3]).unwrap();
    assert_eq!(a.to_vec::<i32>().unwrap(), vec![1, 2, 3]);
    assert_eq!(
        a.to_vec::<f32>().unwrap_err(),
        Error::DtypeMismatch {
            expected: Dtype::F32,
            found: Dtype::I32
        }
    );
    let h = Array::from_slice(&[half::bf16::from_f32(1.5)], &[1]).unwrap();
    assert_eq!(h.item::<half::bf16>().unwrap().to_f32(), 1.5);
    let f = Array::from_slice(&[half::f16::from_f32(-2.0)], &[1]).unwrap();
    assert_eq!(f.astype(Dtype::F32).unwrap().item::<f32>().unwrap(), -2.0);
    let u = Array::from_slice(&[7u32, 8], &[2]).unwrap();
    assert_eq!(u.to_vec::<u32>().unwrap(), vec![7, 8]);
    let bytes = Array::from_slice(&[250u8], &[1]).unwrap();
    assert_eq!(bytes.item::<u8>().unwrap(), 250);
    let mask = Array::from_bools(&[true, false, true], &[3]).unwrap();
    assert_eq!(mask.to_bools().unwrap(), vec![true, false, true]);
}

#[test]
fn strided_reads_return_logical_order() {
    let data: Vec<f32> = (0..24).map(|v| v as f32).collect();
    let a = Array::from_slice(&data, &[2, 3, 4]).unwrap();
    let t = a.transpose(&[2, 0, 1]).unwrap();
    let got = t.to_vec::<f32>().unwrap();
    let mut expected = Vec::new();
    for k in 0..4 {
        for i in 0..2 {
            for j in 0..3 {
                expected.push((i * 12 + j * 4 + k) as f32);
            }
        }
    }
    assert_eq!(got, expected);
    let stepped = a
        .slice(&mlx::SliceSpec {
            start: vec![0, 0, 1],
            stop: vec![2, 3, 4],
            strides: vec![1, 2, 2],
        })
        .unwrap();
    assert_eq!(
        stepped.to_vec::<f32>().unwrap(),
        vec![1.0, 3.0, 9.0, 11.0, 13.0, 15.0, 21.0, 23.0]
    );
    let broadcast = Array::from_slice(&[1.0f32, 2.0], &[2, 1])
        .unwrap()
        .broadcast_to(&[2, 3])
        .unwrap();
    assert_eq!(
        broadcast.to_vec::<f32>().unwrap(),
        vec![1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    );
}

#[test]
fn softmax_and_logsumexp_match_reference() {
    let (x, a) = array(&[4, 9], 7);
    let scaled: Vec<f64> = x.iter().map(|v| *v as f64 * 8.0).collect();
    let a = a.multiply(8.0).unwrap();
    let got = a.softmax(&[-1], false).unwrap().to_vec::<f32>().unwrap();
    assert_close(&got, &softmax_rows(&scaled, 9), 1e-6, "softmax");
    let lse = a.logsumexp(&[-1], false).unwrap().to_vec::<f32>().unwrap();
    let expected: Vec<f64> = scaled
        .chunks(9)
        .map(|r| r.iter().map(|v| v.exp()).sum::<f64>().ln())
        .collect();
    assert_close(&lse, &expected, 1e-5, "logsumexp");
}

#[test]
fn rms_norm_matches_reference() {
    let (x, a) = array(&[3, 16], 8);
    let (w, wa) = array(&[16], 9);
    let eps = 1e-5;
    let got = mlx::fast::rms_norm(&a, Some(&wa), eps)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let expected: Vec<f64> = x
        .chunks(16)
        .flat_map(|row| {
            let ms = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / 16.0;
            let inv = 1.0 / (ms + eps as f64).sqrt();
            row.iter()
                .zip(&w)
                .map(move |(v, w)| *v as f64 * inv * *w as f64)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_close(&got, &expected, 1e-5, "rms_norm");
}

/// Reference rotary embedding on `[B, H, L, D]` with positions `offset_b + l`.
fn rope_reference(
    x: &[f32],
    shape: [usize; 4],
    dims: usize,
    traditional: bool,
    base: f64,
    offsets: &[usize],
) -> Vec<f64> {
    let [b, h, l, d] = shape;
    let mut out: Vec<f64> = x.iter().map(|v| *v as f64).collect();
    let half = dims / 2;
    for (bi, offset) in offsets.iter().enumerate().take(b) {
        for hi in 0..h {
            for li in 0..l {
                let pos = (offset + li) as f64;
                let row = ((bi * h + hi) * l + li) * d;
                for i in 0..half {
                    let theta = pos * base.powf(-2.0 * i as f64 / dims as f64);
                    let (i0, i1) = if traditional {
                        (2 * i, 2 * i + 1)
                    } else {
                        (i, i + half)
                    };
                    let x0 = x[row + i0] as f64;
                    let x1 = x[row + i1] as f64;
                    out[row + i0] = x0 * theta.cos() - x1 * theta.sin();
                    out[row + i1] = x0 * theta.sin() + x1 * theta.cos();
                }
            }
        }
    }
    out
}

#[test]
fn rope_matches_reference_scalar_and_per_row_offsets() {
    use mlx::fast::{RopeFrequencies, RopeOffset, rope};
    let shape = [2usize, 3, 5, 16];
    let (x, a) = array(&[2, 3, 5, 16], 10);
    for traditional in [false, true] {
        for dims in [16, 8] {
            let got = rope(
                &a,
                dims as i32,
                traditional,
                RopeFrequencies::Base(10000.0),
                1.0,
                RopeOffset::Scalar(7),
            )
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
            let expected = rope_reference(&x, shape, dims, traditional, 10000.0, &[7, 7]);
            assert_close(
                &got,
                &expected,
                1e-4,
                &format!("rope scalar traditional={traditional} dims={dims}"),
            );

            let offsets = Array::from_slice(&[3i32, 11], &[2]).unwrap();
            let got = rope(
                &a,
                dims as i32,
                traditional,
                RopeFrequencies::Base(10000.0),
                1.0,
                RopeOffset::PerRow(&offsets),
            )
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
            let expected = rope_reference(&x, shape, dims, traditional, 10000.0, &[3, 11]);
            assert_close(
                &got,
                &expected,
                1e-4,
                &format!("rope per-row traditional={traditional} dims={dims}"),
            );
        }
    }
}

#[test]
fn rope_with_custom_frequencies_equals_base() {
    use mlx::fast::{RopeFrequencies, RopeOffset, rope};
    let (_, a) = array(&[1, 2, 4, 8], 11);
    // MLX's custom `freqs` are periods: theta = position / freq.
    let periods: Vec<f32> = (0..4).map(|i| 500f32.powf(2.0 * i as f32 / 8.0)).collect();
    let freqs = Array::from_slice(&periods, &[4]).unwrap();
    let custom = rope(
        &a,
        8,
        false,
        RopeFrequencies::Custom(&freqs),
        1.0,
        RopeOffset::Scalar(2),
    )
    .unwrap();
    let base = rope(
        &a,
        8,
        false,
        RopeFrequencies::Base(500.0),
        1.0,
        RopeOffset::Scalar(2),
    )
    .unwrap();
    let diff = custom
        .subtract(&base)
        .unwrap()
        .abs()
        .unwrap()
        .max(&[0, 1, 2, 3], false)
        .unwrap();
    assert!(diff.item::<f32>().unwrap() < 1e-5);
}

/// softmax(q kᵀ · scale + mask) v over `[B, H, L, D]` with GQA, in f64.
#[allow(clippy::too_many_arguments)]
fn attention_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    b: usize,
    hq: usize,
    hkv: usize,
    l: usize,
    s: usize,
    d: usize,
    scale: f64,
    allowed: &dyn Fn(usize, usize) -> bool,
) -> Vec<f64> {
    let mut out = vec![0.0; b * hq * l * d];
    let group = hq / hkv;
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / group;
            for i in 0..l {
                let qrow = &q[((bi * hq + h) * l + i) * d..][..d];
                let mut scores = Vec::with_capacity(s);
                for j in 0..s {
                    let krow = &k[((bi * hkv + kh) * s + j) * d..][..d];
                    let dot: f64 = qrow
                        .iter()
                        .zip(krow)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum();
                    scores.push(if allowed(i, j) {
                        dot * scale
                    } else {
                        f64::NEG_INFINITY
                    });
                }
                let probs = softmax_rows(&scores, s);
                for (j, p) in probs.iter().enumerate() {
                    let vrow = &v[((bi * hkv + kh) * s + j) * d..][..d];
                    for c in 0..d {
                        out[((bi * hq + h) * l + i) * d + c] += p * vrow[c] as f64;
                    }
                }
            }
        }
    }
    out
}

#[test]
fn attention_matches_reference_causal_masked_and_gqa() {
    use mlx::fast::{AttentionMask, scaled_dot_product_attention as sdpa};
    let (b, hq, hkv, l, s, d) = (2, 6, 2, 4, 7, 8);
    let (q, qa) = array(&[b as i32, hq as i32, l as i32, d as i32], 12);
    let (k, ka) = array(&[b as i32, hkv as i32, s as i32, d as i32], 13);
    let (v, va) = array(&[b as i32, hkv as i32, s as i32, d as i32], 14);
    let scale = 1.0 / (d as f64).sqrt();

    let got = sdpa(&qa, &ka, &va, scale as f32, AttentionMask::None)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let expected = attention_reference(&q, &k, &v, b, hq, hkv, l, s, d, scale, &|_, _| true);
    assert_close(&got, &expected, 1e-5, "sdpa unmasked");

    // Causal with more keys than queries: query i sits at position s - l + i.
    let got = sdpa(&qa, &ka, &va, scale as f32, AttentionMask::Causal)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let expected = attention_reference(&q, &k, &v, b, hq, hkv, l, s, d, scale, &|i, j| {
        j <= s - l + i
    });
    assert_close(&got, &expected, 1e-5, "sdpa causal");

    // An explicit boolean mask: a sliding window of 3 keys.
    let allowed = |i: usize, j: usize| j <= s - l + i && j + 3 > s - l + i;
    let bits: Vec<bool> = (0..l)
        .flat_map(|i| (0..s).map(move |j| allowed(i, j)))
        .collect();
    let mask = Array::from_bools(&bits, &[l as i32, s as i32]).unwrap();
    let got = sdpa(&qa, &ka, &va, scale as f32, AttentionMask::Array(&mask))
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let expected = attention_reference(&q, &k, &v, b, hq, hkv, l, s, d, scale, &allowed);
    assert_close(&got, &expected, 1e-5, "sdpa boolean mask");

    // The same window as an additive float mask.
    let additive: Vec<f32> = bits
        .iter()
        .map(|&a| if a { 0.0 } else { f32::NEG_INFINITY })
        .collect();
    let mask = Array::from_slice(&additive, &[l as i32, s as i32]).unwrap();
    let got = sdpa(&qa, &ka, &va, scale as f32, AttentionMask::Array(&mask))
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_close(&got, &expected, 1e-5, "sdpa additive mask");
}

#[test]
fn reductions_sorting_and_indexing() {
    let data = vec![3.0f32, -1.0, 7.0, 2.0, 5.0, 0.0];
    let a = Array::from_slice(&data, &[2, 3]).unwrap();
    assert_eq!(
        a.sum(&[1], false).unwrap().to_vec::<f32>().unwrap(),
        vec![9.0, 7.0]
    );
    assert_eq!(
        a.mean(&[0], false).unwrap().to_vec::<f32>().unwrap(),
        vec![2.5, 2.0, 3.5]
    );
    assert_eq!(a.max(&[1], true).unwrap().shape(), vec![2, 1]);
    assert_eq!(
        a.argmax(1, false).unwrap().to_vec::<u32>().unwrap(),
        vec![2, 1]
    );
    assert_eq!(
        a.sort(1).unwrap().to_vec::<f32>().unwrap(),
        vec![-1.0, 3.0, 7.0, 0.0, 2.0, 5.0]
    );
    assert_eq!(
        a.argsort(1).unwrap().to_vec::<u32>().unwrap(),
        vec![1, 0, 2, 2, 0, 1]
    );
    let mut top = a.topk(2, 1).unwrap().to_vec::<f32>().unwrap();
    top[..2].sort_by(f32::total_cmp);
    top[2..].sort_by(f32::total_cmp);
    assert_eq!(top, vec![3.0, 7.0, 2.0, 5.0]);
    let part = a.argpartition(1, 1).unwrap().to_vec::<u32>().unwrap();
    assert_eq!((part[1], part[4]), (0, 0));
    assert_eq!(
        a.cumsum(1, false, true).unwrap().to_vec::<f32>().unwrap(),
        vec![3.0, 2.0, 9.0, 2.0, 7.0, 7.0]
    );
    let idx = Array::from_slice(&[2i32, 0], &[2]).unwrap();
    assert_eq!(
        a.take(&idx, 1).unwrap().to_vec::<f32>().unwrap(),
        vec![7.0, 3.0, 0.0, 2.0]
    );
    let along = Array::from_slice(&[1i32, 2], &[2, 1]).unwrap();
    assert_eq!(
        a.take_along_axis(&along, 1)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![-1.0, 0.0]
    );
    let put = a
        .put_along_axis(
            &along,
            &Array::from_slice(&[9.0f32, 8.0], &[2, 1]).unwrap(),
            1,
        )
        .unwrap();
    assert_eq!(
        put.to_vec::<f32>().unwrap(),
        vec![3.0, 9.0, 7.0, 2.0, 5.0, 8.0]
    );
    let cond = a.greater(2.5).unwrap();
    assert_eq!(
        cond.select(&a, 0.0).unwrap().to_vec::<f32>().unwrap(),
        vec![3.0, 0.0, 7.0, 0.0, 5.0, 0.0]
    );
    let halves = a.split_equal(3, 1).unwrap();
    assert_eq!(halves.len(), 3);
    let joined = mlx::concatenate(&halves, 1).unwrap();
    assert_eq!(joined.to_vec::<f32>().unwrap(), data);
    let stacked = mlx::stack(&[a.clone(), a.clone()], 0).unwrap();
    assert_eq!(stacked.shape(), vec![2, 2, 3]);
}

#[test]
fn slice_update_static_and_dynamic() {
    let base = Array::zeros(&[2, 5], Dtype::F32).unwrap();
    let patch = Array::ones(&[2, 2], Dtype::F32).unwrap();
    let updated = base
        .slice_update(&patch, &mlx::SliceSpec::new(&[0, 1], &[2, 3]))
        .unwrap();
    assert_eq!(
        updated.to_vec::<f32>().unwrap(),
        vec![0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    );
    let start = Array::from_slice(&[3i32], &[1]).unwrap();
    let dynamic = base.slice_update_dynamic(&patch, &start, &[1]).unwrap();
    assert_eq!(
        dynamic.to_vec::<f32>().unwrap(),
        vec![0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    );
    let window = dynamic.slice_dynamic(&start, &[1], &[2, 2]).unwrap();
    assert_eq!(window.to_vec::<f32>().unwrap(), vec![1.0; 4]);
}

#[test]
fn activations_match_formulas() {
    let x: Vec<f32> = values(64, 15).iter().map(|v| v * 4.0).collect();
    let a = Array::from_slice(&x, &[64]).unwrap();
    let silu: Vec<f64> = x
        .iter()
        .map(|&v| v as f64 / (1.0 + (-(v as f64)).exp()))
        .collect();
    assert_close(
        &a.silu().unwrap().to_vec::<f32>().unwrap(),
        &silu,
        1e-5,
        "silu",
    );
    let gelu_tanh: Vec<f64> = x
        .iter()
        .map(|&v| {
            let v = v as f64;
            0.5 * v
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
        })
        .collect();
    assert_close(
        &a.gelu_tanh().unwrap().to_vec::<f32>().unwrap(),
        &gelu_tanh,
        1e-5,
        "gelu_tanh",
    );
    // erf via its relation to the exact GELU: 2·gelu(x)/x − 1 = erf(x/√2).
    let gelu = a.gelu().unwrap().to_vec::<f32>().unwrap();
    let erf = a
        .multiply(std::f32::consts::FRAC_1_SQRT_2)
        .unwrap()
        .erf()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for ((g, e), v) in gelu.iter().zip(&erf).zip(&x) {
        assert!((*g as f64 - 0.5 * *v as f64 * (1.0 + *e as f64)).abs() < 1e-5);
    }
}

/// Prefill-sized products run multi-threaded, on the shim's BLAS threads where OpenBLAS takes
/// its threading callback (`mlx-sys/shim/blas_threads.cc`), and the product is the
/// reference's.
#[test]
fn threaded_matmul_matches_reference_on_our_blas_threads() {
    let (m, k, n) = (192, 256, 160);
    let (a, xa) = array(&[m, k], 11);
    let (b, xb) = array(&[k, n], 12);
    let expected = matmul(&a, &b, m as usize, k as usize, n as usize);
    let before = mlx::blas_parallel_calls();
    let got = xa.matmul(&xb).unwrap().to_vec::<f32>().unwrap();
    assert_close(&got, &expected, 1e-4, "product");
    let two_cores = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
    let own_threads = std::env::var("MLXKIT_BLAS_THREADS").as_deref() != Ok("openblas");
    if mlx::blas_gemv_forwarding() && two_cores && own_threads {
        assert!(
            mlx::blas_parallel_calls() > before,
            "no product ran on the shim's BLAS threads ({})",
            mlx::blas_name()
        );
    }
}
