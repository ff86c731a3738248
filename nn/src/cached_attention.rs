//! Attention of each row of a batch over its own cache: the step every attention layer takes,
//! whatever the family.
//!
//! Rows share the projections around attention (one matrix product for the whole batch) while
//! each attends only to its own history, at its own position.

use kvcache::{AttentionMaskOwned, KvHistory, LayerCache, LogicalMask, MaskApplier};
use mlx::fast::{RopeOffset, RowHistory};
use mlx::{Array, Dtype};

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

/// Runs of a batch's new tokens that also attend to each other in both directions, on top of
/// a layer's own rule: Gemma 3's images, whose tokens see the whole image, later tokens as
/// well as earlier ones, while text around them stays causal. One id per new token of each
/// row; tokens sharing an id of 0 or more form a block, -1 marks a token in none.
///
/// A block must lie wholly inside one forward: a later forward's keys do not exist yet, and an
/// earlier forward's queries are not computed again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBlocks {
    rows: Vec<Vec<i32>>,
}

impl TokenBlocks {
    /// The blocks of each row of `ids` (a batch's tokens, row by row): every maximal run of
    /// consecutive tokens for which `member` holds.
    pub fn runs(ids: &[Vec<u32>], member: impl Fn(u32) -> bool) -> TokenBlocks {
        let rows = ids
            .iter()
            .map(|row| {
                let mut next = 0;
                let mut previous = false;
                row.iter()
                    .map(|&id| {
                        let inside = member(id);
                        if inside && !previous {
                            next += 1;
                        }
                        previous = inside;
                        if inside { next - 1 } else { -1 }
                    })
                    .collect()
            })
            .collect();
        TokenBlocks { rows }
    }

    /// Whether no token of any row is in a block.
    pub fn is_empty(&self) -> bool {
        self.rows.iter().flatten().all(|&block| block < 0)
    }
}

/// Like [`attend_cached`], with each row's new tokens in a block also seeing the later tokens
/// of that block.
pub fn attend_cached_blocks(
    attention: &Attention,
    projected: &Projected,
    caches: &mut [&mut [Option<LayerCache>]],
    layer: usize,
    positions: &[usize],
    logical: LogicalMask,
    blocks: &TokenBlocks,
) -> Result<Array> {
    let tokens = projected.queries.dim(2)? as usize;
    if blocks.rows.len() != positions.len() || blocks.rows.iter().any(|r| r.len() != tokens) {
        return Err(Error::InvalidInput(format!(
            "token blocks for {} rows do not fit a batch of {} rows of {tokens} tokens",
            blocks.rows.len(),
            positions.len()
        )));
    }
    let mut histories = append_to_caches(
        (&projected.keys, &projected.values),
        caches,
        layer,
        positions,
        tokens,
        logical,
    )?;
    for (row, (history, mask)) in histories.0.iter_mut().enumerate() {
        if let Some(widened) = widen(mask, &history.mask, positions[row], &blocks.rows[row])? {
            *mask = AttentionMaskOwned::Array(widened);
        }
    }
    let heads = attend_histories(attention.kernel(), &projected.queries, &histories)?;
    attention.output(&heads, projected.gate.as_ref())
}

/// `mask` (over the key columns `columns` describes, for new tokens from position `first`)
/// with each token in a block also seeing the block's later tokens; `None` when it changes
/// nothing. Those keys are new, so no window hides them; keys of earlier forwards are in no
/// block, and the mask already shows each query what it may see of them.
fn widen(
    mask: &AttentionMaskOwned,
    columns: &MaskApplier,
    first: usize,
    blocks: &[i32],
) -> Result<Option<Array>> {
    if blocks.iter().all(|&block| block < 0) {
        return Ok(None);
    }
    let positions = columns.key_positions();
    let key_blocks: Vec<i32> = positions
        .iter()
        .map(|&p| {
            p.checked_sub(first)
                .and_then(|i| blocks.get(i))
                .copied()
                .unwrap_or(-1)
        })
        .collect();
    let index = |p: usize| {
        i32::try_from(p).map_err(|_| Error::InvalidInput(format!("position {p} is too large")))
    };
    let keys = index(positions.len())?;
    let tokens = index(blocks.len())?;
    let kp = Array::from_slice(
        &positions
            .iter()
            .map(|&p| index(p))
            .collect::<Result<Vec<i32>>>()?,
        &[1, keys],
    )?;
    let kb = Array::from_slice(&key_blocks, &[1, keys])?;
    let start = index(first)?;
    let qp = Array::arange(
        f64::from(start),
        f64::from(start) + f64::from(tokens),
        1.0,
        Dtype::I32,
    )?
    .reshape(&[tokens, 1])?;
    let qb = Array::from_slice(blocks, &[tokens, 1])?;
    let later_in_block = qb
        .equal(&kb)?
        .logical_and(&qb.greater_equal(0)?)?
        .logical_and(&kp.greater(&qp)?)?;
    let base = match mask {
        AttentionMaskOwned::None => return Ok(None),
        // MLX's causal mode is used only for columns of consecutive positions ending at the
        // last query, where it is exactly `p <= q`.
        AttentionMaskOwned::Causal => kp.less_equal(&qp)?,
        AttentionMaskOwned::Array(m) => m.clone(),
    };
    Ok(Some(base.logical_or(&later_in_block)?))
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
    let mut row_caches = Vec::with_capacity(caches.len());
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
        row_caches.push(cache);
    }
    // One node writes every row when the caches allow it (see kvcache's `update_rows`).
    let histories = kvcache::update_rows(&mut row_caches, keys, values)?
        .into_iter()
        .map(|history| {
            let mask = history.mask.attention_mask(tokens, logical)?;
            Ok((history, mask))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RowHistories(histories))
}

impl RowHistories {
    /// Every row's history in cache slot `layer` as a query just after the row's cached
    /// positions sees it, without writing: all of a full cache, the last `window` positions of
    /// a sliding-window one ([`LayerCache::view`]). What a drafter that reads its target's
    /// caches (Gemma 4's assistant) attends over. A row whose cache is empty, or is not an
    /// attention cache, is an error naming the row.
    pub fn of_views(
        caches: &[&[Option<LayerCache>]],
        layer: usize,
        window: usize,
    ) -> Result<RowHistories> {
        caches
            .iter()
            .enumerate()
            .map(|(row, set)| {
                let history = set
                    .get(layer)
                    .and_then(Option::as_ref)
                    .map(|cache| cache.view(window))
                    .transpose()?
                    .flatten()
                    .ok_or_else(|| {
                        Error::InvalidInput(format!(
                            "row {row}: cache slot {layer} holds no keys and values to read"
                        ))
                    })?;
                let mask = history.mask.attention_mask(1, LogicalMask::Causal)?;
                Ok((history, mask))
            })
            .collect::<Result<Vec<_>>>()
            .map(RowHistories)
    }
}

/// Row `row` of a `[rows, …]` array (the array itself when it has one row).
pub fn pick_row(a: &Array, row: usize, rows: usize) -> Result<Array> {
    if rows == 1 {
        Ok(a.clone())
    } else {
        Ok(a.slice_axis(0, row as i32, row as i32 + 1)?)
    }
}

/// Attention of every row's queries over its own history: one op for all rows (every decode
/// step and prompt chunk, masks and all), MLX's attention row by row where the kernel does not
/// apply (a GPU, another dtype, sink columns). A batch the kernel declines is retried a row at
/// a time, so which path a row takes depends on that row alone and its result does not depend
/// on the batch.
pub fn attend_histories(
    kernel: &ScaledDotProduct,
    queries: &Array,
    histories: &RowHistories,
) -> Result<Array> {
    let histories = &histories.0;
    let rows = histories.len();
    let all: Vec<RowHistory<'_>> = histories.iter().map(row_history).collect();
    if let Some(heads) = kernel.attend_rows(queries, &all)? {
        return Ok(heads);
    }
    let mut heads = Vec::with_capacity(rows);
    for (row, ((history, mask), one)) in histories.iter().zip(&all).enumerate() {
        let q = pick_row(queries, row, rows)?;
        let fused = match rows {
            1 => None,
            _ => kernel.attend_rows(&q, std::slice::from_ref(one))?,
        };
        heads.push(match fused {
            Some(h) => h,
            None => {
                let (keys, values) = history.floats()?;
                kernel.attend(&q, &keys, &values, mask.as_mask())?
            }
        });
    }
    match heads.len() {
        1 => Ok(heads.swap_remove(0)),
        _ => Ok(mlx::concatenate(&heads, 0)?),
    }
}

/// A row's history as [`ScaledDotProduct::attend_rows`] takes it.
fn row_history((history, mask): &(KvHistory, AttentionMaskOwned)) -> RowHistory<'_> {
    let (causal, allowed) = match mask {
        AttentionMaskOwned::None => (false, None),
        AttentionMaskOwned::Causal => (true, None),
        AttentionMaskOwned::Array(mask) => (false, Some(mask)),
    };
    // An 8-bit cache's rows go to the kernel as stored: it dequantizes them a block at a time.
    RowHistory {
        keys: &history.keys,
        values: &history.values,
        causal,
        allowed,
    }
}
