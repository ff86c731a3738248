//! `fast::rows_attention`: one op attending every row's queries over the row's own history.

mod common;

use common::{array, assert_close};
use mlx::Array;
use mlx::fast::{AttentionMask, RowHistory, rows_attention, scaled_dot_product_attention};

const HEADS: usize = 6;
const KV_HEADS: usize = 2;
/// A buffer longer than any history, so each history is a strided view as a cache hands it.
const CAPACITY: usize = 320;

struct Row {
    /// The whole buffer, `[1, kv_heads, CAPACITY, head_dim]`.
    keys: Vec<f32>,
    values: Vec<f32>,
    len: usize,
}

fn rows(lens: &[usize], head_dim: usize, seed: u64) -> Vec<Row> {
    lens.iter()
        .enumerate()
        .map(|(r, &len)| Row {
            keys: common::values(KV_HEADS * CAPACITY * head_dim, seed + 2 * r as u64),
            values: common::values(KV_HEADS * CAPACITY * head_dim, seed + 2 * r as u64 + 1),
            len,
        })
        .collect()
}

/// Row `r`'s keys and values: the first `len` tokens of its buffer, a view with the buffer's
/// strides.
fn views(row: &Row, head_dim: usize) -> (Array, Array) {
    let shape = [1, KV_HEADS as i32, CAPACITY as i32, head_dim as i32];
    let view = |data: &[f32]| {
        Array::from_slice(data, &shape)
            .unwrap()
            .slice_axis(2, 0, row.len as i32)
            .unwrap()
    };
    (view(&row.keys), view(&row.values))
}

/// The f64 reference: for each row, head and query, softmax over the keys it sees, then the
/// values. With `causal`, query i of `length` sees the first `len - length + i + 1` keys.
fn reference(
    queries: &[f32],
    rows: &[Row],
    length: usize,
    head_dim: usize,
    scale: f64,
    softcap: Option<f64>,
    causal: bool,
) -> Vec<f64> {
    let group = HEADS / KV_HEADS;
    let mut out = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        for h in 0..HEADS {
            for i in 0..length {
                let q = &queries[((r * HEADS + h) * length + i) * head_dim..][..head_dim];
                let at = |data: &[f32], t: usize| {
                    data[((h / group) * CAPACITY + t) * head_dim..][..head_dim].to_vec()
                };
                let visible = if causal {
                    row.len - length + i + 1
                } else {
                    row.len
                };
                let logits: Vec<f64> = (0..visible)
                    .map(|t| {
                        let k = at(&row.keys, t);
                        let s = q
                            .iter()
                            .zip(&k)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                            * scale;
                        softcap.map_or(s, |cap| cap * (s / cap).tanh())
                    })
                    .collect();
                let probs = common::softmax_rows(&logits, visible);
                for d in 0..head_dim {
                    out.push(
                        (0..visible)
                            .map(|t| probs[t] * at(&row.values, t)[d] as f64)
                            .sum(),
                    );
                }
            }
        }
    }
    out
}

fn attend(
    queries: &Array,
    rows: &[Row],
    head_dim: usize,
    softcap: Option<f32>,
    causal: bool,
) -> Array {
    let held: Vec<(Array, Array)> = rows.iter().map(|row| views(row, head_dim)).collect();
    attend_held(queries, &held, softcap, causal)
}

/// [`attend`] over histories already cut (`[1, kv_heads, len, head_dim]` per row).
fn attend_held(
    queries: &Array,
    held: &[(Array, Array)],
    softcap: Option<f32>,
    causal: bool,
) -> Array {
    let history: Vec<RowHistory<'_>> = held
        .iter()
        .map(|(keys, values)| RowHistory {
            keys,
            values,
            causal,
            allowed: None,
        })
        .collect();
    rows_attention(queries, &history, 0.3, softcap)
        .unwrap()
        .expect("the kernel takes f32 and f16 histories on the CPU")
}

/// Rows of different lengths, grouped heads, with and without a soft cap, one query per row
/// (a decode step) and several (a prompt chunk, causal), for a head size the vector kernels
/// take (64) and one they do not (12), against f64. The tolerance: sums of at most 64 f32
/// products of magnitude ≤ 1 and a softmax over ≤ 37 terms, so a few 1e-7 of rounding per
/// step; 1e-5 leaves room for `exp`'s error without hiding a wrong index.
#[test]
fn rows_attention_equals_f64_reference() {
    common::each_kernel_level(|_| {
        for head_dim in [64usize, 80, 12] {
            let lens = [9, 7, 37, 16];
            let rows = rows(&lens, head_dim, 40);
            for (length, causal) in [(1usize, false), (5, true), (7, true)] {
                let (qs, queries) = array(
                    &[
                        lens.len() as i32,
                        HEADS as i32,
                        length as i32,
                        head_dim as i32,
                    ],
                    41,
                );
                for softcap in [None, Some(0.5f32)] {
                    let got = attend(&queries, &rows, head_dim, softcap, causal);
                    assert_eq!(got.shape(), queries.shape());
                    let expected = reference(
                        &qs,
                        &rows,
                        length,
                        head_dim,
                        0.3,
                        softcap.map(f64::from),
                        causal,
                    );
                    assert_close(
                        &got.to_vec::<f32>().unwrap(),
                        &expected,
                        1e-5,
                        &format!("head_dim {head_dim}, {length} queries, softcap {softcap:?}"),
                    );
                }
            }
        }
    });
}

/// The op agrees with MLX's own attention, row by row (what the decoder falls back to), for a
/// decode step and for a causal prompt chunk.
#[test]
fn rows_attention_matches_mlx_attention() {
    common::each_kernel_level(|_| {
        let head_dim = 64;
        let lens = [5, 29];
        let rows = rows(&lens, head_dim, 50);
        for (length, causal, mask) in [
            (1, false, AttentionMask::None),
            (4, true, AttentionMask::Causal),
        ] {
            let (_, queries) = array(&[2, HEADS as i32, length, head_dim as i32], 51);
            let fused = attend(&queries, &rows, head_dim, None, causal)
                .to_vec::<f32>()
                .unwrap();
            for (r, row) in rows.iter().enumerate() {
                let (k, v) = views(row, head_dim);
                let q = queries.slice_axis(0, r as i32, r as i32 + 1).unwrap();
                let mlx = scaled_dot_product_attention(&q, &k, &v, 0.3, mask)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap();
                let expected: Vec<f64> = mlx.iter().map(|&x| f64::from(x)).collect();
                let n = HEADS * length as usize * head_dim;
                assert_close(
                    &fused[r * n..][..n],
                    &expected,
                    1e-5,
                    &format!("row {r}, {length} queries"),
                );
            }
        }
    });
}

/// A boolean mask per row (a sliding window over a ring of slots, a chunked layer): the op
/// agrees with attention spelled out in MLX ops under the same mask, for a decode step and a chunk, with rows
/// of different lengths and soft-capped logits; a query that sees nothing gets zeros.
#[test]
fn rows_attention_applies_a_mask_per_row() {
    common::each_kernel_level(|level| {
        let head_dim = 64;
        let lens = [150usize, 29];
        let rows = rows(&lens, head_dim, 52);
        for length in [1usize, 4] {
            // Row r: query i sees column t when (t + i + r) % 3 != 0, and, in the chunk, its
            // last query sees nothing.
            let masks: Vec<Array> = lens
                .iter()
                .enumerate()
                .map(|(r, &len)| {
                    let bits: Vec<u8> = (0..length)
                        .flat_map(|i| {
                            (0..len).map(move |t| {
                                u8::from((t + i + r) % 3 != 0 && !(length > 1 && i == length - 1))
                            })
                        })
                        .collect();
                    Array::from_slice(&bits, &[length as i32, len as i32])
                        .unwrap()
                        .astype(mlx::Dtype::Bool)
                        .unwrap()
                })
                .collect();
            let held: Vec<(Array, Array)> = rows.iter().map(|row| views(row, head_dim)).collect();
            let history: Vec<RowHistory<'_>> = held
                .iter()
                .zip(&masks)
                .map(|((keys, values), mask)| RowHistory {
                    keys,
                    values,
                    causal: false,
                    allowed: Some(mask),
                })
                .collect();
            let (_, queries) = array(&[2, HEADS as i32, length as i32, head_dim as i32], 53);
            let fused = rows_attention(&queries, &history, 0.3, Some(5.0))
                .unwrap()
                .expect("the kernel takes boolean masks")
                .to_vec::<f32>()
                .unwrap();
            let n = HEADS * length * head_dim;
            for (r, ((k, v), mask)) in held.iter().zip(&masks).enumerate() {
                let q = queries.slice_axis(0, r as i32, r as i32 + 1).unwrap();
                // MLX's soft cap is spelled out: scores, cap, mask, softmax, values.
                let grouped = |a: &Array| {
                    let (kv, group) = (KV_HEADS as i32, (HEADS / KV_HEADS) as i32);
                    let (len, d) = (lens[r] as i32, head_dim as i32);
                    a.expand_dims(&[2])
                        .unwrap()
                        .broadcast_to(&[1, kv, group, len, d])
                        .unwrap()
                        .reshape(&[1, kv * group, len, d])
                        .unwrap()
                };
                let logits = q
                    .multiply(0.3f32)
                    .unwrap()
                    .matmul(&grouped(k).swap_axes(-1, -2).unwrap())
                    .unwrap()
                    .divide(5.0f32)
                    .unwrap()
                    .tanh()
                    .unwrap()
                    .multiply(5.0f32)
                    .unwrap();
                let fused_row = &fused[r * n..][..n];
                let masked_logits = mask.select(&logits, f32::NEG_INFINITY).unwrap();
                let weights = masked_logits.softmax(&[-1], true).unwrap();
                let reference = weights
                    .matmul(&grouped(v))
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap();
                for (j, (a, e)) in fused_row.iter().zip(&reference).enumerate() {
                    let query = (j / head_dim) % length;
                    if length > 1 && query == length - 1 {
                        assert_eq!(*a, 0.0, "a query that sees nothing, at {level:?}");
                    } else {
                        assert!(
                            (a - e).abs() <= 1e-5,
                            "row {r}, element {j}: {a} against {e} at {level:?}"
                        );
                    }
                }
            }
        }
    });
}

/// A row's result is bit-identical alone and in a batch: the engine batches sequences, and a
/// request's output must not depend on the others.
#[test]
fn rows_attention_rows_are_independent() {
    common::each_kernel_level(|_| {
        let head_dim = 64;
        let lens = [3, 33, 12, 1, 20];
        let rows = rows(&lens, head_dim, 60);
        let (_, queries) = array(&[lens.len() as i32, HEADS as i32, 1, head_dim as i32], 61);
        let together = attend(&queries, &rows, head_dim, None, false)
            .to_vec::<f32>()
            .unwrap();
        let n = HEADS * head_dim;
        for (r, row) in rows.iter().enumerate() {
            let q = queries.slice_axis(0, r as i32, r as i32 + 1).unwrap();
            let alone = attend(&q, std::slice::from_ref(row), head_dim, None, false)
                .to_vec::<f32>()
                .unwrap();
            assert_eq!(alone, together[r * n..][..n], "row {r}");
        }
    });
}

/// A prompt chunk is attended in tiles of queries over blocks of keys, yet each query's result
/// is the same bits as when it is attended alone over the keys it sees (as a decode step
/// would): a prompt gives the same numbers whatever chunks it is cut into. 300 keys cross the
/// kernel's 128-key blocks; 21 queries fill two tiles of 8 and part of a third.
#[test]
fn rows_attention_chunk_equals_its_queries_one_at_a_time() {
    common::each_kernel_level(|_| {
        for (head_dim, softcap) in [(64usize, None), (80, Some(5.0)), (12, None)] {
            let (len, length) = (300usize, 21usize);
            let mut rows = rows(&[len], head_dim, 70);
            let (_, queries) = array(&[1, HEADS as i32, length as i32, head_dim as i32], 71);
            let chunk = attend(&queries, &rows, head_dim, softcap, true)
                .to_vec::<f32>()
                .unwrap();
            for i in 0..length {
                let q = queries.slice_axis(2, i as i32, i as i32 + 1).unwrap();
                rows[0].len = len - length + i + 1;
                let alone = attend(&q, &rows, head_dim, softcap, false)
                    .to_vec::<f32>()
                    .unwrap();
                for h in 0..HEADS {
                    let at = (h * length + i) * head_dim;
                    assert_eq!(
                        alone[h * head_dim..][..head_dim],
                        chunk[at..at + head_dim],
                        "head_dim {head_dim}, head {h}, query {i}"
                    );
                }
            }
        }
    });
}

/// The kernel splits its (row, head) pairs over the shim's threads; the result does not depend
/// on how many there are (a request's output must not depend on the machine's core count).
#[test]
fn rows_attention_does_not_depend_on_the_thread_count() {
    common::each_kernel_level(|_| {
        let head_dim = 80; // 64 dimensions in registers and a tail of 16
        let lens = [30, 33, 12, 25, 40, 18];
        let rows = rows(&lens, head_dim, 70);
        let (_, queries) = array(&[lens.len() as i32, HEADS as i32, 8, head_dim as i32], 71);
        let before = mlx::cpu_threads();
        let mut results = Vec::new();
        for threads in [1, 3, 2] {
            assert_eq!(mlx::set_cpu_threads(threads), threads);
            results.push(
                attend(&queries, &rows, head_dim, Some(5.0), true)
                    .to_vec::<f32>()
                    .unwrap(),
            );
        }
        mlx::set_cpu_threads(before);
        assert_eq!(results[0], results[1], "1 thread against 3");
        assert_eq!(results[0], results[2], "1 thread against 2");
    });
}

/// Every history converted to `dtype`.
fn cast(held: &[(Array, Array)], dtype: mlx::Dtype) -> Vec<(Array, Array)> {
    held.iter()
        .map(|(k, v)| (k.astype(dtype).unwrap(), v.astype(dtype).unwrap()))
        .collect()
}

/// An f16 history (a half-precision KV cache) is widened exactly as it is read: attending it
/// gives the same bits as attending an f32 history holding the same rounded values, at every
/// kernel level, for a decode step and a causal chunk, with rows of different lengths.
#[test]
fn rows_attention_reads_f16_histories_exactly() {
    common::each_kernel_level(|level| {
        for (head_dim, length, causal) in [(64usize, 1usize, false), (80, 5, true), (12, 3, true)] {
            let lens = [40usize, 7, 19];
            let rows = rows(&lens, head_dim, 80);
            let (_, queries) = array(
                &[
                    lens.len() as i32,
                    HEADS as i32,
                    length as i32,
                    head_dim as i32,
                ],
                81,
            );
            let views: Vec<(Array, Array)> = rows.iter().map(|r| views(r, head_dim)).collect();
            let half = cast(&views, mlx::Dtype::F16);
            let rounded = cast(&half, mlx::Dtype::F32);
            let run = |held: &[(Array, Array)]| {
                attend_held(&queries, held, None, causal)
                    .to_vec::<f32>()
                    .unwrap()
            };
            let (from_half, from_rounded) = (run(&half), run(&rounded));
            assert_eq!(from_half, from_rounded, "head_dim {head_dim} at {level:?}");
            // The check can fail: the rounding to f16 moves the result.
            assert_ne!(from_half, run(&views), "head_dim {head_dim} at {level:?}");
        }
    });
}

/// `[1, KV_HEADS, CAPACITY, head_dim]` values held as an 8-bit KV cache's byte rows (per token:
/// `head_dim` codes, an f32 scale per 32 codes, an f32 bias per 32), cut to `len` tokens as a
/// cache view is, and the same values as f32 (the same cut). Scales are powers of two and
/// biases multiples of them, so `code · scale + bias` is exact in f32 however it is computed.
fn q8_rows(len: usize, head_dim: usize, seed: u64) -> ((Array, Array), (Array, Array)) {
    let groups = head_dim / 32;
    let width = head_dim + 8 * groups;
    let noise = common::values(2 * KV_HEADS * CAPACITY * (head_dim + 2 * groups), seed);
    let mut noise = noise.iter().map(|x| (x + 1.0) / 2.0);
    let mut tensor = || {
        let (mut bytes, mut floats) = (Vec::new(), Vec::new());
        for _ in 0..KV_HEADS * CAPACITY {
            let codes: Vec<u8> = (0..head_dim)
                .map(|_| (noise.next().unwrap() * 255.0) as u8)
                .collect();
            let params: Vec<(f32, f32)> = (0..groups)
                .map(|_| {
                    let scale = 2f32.powi(-3 - (noise.next().unwrap() * 6.0) as i32);
                    let bias = -scale * (noise.next().unwrap() * 255.0).floor();
                    (scale, bias)
                })
                .collect();
            bytes.extend(&codes);
            bytes.extend(params.iter().flat_map(|(s, _)| s.to_le_bytes()));
            bytes.extend(params.iter().flat_map(|(_, b)| b.to_le_bytes()));
            floats.extend(
                codes
                    .iter()
                    .enumerate()
                    .map(|(d, &c)| c as f32 * params[d / 32].0 + params[d / 32].1),
            );
        }
        let cut = |a: Array| a.slice_axis(2, 0, len as i32).unwrap();
        let (kv, cap) = (KV_HEADS as i32, CAPACITY as i32);
        (
            cut(Array::from_slice(&bytes, &[1, kv, cap, width as i32]).unwrap()),
            cut(Array::from_slice(&floats, &[1, kv, cap, head_dim as i32]).unwrap()),
        )
    };
    let (key_bytes, key_floats) = tensor();
    let (value_bytes, value_floats) = tensor();
    ((key_bytes, value_bytes), (key_floats, value_floats))
}

/// An 8-bit history (`--kv-cache q8`) is dequantized exactly as it is read: attending its byte
/// rows gives the same bits as attending f32 histories of the values they stand for, at every
/// kernel level, for a decode step and causal chunks, rows of different lengths (and longer
/// than a block of keys).
#[test]
fn rows_attention_reads_8_bit_rows_exactly() {
    common::each_kernel_level(|level| {
        for (head_dim, length, causal) in [(64usize, 1usize, false), (96, 5, true), (32, 3, true)] {
            let lens = [300usize, 7, 19];
            let (bytes, floats): (Vec<_>, Vec<_>) = lens
                .iter()
                .enumerate()
                .map(|(r, &len)| q8_rows(len, head_dim, 90 + r as u64))
                .unzip();
            let (_, queries) = array(
                &[
                    lens.len() as i32,
                    HEADS as i32,
                    length as i32,
                    head_dim as i32,
                ],
                91,
            );
            let run = |held: &[(Array, Array)]| {
                attend_held(&queries, held, None, causal)
                    .to_vec::<f32>()
                    .unwrap()
            };
            assert_eq!(
                run(&bytes),
                run(&floats),
                "head_dim {head_dim} at {level:?}"
            );
        }
    });
}

/// Shapes the kernel does not take come back as `None`, for the caller to attend row by row.
#[test]
fn rows_attention_declines_what_it_does_not_take() {
    let (_, keys) = array(&[1, KV_HEADS as i32, 4, 8], 71);
    let row = |causal| RowHistory {
        keys: &keys,
        values: &keys,
        causal,
        allowed: None,
    };
    // More causal queries than the history holds.
    let (_, five) = array(&[1, HEADS as i32, 5, 8], 70);
    assert!(
        rows_attention(&five, &[row(true)], 1.0, None)
            .unwrap()
            .is_none()
    );
    // A history per row is required.
    let (_, two) = array(&[2, HEADS as i32, 1, 8], 72);
    assert!(
        rows_attention(&two, &[row(false)], 1.0, None)
            .unwrap()
            .is_none()
    );
    // Byte rows of heads not a multiple of 32 wide (no 8-bit cache stores them), or of a
    // width that is not 5/4 of the queries'.
    let bytes = Array::zeros(&[1, KV_HEADS as i32, 4, 50], mlx::Dtype::U8).unwrap();
    let (_, forty) = array(&[1, HEADS as i32, 1, 40], 74);
    let (_, thirty_two) = array(&[1, HEADS as i32, 1, 32], 75);
    for queries in [&forty, &thirty_two] {
        let history = RowHistory {
            keys: &bytes,
            values: &bytes,
            causal: false,
            allowed: None,
        };
        assert!(
            rows_attention(queries, &[history], 1.0, None)
                .unwrap()
                .is_none()
        );
    }
    // Heads that do not group.
    let (_, odd) = array(&[1, 5, 1, 8], 73);
    assert!(
        rows_attention(&odd, &[row(false)], 1.0, None)
            .unwrap()
            .is_none()
    );
}
