//! `update_rows`: one layer's new keys and values for every row of a batch, each appended to
//! that row's own cache.
//!
//! Row by row, an append is two slices picking the row out of the batch, two slice updates and
//! two slices reading the history back: six graph nodes per row and layer, which at eight rows
//! cost a decode step more than the copying they do. When every row's cache is a full-attention
//! [`KvCache`], or every row's a sliding-window [`RotatingKvCache`] taking one token (a decode
//! step), all stored alike, the rows are written by one node ([`mlx::fast::append_rows`]) that
//! also gives each row's history as a view of its buffer. Anything else (a prompt chunk into a
//! window, mixed storage, a GPU) goes row by row. Either way each row's cache ends up as its
//! own `update` would leave it, bit for bit.

use mlx::Array;

use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::kv_snapshot::KvStore;
use crate::layer::LayerCache;
use crate::mask::KvHistory;
use crate::rotating::RotatingKvCache;
use crate::storage::{KvStorage, stored_as};
use crate::tensor::KvShape;

/// Appends row r of `keys` `[rows, kv_heads, tokens, key_dim]` and `values` `[.., value_dim]`
/// to `caches[r]` (attention kinds) at its offset and returns each row's history, as
/// `caches[r].update` with that row would.
pub fn update_rows(
    caches: &mut [&mut LayerCache],
    keys: &Array,
    values: &Array,
) -> Result<Vec<KvHistory>> {
    let rows = caches.len();
    let batch = keys.shape().first().copied().unwrap_or(0);
    if usize::try_from(batch) != Ok(rows) || values.shape().first() != Some(&batch) {
        return Err(Error::Shape {
            what: "keys and values",
            expected: format!("[{rows}, kv_heads, tokens, dim], a row per cache"),
            found: keys.shape(),
        });
    }
    if rows == 1 {
        return Ok(vec![caches[0].update(keys, values)?]);
    }
    if let Some(histories) = append_together(caches, keys, values)? {
        return Ok(histories);
    }
    caches
        .iter_mut()
        .enumerate()
        .map(|(row, cache)| {
            let r = row as i32;
            cache.update(
                &keys.slice_axis(0, r, r + 1)?,
                &values.slice_axis(0, r, r + 1)?,
            )
        })
        .collect()
}

/// The one-node paths; `None` when they do not apply, with every cache left as it was.
fn append_together(
    caches: &mut [&mut LayerCache],
    keys: &Array,
    values: &Array,
) -> Result<Option<Vec<KvHistory>>> {
    let rows = caches.len();
    let mut kv: Vec<&mut KvCache> = Vec::with_capacity(rows);
    let mut rotating: Vec<&mut RotatingKvCache> = Vec::with_capacity(rows);
    for cache in caches.iter_mut() {
        match &mut **cache {
            LayerCache::Kv(c) => kv.push(c),
            LayerCache::Rotating(c) => rotating.push(c),
            LayerCache::Recurrent(_) => return Ok(None),
        }
    }
    if kv.len() == rows {
        append_kv_rows(&mut kv, keys, values)
    } else if rotating.len() == rows && keys.shape().get(2) == Some(&1) {
        append_rotating_rows(&mut rotating, keys, values)
    } else {
        Ok(None)
    }
}

/// Full-attention caches: `None` when storage differs between rows or the kernel declines.
fn append_kv_rows(
    caches: &mut [&mut KvCache],
    keys: &Array,
    values: &Array,
) -> Result<Option<Vec<KvHistory>>> {
    let Some((keys, values, row_shape, n)) =
        stored_alike(caches.iter().map(|c| c.storage()), keys, values)?
    else {
        return Ok(None);
    };
    let offsets: Vec<usize> = caches.iter().map(|c| c.offset()).collect();
    let lengths: Vec<usize> = offsets.iter().map(|o| o + n).collect();
    let mut stores = Vec::with_capacity(caches.len());
    for (cache, &at) in caches.iter_mut().zip(&offsets) {
        stores.push(cache.prepare_write(at, row_shape, n)?);
    }
    let mut old = Vec::with_capacity(stores.len());
    for store in &mut stores {
        match (store.keys.take(), store.values.take()) {
            (Some(k), Some(v)) => old.push((k, v)),
            _ => {
                put_back(&mut stores, old);
                return Err(Error::Config("KV buffer missing after allocation".into()));
            }
        }
    }
    let appended = match write_rows(&keys, &values, &old, &offsets, &lengths) {
        Ok(Some(appended)) => appended,
        Ok(None) => {
            put_back(&mut stores, old);
            return Ok(None);
        }
        Err(e) => {
            put_back(&mut stores, old);
            return Err(e.into());
        }
    };
    // The old buffers go before anything is evaluated, so that the write can take them over.
    drop(old);
    let mlx::fast::AppendedRows {
        key_buffers,
        value_buffers,
        key_history,
        value_history,
    } = appended;
    for ((store, k), v) in stores.iter_mut().zip(key_buffers).zip(value_buffers) {
        store.keys = Some(k);
        store.values = Some(v);
    }
    drop(stores);
    let histories = caches
        .iter_mut()
        .zip(key_history.into_iter().zip(value_history))
        .map(|(cache, (k, v))| {
            cache.advance(n);
            cache.history_of(k, v)
        })
        .collect();
    Ok(Some(histories))
}

/// Sliding windows taking one token each: `None` when storage differs between rows or the
/// kernel declines.
fn append_rotating_rows(
    caches: &mut [&mut RotatingKvCache],
    keys: &Array,
    values: &Array,
) -> Result<Option<Vec<KvHistory>>> {
    let Some((keys, values, row_shape, _)) =
        stored_alike(caches.iter().map(|c| c.storage()), keys, values)?
    else {
        return Ok(None);
    };
    let (mut slots, mut lengths, mut old) = (Vec::new(), Vec::new(), Vec::new());
    let mut taken = Vec::with_capacity(caches.len());
    for cache in caches.iter_mut() {
        match cache.take_for_decode_write(row_shape) {
            Ok((slot, used, k, v)) => {
                slots.push(slot);
                lengths.push(used);
                old.push((k, v));
                taken.push(cache);
            }
            Err(e) => {
                for (cache, (k, v)) in taken.into_iter().zip(old) {
                    cache.put_buffers(k, v);
                }
                return Err(e);
            }
        }
    }
    let appended = match write_rows(&keys, &values, &old, &slots, &lengths) {
        Ok(Some(appended)) => appended,
        declined_or_failed => {
            for (cache, (k, v)) in taken.into_iter().zip(old) {
                cache.put_buffers(k, v);
            }
            return declined_or_failed.map(|_| None).map_err(Error::from);
        }
    };
    // The old buffers go before anything is evaluated, so that the write can take them over.
    drop(old);
    let mlx::fast::AppendedRows {
        key_buffers,
        value_buffers,
        key_history,
        value_history,
    } = appended;
    let written = key_buffers.into_iter().zip(value_buffers);
    let views = key_history.into_iter().zip(value_history);
    taken
        .into_iter()
        .zip(written.zip(views))
        .map(|(cache, (buffers, views))| cache.finish_decode_write(buffers, views))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// The batch's keys and values in the form every row's cache stores, with one row's shape and
/// the tokens per row; `None` when the rows' caches store differently.
fn stored_alike(
    mut storages: impl Iterator<Item = Option<KvStorage>>,
    keys: &Array,
    values: &Array,
) -> Result<Option<(Array, Array, KvShape, usize)>> {
    let first = storages.next().flatten();
    if storages.any(|storage| storage != first) {
        return Ok(None);
    }
    let (keys, values) = stored_as(first, keys, values)?;
    let (shape, n) = KvShape::of(&keys, &values)?;
    Ok(Some((keys, values, KvShape { batch: 1, ..shape }, n)))
}

/// One node writing row r of `keys`/`values` at `slots[r]` of the rows' `buffers`.
fn write_rows(
    keys: &Array,
    values: &Array,
    buffers: &[(Array, Array)],
    slots: &[usize],
    lengths: &[usize],
) -> mlx::Result<Option<mlx::fast::AppendedRows>> {
    let key_buffers: Vec<&Array> = buffers.iter().map(|(k, _)| k).collect();
    let value_buffers: Vec<&Array> = buffers.iter().map(|(_, v)| v).collect();
    mlx::fast::append_rows(keys, values, &key_buffers, &value_buffers, slots, lengths)
}

/// Returns the buffers taken out of locked stores, unwritten.
fn put_back(stores: &mut [std::sync::MutexGuard<'_, KvStore>], old: Vec<(Array, Array)>) {
    for (store, (k, v)) in stores.iter_mut().zip(old) {
        store.keys = Some(k);
        store.values = Some(v);
    }
}
