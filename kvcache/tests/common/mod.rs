//! Test data: keys and values that name their token, and a toy recurrent layer.
#![allow(dead_code)]

use kvcache::{RecurrentCache, RecurrentConfig, Result};
use mlx::{Array, Dtype, concatenate};

pub const HEADS: usize = 2;
pub const DIM: usize = 4;

/// The key element for token `id` at `head`, `d`; values are its negation. Exact in f32.
pub fn key_value(id: u32, head: usize, d: usize) -> f32 {
    (id as usize * HEADS * DIM + head * DIM + d) as f32
}

/// Host layout `[1, HEADS, len, DIM]` of the keys of `ids`.
pub fn host_keys(ids: &[u32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(ids.len() * HEADS * DIM);
    for h in 0..HEADS {
        for &id in ids {
            for d in 0..DIM {
                out.push(key_value(id, h, d));
            }
        }
    }
    out
}

/// Keys and values `[1, HEADS, len, DIM]` for tokens `ids`.
pub fn kv(ids: &[u32]) -> (Array, Array) {
    let keys = host_keys(ids);
    let values: Vec<f32> = keys.iter().map(|k| -k).collect();
    let shape = [1, HEADS as i32, ids.len() as i32, DIM as i32];
    (
        Array::from_slice(&keys, &shape).unwrap(),
        Array::from_slice(&values, &shape).unwrap(),
    )
}

/// Asserts `keys`/`values` hold exactly tokens `ids`.
pub fn assert_holds(keys: &Array, values: &Array, ids: &[u32], what: &str) {
    let expected = host_keys(ids);
    assert_eq!(keys.to_vec::<f32>().unwrap(), expected, "{what}: keys");
    let neg: Vec<f32> = expected.iter().map(|k| -k).collect();
    assert_eq!(values.to_vec::<f32>().unwrap(), neg, "{what}: values");
}

pub const RECURRENT: RecurrentConfig = RecurrentConfig {
    conv_tail: 3,
    conv_dim: 2,
    heads: 2,
    value_dim: 2,
    key_dim: 3,
};

/// A toy recurrent layer standing in for a model: the conv tail keeps the last inputs, the
/// state decays by half and adds the token's id. It runs one piece per call and splits its
/// forward at scheduled captures, as a real recurrent layer must.
pub fn recurrent_forward(cache: &mut RecurrentCache, ids: &[u32]) -> Result<()> {
    let mut start = cache.offset();
    let end = start + ids.len();
    while start < end {
        let stop = cache.next_capture_within(start, end - start).unwrap_or(end);
        let piece = &ids[start + ids.len() - end..stop + ids.len() - end];
        run_piece(cache, piece)?;
        cache.advance(stop - start)?;
        start = stop;
    }
    Ok(())
}

fn run_piece(cache: &mut RecurrentCache, piece: &[u32]) -> Result<()> {
    let cfg = cache.config();
    let tail = cache.conv_state_or_zeros(1, Dtype::F32)?;
    let inputs: Vec<f32> = piece
        .iter()
        .flat_map(|&id| (0..cfg.conv_dim).map(move |c| (id as usize * cfg.conv_dim + c) as f32))
        .collect();
    let inputs = Array::from_slice(&inputs, &[1, piece.len() as i32, cfg.conv_dim as i32])?;
    let window = concatenate(&[tail, inputs], 1)?;
    let len = window.dim(1)?;
    // A view of the forward-sized window: the cache must compact it.
    let new_tail = window.slice_axis(1, len - cfg.conv_tail as i32, len)?;
    let mut state = cache.recurrent_state_or_zeros(1)?;
    for &id in piece {
        state = state.multiply(0.5)?.add(id as f32)?;
    }
    cache.set_conv_state(&new_tail)?;
    cache.set_recurrent_state(&state)?;
    Ok(())
}

/// A fresh recurrent cache fed `ids` in one forward.
pub fn recurrent_oracle(ids: &[u32]) -> RecurrentCache {
    let mut cache = RecurrentCache::new(RECURRENT).unwrap();
    if !ids.is_empty() {
        recurrent_forward(&mut cache, ids).unwrap();
    }
    cache
}

/// Both caches hold equal conv tails and states (absent counts as zeros).
pub fn assert_same_recurrent(
    conv: Option<&Array>,
    state: Option<&Array>,
    oracle: &RecurrentCache,
    what: &str,
) {
    let zeros_conv = oracle.conv_state_or_zeros(1, Dtype::F32).unwrap();
    let zeros_state = oracle.recurrent_state_or_zeros(1).unwrap();
    let conv = conv
        .cloned()
        .unwrap_or_else(|| Array::zeros(&zeros_conv.shape(), Dtype::F32).unwrap());
    let state = state
        .cloned()
        .unwrap_or_else(|| Array::zeros(&zeros_state.shape(), Dtype::F32).unwrap());
    assert_eq!(
        conv.to_vec::<f32>().unwrap(),
        zeros_conv.to_vec::<f32>().unwrap(),
        "{what}: conv"
    );
    assert_eq!(
        state.to_vec::<f32>().unwrap(),
        zeros_state.to_vec::<f32>().unwrap(),
        "{what}: state"
    );
}
