//! The k-block form of Q4_K and Q6_K matrices (`shim/kblocks.cc`): made only from affine
//! matrices whose scales factor as a k-quant's, holding exactly their values, and multiplied
//! within f32 rounding of an f64 product, with every row independent of its batch.

mod common;

use half::f16;
use mlx::Array;
use mlx::k_blocks::{KBlocks, KQuant};
use mlx::quantized::{Activations, QuantSpec, Quantized};

use common::{KERNELS, array};

/// A small deterministic generator for integers and f16 scales.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// An f16 in `[lo, hi)`, as f32.
    fn f16_in(&mut self, lo: f32, hi: f32) -> f32 {
        let t = self.below(1 << 20) as f32 / (1 << 20) as f32;
        f16::from_f32(lo + (hi - lo) * t).to_f32()
    }
}

/// A `[out, in]` matrix as the GGUF loader gives a k-quant one: MLX's affine layout with f32
/// scales and biases that are a k-quant's products, and each weight's value as the packed
/// kernels compute it.
struct KMatrix {
    quantized: Quantized,
    values: Vec<f32>,
}

fn k_matrix(kind: KQuant, out: usize, inp: usize, seed: u64) -> KMatrix {
    let mut draw = Draw(seed);
    let (group, bits) = match kind {
        KQuant::Q4K => (32, 4),
        KQuant::Q6K => (16, 8),
    };
    let groups = inp / group;
    let mut scales = vec![0.0f32; out * groups];
    let mut biases = vec![0.0f32; out * groups];
    let mut q = vec![0u32; out * inp];
    let mut values = vec![0.0f32; out * inp];
    for n in 0..out {
        for s in 0..inp / 256 {
            // Super-scales that keep |w| ≤ 1 (63 · 15 · 1e-3, 128 · 32 · 2.4e-4), as the
            // reference's tolerance assumes.
            let d = match kind {
                KQuant::Q4K => draw.f16_in(2e-4, 1e-3),
                KQuant::Q6K => draw.f16_in(2e-5, 2.4e-4),
            };
            let dmin = draw.f16_in(2e-4, 1e-3);
            for g in s * 256 / group..(s + 1) * 256 / group {
                let at = n * groups + g;
                match kind {
                    KQuant::Q4K => {
                        scales[at] = d * draw.below(64) as f32;
                        biases[at] = -(dmin * draw.below(64) as f32);
                    }
                    KQuant::Q6K => {
                        // llama.cpp's quantizer gives each super-block's widest group -128.
                        let sc = if g % 16 == 5 {
                            -128
                        } else {
                            draw.below(255) as i32 - 127
                        };
                        scales[at] = d * sc as f32;
                        biases[at] = -32.0 * scales[at];
                    }
                }
            }
        }
        for k in 0..inp {
            let at = n * groups + k / group;
            let (value, weight) = match kind {
                KQuant::Q4K => {
                    let v = draw.below(16) as u32;
                    (v, (v as f32).mul_add(scales[at], biases[at]))
                }
                KQuant::Q6K => {
                    let v = draw.below(64) as u32;
                    (v, (v as f32 - 32.0) * scales[at])
                }
            };
            q[n * inp + k] = value;
            values[n * inp + k] = weight;
        }
    }
    let per_word = 32 / bits;
    let words: Vec<u32> = q
        .chunks(per_word)
        .map(|chunk| {
            chunk
                .iter()
                .enumerate()
                .fold(0u32, |word, (i, &v)| word | (v << (bits * i)))
        })
        .collect();
    let (out_i, in_i) = (out as i32, inp as i32);
    let quantized = Quantized {
        weights: Array::from_slice(&words, &[out_i, in_i / per_word as i32]).unwrap(),
        scales: Array::from_slice(&scales, &[out_i, (groups) as i32]).unwrap(),
        biases: Some(Array::from_slice(&biases, &[out_i, groups as i32]).unwrap()),
        spec: QuantSpec::affine(group as i32, bits as i32),
    };
    KMatrix { quantized, values }
}

fn blocks(m: &KMatrix) -> KBlocks {
    KBlocks::from_affine(&m.quantized)
        .unwrap()
        .expect("a k-quant's affine form takes the k-block form")
}

/// The form holds the affine form's values exactly: a Q4_K weight is `fma(q, scale, bias)`,
/// a Q6_K one `(q − 32) · scale`, as the packed kernels compute them.
#[test]
fn k_blocks_hold_the_values_of_the_affine_form() {
    let _serial = KERNELS.lock().unwrap_or_else(|e| e.into_inner());
    for kind in [KQuant::Q4K, KQuant::Q6K] {
        let m = k_matrix(kind, 24, 512, 1);
        let b = blocks(&m);
        assert_eq!(b.kind(), kind);
        assert_eq!(b.shape(), [24, 512]);
        assert_eq!(
            b.dequantize().unwrap().to_vec::<f32>().unwrap(),
            m.values,
            "{kind:?}"
        );
        // Lookups of rows, in any shape of ids; an id past the table reads as zeros.
        let ids = Array::from_slice(&[5i32, 0, 23, 24, 7, -1], &[2, 3]).unwrap();
        let rows = b.rows(&ids).unwrap();
        assert_eq!(rows.shape(), vec![2, 3, 512]);
        let rows = rows.to_vec::<f32>().unwrap();
        for (i, id) in [5i64, 0, 23, 24, 7, -1].into_iter().enumerate() {
            let got = &rows[i * 512..(i + 1) * 512];
            if (0..24).contains(&id) {
                let id = id as usize;
                assert_eq!(
                    got,
                    &m.values[id * 512..(id + 1) * 512],
                    "{kind:?} row {id}"
                );
            } else {
                assert!(got.iter().all(|&v| v == 0.0), "{kind:?} id {id}");
            }
        }
    }
}

/// Products equal an f64 product with the same values, for 1 to 40 rows (one pass holds 8),
/// batched and strided inputs, on every instruction set. 200 output rows make 25 bands.
#[test]
fn k_block_products_equal_the_dense_reference() {
    common::each_kernel_level(|_| {
        let (out, inp) = (200usize, 512usize);
        for kind in [KQuant::Q4K, KQuant::Q6K] {
            let m = k_matrix(kind, out, inp, 2);
            let b = blocks(&m);
            let dense_t = common::transpose(&m.values, out, inp);
            for rows in [1, 2, 3, 5, 8, 9, 17, 40] {
                let (xs, x) = array(&[rows, inp as i32], 40 + rows as u64);
                let batched = x.reshape(&[rows, 1, inp as i32]).unwrap();
                let strided = Array::from_slice(
                    &common::transpose(&xs, rows as usize, inp),
                    &[inp as i32, rows],
                )
                .unwrap()
                .transpose(&[1, 0])
                .unwrap();
                let expected = common::matmul(&xs, &dense_t, rows as usize, inp, out);
                for (input, what) in [(&x, "plain"), (&batched, "batched"), (&strided, "strided")] {
                    let got = b.matmul(input).unwrap();
                    assert_eq!(got.size(), rows as usize * out, "{kind:?} {what}");
                    // f32 sums of 512 products of magnitude ≤ 1 in another order than the f64
                    // reference: a random-walk bound of √512 · 2⁻²⁴ · 512 ≈ 6.9e-4.
                    common::assert_close(
                        &got.to_vec::<f32>().unwrap(),
                        &expected,
                        7e-4,
                        &format!("{kind:?}, {rows} rows, {what}"),
                    );
                }
            }
        }
    });
}

/// A row's product depends neither on the rows batched with it nor on the thread count: the
/// engine's batches must give each request what it gets alone.
#[test]
fn k_block_rows_are_independent_of_their_batch_and_the_threads() {
    common::each_kernel_level(|_| {
        let (out, inp) = (1000usize, 768usize);
        let before = mlx::cpu_threads();
        for kind in [KQuant::Q4K, KQuant::Q6K] {
            let b = blocks(&k_matrix(kind, out, inp, 3));
            let (_, x) = array(&[40, inp as i32], 50);
            let together = b.matmul(&x).unwrap().to_vec::<f32>().unwrap();
            for row in [0, 3, 7, 8, 16, 17, 39] {
                let alone = b
                    .matmul(&x.slice_axis(0, row, row + 1).unwrap())
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap();
                let start = row as usize * out;
                assert_eq!(alone, together[start..start + out], "{kind:?}, row {row}");
            }
            for rows in [1, 5, 13] {
                let x = x.slice_axis(0, 0, rows).unwrap();
                let mut results = Vec::new();
                for threads in [1, 3, 2] {
                    assert_eq!(mlx::set_cpu_threads(threads), threads);
                    results.push(b.matmul(&x).unwrap().to_vec::<f32>().unwrap());
                }
                assert_eq!(
                    results[0], results[1],
                    "{kind:?}, {rows} rows, 1 vs 3 threads"
                );
                assert_eq!(
                    results[0], results[2],
                    "{kind:?}, {rows} rows, 1 vs 2 threads"
                );
            }
        }
        mlx::set_cpu_threads(before);
    });
}

/// With activations rounded to bytes, each product lies within the rounding's bound of the
/// exact one, every instruction set gives the same bits, a row's result does not depend on its
/// batch, and a block holding a NaN makes its row's results NaN (and no other row's).
#[test]
fn int8_activation_products_stay_within_the_rounding_bound() {
    let (out, inp) = (200usize, 768usize);
    let supers = inp / 256;
    let rows_tried = [1usize, 2, 3, 5, 8, 9, 17];
    let mut by_level: Vec<Vec<Vec<f32>>> = Vec::new();
    common::each_kernel_level(|_| {
        let mut results = Vec::new();
        for kind in [KQuant::Q4K, KQuant::Q6K] {
            let m = k_matrix(kind, out, inp, 7);
            let b = blocks(&m);
            let biases = m
                .quantized
                .biases
                .as_ref()
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            let group = match kind {
                KQuant::Q4K => 32,
                KQuant::Q6K => 16,
            };
            for &rows in &rows_tried {
                let (mut xs, _) = array(&[rows as i32, inp as i32], 80 + rows as u64);
                // One row far from the others' scale, so that a block's step varies.
                for v in &mut xs[..inp] {
                    *v *= 30.0;
                }
                let x = Array::from_slice(&xs, &[rows as i32, inp as i32]).unwrap();
                let got = b
                    .matmul_with(&x, Activations::Int8)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap();
                for r in 0..rows {
                    let xr = &xs[r * inp..(r + 1) * inp];
                    let steps: Vec<f64> = (0..supers)
                        .map(|s| {
                            let block = &xr[s * 256..(s + 1) * 256];
                            f64::from(block.iter().fold(0.0f32, |a, v| a.max(v.abs()))) / 127.0
                        })
                        .collect();
                    for n in 0..out {
                        let mut exact = 0.0f64;
                        let mut rounding = 0.0f64;
                        let mut magnitude = 0.0f64;
                        for e in 0..inp {
                            let w = f64::from(m.values[n * inp + e]);
                            let bias = f64::from(biases[n * (inp / group) + e / group]);
                            let step = steps[e / 256];
                            exact += w * f64::from(xr[e]);
                            // Each x moves by at most half its block's step.
                            rounding += w.abs() * step / 2.0;
                            // The kernel sums the scaled values and (Q4_K) the biases' part
                            // apart, so f32 rounds relative to both parts' sizes.
                            magnitude +=
                                ((w - bias).abs() + bias.abs()) * (f64::from(xr[e].abs()) + step);
                        }
                        // f32 rounds the steps, each block's integer sum, its factor and
                        // the running sums: fewer than 16 roundings of 2⁻²⁴ at 3 blocks.
                        let bound = rounding + magnitude * 16.0 * f64::from(f32::EPSILON) / 2.0;
                        let value = f64::from(got[r * out + n]);
                        assert!(
                            (value - exact).abs() <= bound,
                            "{kind:?}, {rows} rows, row {r}, output {n}: {value} against \
                             {exact}, bound {bound}"
                        );
                    }
                }
                // Not the f32 product: the rounding is there.
                let f32_result = b.matmul_with(&x, Activations::F32).unwrap();
                assert_ne!(f32_result.to_vec::<f32>().unwrap(), got, "{kind:?}");
                results.push(got);
            }
            // A row alone and within a batch; a NaN in one row's second block.
            let (mut xs, x) = array(&[9, inp as i32], 90);
            let together = b
                .matmul_with(&x, Activations::Int8)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            for row in [0, 4, 8] {
                let alone = b
                    .matmul_with(&x.slice_axis(0, row, row + 1).unwrap(), Activations::Int8)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap();
                let start = row as usize * out;
                assert_eq!(alone, together[start..start + out], "{kind:?}, row {row}");
            }
            xs[3 * inp + 300] = f32::NAN;
            let x = Array::from_slice(&xs, &[9, inp as i32]).unwrap();
            let with_nan = b
                .matmul_with(&x, Activations::Int8)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            for row in 0..9 {
                let got = &with_nan[row * out..(row + 1) * out];
                if row == 3 {
                    assert!(got.iter().all(|v| v.is_nan()), "{kind:?}");
                } else {
                    assert_eq!(got, &together[row * out..(row + 1) * out], "{kind:?}");
                }
            }
        }
        by_level.push(results);
    });
    for level in &by_level[1..] {
        assert!(level == &by_level[0], "the instruction sets disagree");
    }
}

/// Matrices whose values are not a k-quant's keep MLX's layout: MLX's own quantization (free
/// f32 scales), one bias off by an ulp, a shape off the bands, another layout, and the GPU's
/// path, where no MLX op could read the form.
#[test]
fn other_matrices_keep_the_affine_form() {
    let _serial = KERNELS.lock().unwrap_or_else(|e| e.into_inner());
    let (_, w) = array(&[64, 512], 60);
    for spec in [
        QuantSpec::affine(32, 4),
        QuantSpec::affine(32, 8),
        QuantSpec::affine(64, 4),
    ] {
        let q = mlx::quantized::quantize(&w, spec).unwrap();
        assert!(KBlocks::from_affine(&q).unwrap().is_none(), "{spec:?}");
    }

    let mut m = k_matrix(KQuant::Q6K, 16, 256, 4);
    let mut biases = m
        .quantized
        .biases
        .as_ref()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    biases[7] = f32::from_bits(biases[7].to_bits() + 1);
    m.quantized.biases = Some(Array::from_slice(&biases, &[16, 16]).unwrap());
    assert!(KBlocks::from_affine(&m.quantized).unwrap().is_none());

    let m = k_matrix(KQuant::Q4K, 12, 256, 5);
    assert!(
        KBlocks::from_affine(&m.quantized).unwrap().is_none(),
        "12 rows"
    );

    let m = k_matrix(KQuant::Q4K, 16, 256, 6);
    let was = mlx::cpu_primitives_enabled();
    mlx::set_cpu_primitives(false);
    let on_gpu_path = KBlocks::from_affine(&m.quantized).unwrap();
    mlx::set_cpu_primitives(was);
    assert!(on_gpu_path.is_none());
    assert!(KBlocks::from_affine(&m.quantized).unwrap().is_some());
}
