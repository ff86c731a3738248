//! Fused kernels: MLX's normalization, rotary embedding and attention, and mlxkit's own CPU
//! kernels for attention over per-row histories and gated activations. On the CPU with f32
//! inputs, RMS norm and rotary embedding run as mlxkit primitives, one graph node each, where
//! the MLX wheel composes them from 8 and about 30 ops.

use mlx_sys::ffi;

use crate::list::to_list;
use crate::{Array, Result};

/// RMS normalization over the last axis, scaled by `weight` when given.
pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array> {
    let w = weight.unwrap_or(x);
    Array::from_raw(ffi::rms_norm(x.raw(), weight.is_some(), w.raw(), eps)?)
}

/// Layer normalization over the last axis, with optional scale and shift.
pub fn layer_norm(
    x: &Array,
    weight: Option<&Array>,
    bias: Option<&Array>,
    eps: f32,
) -> Result<Array> {
    let w = weight.unwrap_or(x);
    let b = bias.unwrap_or(x);
    Array::from_raw(ffi::layer_norm(
        x.raw(),
        weight.is_some(),
        w.raw(),
        bias.is_some(),
        b.raw(),
        eps,
    )?)
}

/// The position of the first row given to [`rope`].
#[derive(Debug, Clone, Copy)]
pub enum RopeOffset<'a> {
    /// One offset for every sequence in the batch.
    Scalar(i32),
    /// One offset per batch row (an int32 array of shape `[batch]`).
    PerRow(&'a Array),
}

/// How rotary frequencies are chosen.
#[derive(Debug, Clone, Copy)]
pub enum RopeFrequencies<'a> {
    /// `base^(-2i/dims)`.
    Base(f32),
    /// Explicit inverse frequencies of length `dims / 2` (llama3, yarn and other scalings).
    Custom(&'a Array),
}

/// Rotary position embedding over the first `dims` features of the last axis of
/// `x: [batch, heads, seq, head_dim]`. `traditional` rotates adjacent pairs `(2i, 2i+1)` instead
/// of the two halves. Positions are multiplied by `scale`.
pub fn rope(
    x: &Array,
    dims: i32,
    traditional: bool,
    frequencies: RopeFrequencies<'_>,
    scale: f32,
    offset: RopeOffset<'_>,
) -> Result<Array> {
    let (has_base, base, has_freqs, freqs) = match frequencies {
        RopeFrequencies::Base(base) => (true, base, false, x),
        RopeFrequencies::Custom(freqs) => (false, 0.0, true, freqs),
    };
    let raw = match offset {
        RopeOffset::Scalar(offset) => ffi::rope(
            x.raw(),
            dims,
            traditional,
            has_base,
            base,
            scale,
            offset,
            has_freqs,
            freqs.raw(),
        )?,
        RopeOffset::PerRow(offsets) => ffi::rope_offsets(
            x.raw(),
            dims,
            traditional,
            has_base,
            base,
            scale,
            offsets.raw(),
            has_freqs,
            freqs.raw(),
        )?,
    };
    Array::from_raw(raw)
}

/// The mask of [`scaled_dot_product_attention`].
#[derive(Debug, Clone, Copy)]
pub enum AttentionMask<'a> {
    /// Every query sees every key.
    None,
    /// Query `i` of `n` sees keys up to `key_len - n + i` (MLX's fused causal path).
    Causal,
    /// A boolean mask (true = attend) or an additive float mask, broadcast to
    /// `[batch, heads, queries, keys]`.
    Array(&'a Array),
}

/// `softmax(q kᵀ · scale + mask) v` for `q: [B, Hq, L, D]`, `k, v: [B, Hkv, S, D]`, with grouped
/// query attention when `Hq` is a multiple of `Hkv`.
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: AttentionMask<'_>,
) -> Result<Array> {
    let (mode, has_mask, mask_array) = match mask {
        AttentionMask::None => ("", false, q),
        AttentionMask::Causal => ("causal", false, q),
        AttentionMask::Array(m) => ("array", true, m),
    };
    Array::from_raw(ffi::scaled_dot_product_attention(
        q.raw(),
        k.raw(),
        v.raw(),
        scale,
        mode,
        has_mask,
        mask_array.raw(),
    )?)
}

/// What one row of [`rows_attention`] attends: its keys and values `[1, kv_heads, len, head_dim]`
/// (f32 or f16, or an 8-bit KV cache's byte rows `[1, kv_heads, len, 5 · head_dim / 4]`: codes,
/// then an f32 scale and an f32 bias per 32 codes) and how its queries see them.
#[derive(Debug, Clone, Copy)]
pub struct RowHistory<'a> {
    /// The row's keys.
    pub keys: &'a Array,
    /// The row's values.
    pub values: &'a Array,
    /// `false`: every query sees every column. `true`: the queries are the last positions of
    /// the history and query i of n sees columns up to `len - n + i` (as
    /// [`AttentionMask::Causal`]).
    pub causal: bool,
    /// A boolean `[queries, len]` mask on top of that, true where query i may see column t (a
    /// sliding window over a ring of slots, a chunked layer). A query that sees no column
    /// gets zeros.
    pub allowed: Option<&'a Array>,
}

/// Attention of each row's queries over the row's own history, in one op: `queries` is
/// `[rows, heads, length, head_dim]` and row r attends `history[r]`. Logits are
/// `q · k · scale`, soft-capped as `cap · tanh(logit / cap)` when `softcap` is set.
///
/// The keys and values are read where they lie (cache views are not copied), one query's
/// scores at a time (no score matrix), and each row's result is independent of the others, bit
/// for bit: a sequence gets the same output alone as in a batch. `None` when the kernel does
/// not apply (a GPU default device, dtypes other than f32, shapes it does not take); attend row
/// by row with [`scaled_dot_product_attention`] then.
pub fn rows_attention(
    queries: &Array,
    history: &[RowHistory<'_>],
    scale: f32,
    softcap: Option<f32>,
) -> Result<Option<Array>> {
    let keys = to_list(history.iter().map(|h| h.keys))?;
    let values = to_list(history.iter().map(|h| h.values))?;
    let causal: Vec<bool> = history.iter().map(|h| h.causal).collect();
    let masked: Vec<bool> = history.iter().map(|h| h.allowed.is_some()).collect();
    let masks = to_list(history.iter().filter_map(|h| h.allowed))?;
    Array::from_raw_optional(ffi::rows_attention(
        queries.raw(),
        &keys,
        &values,
        &causal,
        &masked,
        &masks,
        scale,
        softcap.is_some(),
        softcap.unwrap_or(0.0),
    )?)
}

/// What [`append_rows`] gives back, one entry per row in each list.
#[derive(Debug, Clone)]
pub struct AppendedRows {
    /// Each row's key buffer after the write.
    pub key_buffers: Vec<Array>,
    /// Each row's value buffer after the write.
    pub value_buffers: Vec<Array>,
    /// Each row's keys so far, `[1, heads, length, key_dim]`: a view of its buffer.
    pub key_history: Vec<Array>,
    /// Each row's values so far, a view of its buffer.
    pub value_history: Vec<Array>,
}

/// Writes row r of `keys` `[rows, heads, tokens, key_dim]` and `values` `[.., value_dim]` into
/// slots `offsets[r]..offsets[r] + tokens` of row r's buffers `[1, heads, capacity, dim]`, for
/// every row in one graph node, and returns the buffers after the write with views of their
/// first `lengths[r]` slots (a full cache's `offset + tokens`, a ring's used slots). Each buffer is written in place when nothing else holds
/// it, as [`Array::slice_update`] would be. Buffers and new rows share a dtype, any dtype.
///
/// `None` when the kernel does not apply (a GPU default device, shapes or dtypes that do not
/// match, a write past a buffer's end); write each row with slice updates then.
pub fn append_rows(
    keys: &Array,
    values: &Array,
    key_buffers: &[&Array],
    value_buffers: &[&Array],
    offsets: &[usize],
    lengths: &[usize],
) -> Result<Option<AppendedRows>> {
    let rows = offsets.len();
    let as_i32 = |values: &[usize]| -> Option<Vec<i32>> {
        values.iter().map(|&v| i32::try_from(v).ok()).collect()
    };
    let (Some(offsets), Some(lengths)) = (as_i32(offsets), as_i32(lengths)) else {
        return Ok(None);
    };
    let key_list = to_list(key_buffers.iter().copied())?;
    let value_list = to_list(value_buffers.iter().copied())?;
    let list = ffi::append_rows(
        keys.raw(),
        values.raw(),
        &key_list,
        &value_list,
        &offsets,
        &lengths,
    )?;
    if list.is_null() {
        return Ok(None);
    }
    let mut arrays = crate::list::from_owned_list(list)?;
    if arrays.len() != 4 * rows {
        return Err(crate::Error::Mlx(format!(
            "append rows: expected {} arrays for {rows} rows, got {}",
            4 * rows,
            arrays.len()
        )));
    }
    let value_history = arrays.split_off(3 * rows);
    let key_history = arrays.split_off(2 * rows);
    let value_buffers = arrays.split_off(rows);
    Ok(Some(AppendedRows {
        key_buffers: arrays,
        value_buffers,
        key_history,
        value_history,
    }))
}

/// `softmax(x)` over the last axis on the CPU with a vectorized `exp` (MLX's CPU softmax
/// evaluates `exp` one lane at a time), rows spread over the kernel threads. Relative error a
/// few f32 ulps. `None` when the kernel does not apply (a GPU default device, a dtype other
/// than f32, no elements); use [`Array::softmax`] then.
pub fn softmax_last_axis(x: &Array) -> Result<Option<Array>> {
    Array::from_raw_optional(ffi::softmax_last_axis(x.raw())?)
}

/// The nonlinearity of [`gated_activation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// `x · sigmoid(x)`.
    Silu,
    /// GELU, tanh approximation.
    GeluTanh,
}

/// `act(gate) · up` elementwise on the CPU with a vectorized `exp` (MLX's CPU kernels evaluate
/// `exp` one lane at a time). Relative error a few f32 ulps. `None` when the kernel does not
/// apply (a GPU default device, dtypes other than f32, shapes that differ); use MLX's ops then.
pub fn gated_activation(kind: Gate, gate: &Array, up: &Array) -> Result<Option<Array>> {
    let code = match kind {
        Gate::Silu => 0,
        Gate::GeluTanh => 1,
    };
    Array::from_raw_optional(ffi::gated_activation(code, gate.raw(), up.raw())?)
}

/// The gated delta rule's recurrence over `T` tokens as one CPU kernel: `q`, `k`
/// `[B, T, Hk, Dk]` (already normalized and scaled), `v` `[B, T, Hv, Dv]`, `g` `[B, T, Hv]`
/// (log decay), `beta` `[B, T, Hv]`, `state` `[B, Hv, Dv, Dk]`; each key head serves `Hv / Hk`
/// consecutive value heads. Returns the outputs `[B, T, Hv, Dv]` and the state after the last
/// token, both f32. `None` when the kernel does not apply (a GPU default device, dtypes other
/// than f32, inconsistent shapes); run the recurrence in ops then.
pub fn gated_delta_scan(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: &Array,
) -> Result<Option<(Array, Array)>> {
    let list = ffi::gated_delta_scan(q.raw(), k.raw(), v.raw(), g.raw(), beta.raw(), state.raw())?;
    if list.is_null() {
        return Ok(None);
    }
    let mut arrays = crate::list::from_owned_list(list)?.into_iter();
    match (arrays.next(), arrays.next()) {
        (Some(y), Some(state)) => Ok(Some((y, state))),
        _ => Err(crate::Error::Mlx(
            "gated delta scan: expected outputs and a state".into(),
        )),
    }
}

/// The Mamba-2 selective state space recurrence over `T` tokens as one CPU kernel: `x`
/// `[B, T, H, P]`, `dt` `[B, T, H]` (step sizes), `a` `[H]` (negative decay rates), `b` and `c`
/// `[B, T, G, N]` (each group shared by `H / G` consecutive heads), `state` `[B, H, P, N]`.
/// Returns the outputs `[B, T, H, P]` (without a `D` skip term) and the state after the last
/// token, both f32. `None` when the kernel does not apply (a GPU default device, dtypes other
/// than f32, inconsistent shapes); run the recurrence in ops then.
pub fn ssd_scan(
    x: &Array,
    dt: &Array,
    a: &Array,
    b: &Array,
    c: &Array,
    state: &Array,
) -> Result<Option<(Array, Array)>> {
    let list = ffi::ssd_scan(x.raw(), dt.raw(), a.raw(), b.raw(), c.raw(), state.raw())?;
    if list.is_null() {
        return Ok(None);
    }
    let mut arrays = crate::list::from_owned_list(list)?.into_iter();
    match (arrays.next(), arrays.next()) {
        (Some(y), Some(state)) => Ok(Some((y, state))),
        _ => Err(crate::Error::Mlx(
            "ssd scan: expected outputs and a state".into(),
        )),
    }
}
