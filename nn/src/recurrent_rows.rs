//! The state of recurrent layers (gated delta nets, short convolutions, Mamba mixers) across
//! the rows of a batch: gathered from each row's cache before a forward, stored back after,
//! and forwards split where the prefix cache wants a snapshot.
//!
//! A recurrent state exists only at the end of a forward, so a capture scheduled strictly
//! inside one is reached by running the forward in pieces that end there. The pieces are the
//! same arithmetic token by token, so splitting never changes the outputs.

use kvcache::{LayerCache, RecurrentCache};
use mlx::{Array, Dtype};

use crate::cached_attention::pick_row;
use crate::{Error, Result};

/// Runs `piece` over `x: [rows, tokens, …]` in pieces ending at every capture that any row's
/// cache of `layer` has scheduled strictly inside this forward, and joins the outputs along
/// the tokens.
pub fn split_at_captures(
    x: &Array,
    caches: &mut [&mut [Option<LayerCache>]],
    layer: usize,
    mut piece: impl FnMut(&Array, &mut [&mut [Option<LayerCache>]]) -> Result<Array>,
) -> Result<Array> {
    let tokens = x.dim(1)? as usize;
    let mut cuts = Vec::new();
    for set in caches.iter() {
        let cache = recurrent(&set[layer])?;
        let mut from = cache.offset();
        let end = from + tokens;
        while let Some(at) = cache.next_capture_within(from, end - from) {
            cuts.push(at - cache.offset());
            from = at;
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    cuts.push(tokens);
    let mut outputs = Vec::with_capacity(cuts.len());
    let mut start = 0;
    for stop in cuts {
        let part = if start == 0 && stop == tokens {
            x.clone()
        } else {
            x.slice_axis(1, start as i32, stop as i32)?
        };
        outputs.push(piece(&part, caches)?);
        start = stop;
    }
    match outputs.len() {
        1 => Ok(outputs.swap_remove(0)),
        _ => Ok(mlx::concatenate(&outputs, 1)?),
    }
}

/// Every row's convolution tail of `layer`, `[rows, K − 1, channels]` (zeros for a fresh
/// cache).
pub fn conv_tails(
    caches: &[&mut [Option<LayerCache>]],
    layer: usize,
    dtype: Dtype,
) -> Result<Array> {
    let tails = caches
        .iter()
        .map(|set| Ok(recurrent(&set[layer])?.conv_state_or_zeros(1, dtype)?))
        .collect::<Result<Vec<_>>>()?;
    join_rows(tails)
}

/// Every row's recurrent state of `layer`, `[rows, heads, value_dim, key_dim]` f32 (zeros
/// for a fresh cache).
pub fn recurrent_states(caches: &[&mut [Option<LayerCache>]], layer: usize) -> Result<Array> {
    let states = caches
        .iter()
        .map(|set| Ok(recurrent(&set[layer])?.recurrent_state_or_zeros(1)?))
        .collect::<Result<Vec<_>>>()?;
    join_rows(states)
}

/// Stores each row's new convolution tail (and recurrent state, for layers that have one) in
/// its cache of `layer`, and advances it by `tokens`.
pub fn store(
    caches: &mut [&mut [Option<LayerCache>]],
    layer: usize,
    tail: &Array,
    state: Option<&Array>,
    tokens: usize,
) -> Result<()> {
    let rows = caches.len();
    for (row, set) in caches.iter_mut().enumerate() {
        let cache = recurrent_mut(&mut set[layer])?;
        cache.set_conv_state(&pick_row(tail, row, rows)?)?;
        if let Some(state) = state {
            cache.set_recurrent_state(&pick_row(state, row, rows)?)?;
        }
        cache.advance(tokens)?;
    }
    Ok(())
}

fn recurrent(slot: &Option<LayerCache>) -> Result<&RecurrentCache> {
    match slot {
        Some(LayerCache::Recurrent(cache)) => Ok(cache),
        _ => Err(Error::InvalidInput(
            "a recurrent layer needs a recurrent cache".into(),
        )),
    }
}

fn recurrent_mut(slot: &mut Option<LayerCache>) -> Result<&mut RecurrentCache> {
    match slot {
        Some(LayerCache::Recurrent(cache)) => Ok(cache),
        _ => Err(Error::InvalidInput(
            "a recurrent layer needs a recurrent cache".into(),
        )),
    }
}

/// Rows of one array each, stacked along the batch axis.
fn join_rows(mut rows: Vec<Array>) -> Result<Array> {
    match rows.len() {
        1 => Ok(rows.swap_remove(0)),
        _ => Ok(mlx::concatenate(&rows, 0)?),
    }
}
