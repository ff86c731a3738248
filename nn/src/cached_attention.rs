//! Attention of each row of a batch over its own cache: the step every attention layer takes,
//! whatever the family.
//!
//! Rows share the projections around attention (one matrix product for the whole batch) while
//! each attends only to its own history, at its own position.

use kvcache::{AttentionMaskOwned, KvHistory, LayerCache, LogicalMask};
use mlx::Array;
use mlx::fast::{RopeOffset, RowHistory};

use crate::attention::{Attention, Projected};
use crate::model::Batch;
use crate::sdpa::ScaledDotProduct;
use crate::{Error, Result};

/// Where each row of a batch starts, in the forms rotary embeddings take.
pub struct BatchPositions {
    first: i32,
    per_row: Option<Array>,
}

impl BatchPositions {
    /// The positions of `batch`'s rows.
    pub fn new(batch: &Batch) -> Result<BatchPositions> {
        let offsets = batch
            .positions
            .iter()
            .map(|&p| {
                i32::try_from(p)
                    .map_err(|_| Error::InvalidInput(format!("position {p} is too large")))
            })
            .collect::<Result<Vec<i32>>>()?;
        let Some(&first) = offsets.first() else {
            return Err(Error::InvalidInput(
                "a forward needs at least one row".into(),
            ));
        };
        // One row keeps the scalar offset, the form every single-sequence forward used.
        let per_row = match offsets.len() {
            1 => None,
            rows => Some(Array::from_slice(&offsets, &[rows as i32])?),
        };
        Ok(BatchPositions { first, per_row })
    }

    /// The offset rotary embeddings take.
    pub fn rope(&self) -> RopeOffset<'_> {
        match &self.per_row {
            Some(offsets) => RopeOffset::PerRow(offsets),
            None => RopeOffset::Scalar(self.first),
        }
    }
}

/// Checks that there is one cache set per row of `batch`, each with a slot per layer.
pub fn check_cache_sets(
    batch: &Batch,
    caches: &[&mut [Option<LayerCache>]],
    layers: usize,
) -> Result<()> {
    let rows = batch.row_count();
    if caches.len() != rows {
        return Err(Error::InvalidInput(format!(
            "{} cache sets for a batch of {rows} rows",
            caches.len()
        )));
    }
    for (row, set) in caches.iter().enumerate() {
        if set.len() != layers {
            return Err(Error::InvalidInput(format!(
                "row {row} has {} caches for {layers} layers",
                set.len()
            )));
        }
    }
    Ok(())
}

/// Layer `layer`'s attention for every row of a batch whose rows start at `positions`: appends
/// each row's keys and values to its cache, attends each row over its own history under
/// `logical`, and projects the heads back (`[rows, tokens, dim]`, through the output gate when
/// the block has one).
pub fn attend_cached(
    attention: &Attention,
    projected: &Projected,
    caches: &mut [&mut [Option<LayerCache>]],
    layer: usize,
    positions: &[usize],
    logical: LogicalMask,
) -> Result<Array> {
    let heads = attend_cached_heads(
        attention.kernel(),
        &projected.queries,
        (&projected.keys, &projected.values),
        caches,
        layer,
        positions,
        logical,
    )?;
    attention.output(&heads, projected.gate.as_ref())
}

/// Like [`attend_cached`] for blocks that project their own queries, keys and values
/// (`[rows, heads, tokens, d]`, `[rows, kv_heads, tokens, d]`, `[rows, kv_heads, tokens, d_v]`),
/// such as multi-head latent attention: the attended heads, `[rows, heads, tokens, d_v]`.
pub fn attend_cached_heads(
    kernel: &ScaledDotProduct,
    queries: &Array,
    keys_values: (&Array, &Array),
    caches: &mut [&mut [Option<LayerCache>]],
    layer: usize,
    positions: &[usize],
    logical: LogicalMask,
) -> Result<Array> {
    let tokens = queries.dim(2)?;
    let histories = append_to_caches(
        keys_values,
        caches,
        layer,
        positions,
        tokens as usize,
        logical,
    )?;
    attend_histories(kernel, queries, &histories)
}

/// Every row's history after one layer's forward, with the mask its new tokens see: what a
/// later layer that shares this layer's keys and values (Gemma 4) attends over.
pub struct RowHistories(Vec<(KvHistory, AttentionMaskOwned)>);

/// Appends each row's new keys and values (`[rows, kv_heads, tokens, d]`) to its cache for
/// layer `layer`, and returns every row's history as `tokens` new queries under `logical` see
/// it.
pub fn append_to_caches(
    (keys, values): (&Array, &Array),
    caches: &mut [&mut [Option<LayerCache>]],
    layer: usize,
    positions: &[usize],
    tokens: usize,
    logical: LogicalMask,
) -> Result<RowHistories> {
    let rows = positions.len();
    let mut histories = Vec::with_capacity(rows);
    for (row, set) in caches.iter_mut().enumerate() {
        let cache = set[layer]
            .as_mut()
            .ok_or_else(|| Error::InvalidInput("an attention layer has no cache".into()))?;
        let position = positions[row];
        if cache.offset() != position {
            return Err(Error::InvalidInput(format!(
                "row {row}: cache holds {} positions but the batch starts at {position}",
                cache.offset()
            )));
        }
        let history = cache.update(&pick_row(keys, row, rows)?, &pick_row(values, row, rows)?)?;
        let mask = history.mask.attention_mask(tokens, logical)?;
        histories.push((history, mask));
    }
    Ok(RowHistories(histories))
}

/// Row `row` of a `[rows, …]` array (the array itself when it has one row).
pub fn pick_row(a: &Array, row: usize, rows: usize) -> Result<Array> {
    if rows == 1 {
        Ok(a.clone())
    } else {
        Ok(a.slice_axis(0, row as i32, row as i32 + 1)?)
    }
}

/// Attention of every row's queries over its own history: one op for all rows whose mask is
/// "every column" or causal (every decode step, and prompt chunks over full-attention caches),
/// MLX's attention for a row that needs a mask array. Which path a row takes depends on that
/// row alone, so its result does not depend on the batch.
pub fn attend_histories(
    kernel: &ScaledDotProduct,
    queries: &Array,
    histories: &RowHistories,
) -> Result<Array> {
    let histories = &histories.0;
    let rows = histories.len();
    let all: Option<Vec<RowHistory<'_>>> = histories.iter().map(row_history).collect();
    if let Some(all) = &all
        && let Some(heads) = kernel.attend_rows(queries, all)?
    {
        return Ok(heads);
    }
    // When the kernel declined every row at once (a GPU, another dtype), it declines each too.
    let kernel_declined = all.is_some();
    let mut heads = Vec::with_capacity(rows);
    for (row, entry) in histories.iter().enumerate() {
        let q = pick_row(queries, row, rows)?;
        let fused = match row_history(entry) {
            Some(one) if !kernel_declined => kernel.attend_rows(&q, &[one])?,
            _ => None,
        };
        let (history, mask) = entry;
        heads.push(match fused {
            Some(h) => h,
            None => kernel.attend(&q, &history.keys, &history.values, mask.as_mask())?,
        });
    }
    match heads.len() {
        1 => Ok(heads.swap_remove(0)),
        _ => Ok(mlx::concatenate(&heads, 0)?),
    }
}

/// A row's history as [`ScaledDotProduct::attend_rows`] takes it, or `None` when it needs a mask array.
fn row_history((history, mask): &(KvHistory, AttentionMaskOwned)) -> Option<RowHistory<'_>> {
    let causal = match mask {
        AttentionMaskOwned::None => false,
        AttentionMaskOwned::Causal => true,
        AttentionMaskOwned::Array(_) => return None,
    };
    Some(RowHistory {
        keys: &history.keys,
        values: &history.values,
        causal,
    })
}
