//! One decode step's attention on the CPU (`mlx-sys/shim/attend.cc`), shaped as SmolLM2-135M's:
//! 30 layers, 9 query heads over 3 key/value heads of 64 dimensions, every row's keys and values
//! a view of the first `history` slots of its own 512-slot buffer (as a cache holds them), for
//! 1 and 8 rows. The layers' buffers are distinct, so a step reads as much memory as the
//! model's does: 8 rows at 192 positions is 71 MB of f32 keys and values.
//!
//! Run `cargo bench -p mlxkit-mlx --bench attention`.
//!
//! Medians, 2026-12-04, a 2-core Xeon VM (AVX-512), one run, at 128 / 192 / 256 positions:
//!
//! | history | 1 row | 8 rows |
//! |---|---|---|
//! | f32 | 0.61 / 0.79 / 0.74 ms | 2.27 / 3.23 / 4.54 ms |
//! | f16 | 0.42 / 0.69 / 0.60 ms | 1.83 / 2.49 / 2.97 ms |
//!
//! Eight f32 rows at 192 positions read 71 MB in 3.2 ms, about 11 GB/s a thread, and half the
//! bytes save a quarter to a third of the time: the step is bound by the bytes it reads more
//! than by its multiply-adds. One row's attention in a layer is cut into parts of at least
//! 2^16 query-key products per dimension (`kMinWorkPerPart` in `attend.cc`): at 192 positions
//! that is one part on one thread and at 256 two, hence 192 slower than 256.

use mlx::fast::{RowHistory, rows_attention};
use mlx::{Array, Dtype, random};

const LAYERS: usize = 30;
const HEADS: i32 = 9;
const KV_HEADS: i32 = 3;
const HEAD_DIM: i32 = 64;
const CAPACITY: i32 = 512;

fn main() {
    divan::main();
}

fn noise(shape: &[i32], seed: u64) -> Array {
    let key = random::key(seed).expect("key");
    let a = random::uniform(shape, Dtype::F32, &key).expect("uniform");
    a.eval().expect("eval");
    a
}

#[divan::bench(args = [1, 8], consts = [128, 192, 256], sample_count = 30)]
fn f32_history<const HISTORY: i32>(bencher: divan::Bencher, rows: i32) {
    decode_step(bencher, rows, HISTORY, Dtype::F32);
}

/// As an `--kv-cache f16` cache stores them: half the bytes, widened as they are read.
#[divan::bench(args = [1, 8], consts = [128, 192, 256], sample_count = 30)]
fn f16_history<const HISTORY: i32>(bencher: divan::Bencher, rows: i32) {
    decode_step(bencher, rows, HISTORY, Dtype::F16);
}

fn decode_step(bencher: divan::Bencher, rows: i32, history: i32, stored: Dtype) {
    let shape = [1, KV_HEADS, CAPACITY, HEAD_DIM];
    // Per layer, per row: (keys, values) buffers.
    let buffers: Vec<Vec<(Array, Array)>> = (0..LAYERS)
        .map(|l| {
            (0..rows)
                .map(|r| {
                    let seed = (l * 64 + r as usize) as u64 * 2;
                    let keys = noise(&shape, seed).astype(stored).expect("astype");
                    let values = noise(&shape, seed + 1).astype(stored).expect("astype");
                    mlx::eval([&keys, &values]).expect("eval");
                    (keys, values)
                })
                .collect()
        })
        .collect();
    let views: Vec<Vec<(Array, Array)>> = buffers
        .iter()
        .map(|layer| {
            layer
                .iter()
                .map(|(k, v)| {
                    (
                        k.slice_axis(2, 0, history).expect("slice"),
                        v.slice_axis(2, 0, history).expect("slice"),
                    )
                })
                .collect()
        })
        .collect();
    let queries = noise(&[rows, HEADS, 1, HEAD_DIM], 7);
    bencher.bench_local(|| {
        let outs: Vec<Array> = views
            .iter()
            .map(|layer| {
                let history: Vec<RowHistory<'_>> = layer
                    .iter()
                    .map(|(keys, values)| RowHistory {
                        keys,
                        values,
                        causal: true,
                        allowed: None,
                    })
                    .collect();
                rows_attention(&queries, &history, 0.125, None)
                    .expect("attention")
                    .expect("the CPU kernel applies")
            })
            .collect();
        mlx::eval(&outs).expect("eval");
    });
}

/// A prompt chunk's attention, one layer of SmolLM2-135M's shape: `CHUNK` queries that are the
/// last positions of a `history`-token causal history, as a long prompt's later chunks attend.
/// Work: 9 heads x CHUNK x (history - CHUNK/2) query-key pairs, 2 x 64 multiply-adds each.
#[divan::bench(consts = [4096, 12288], sample_count = 10)]
fn prefill_chunk<const HISTORY: i32>(bencher: divan::Bencher) {
    const CHUNK: i32 = 512;
    let keys = noise(&[1, KV_HEADS, HISTORY, HEAD_DIM], 11);
    let values = noise(&[1, KV_HEADS, HISTORY, HEAD_DIM], 12);
    let queries = noise(&[1, HEADS, CHUNK, HEAD_DIM], 13);
    bencher.bench_local(|| {
        let history = [RowHistory {
            keys: &keys,
            values: &values,
            causal: true,
            allowed: None,
        }];
        let out = rows_attention(&queries, &history, 0.125, None)
            .expect("attention")
            .expect("the CPU kernel applies");
        out.eval().expect("eval");
    });
}
