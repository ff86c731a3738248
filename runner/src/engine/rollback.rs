//! Rolling a speculative round back to what was accepted.
//!
//! A round feeds `[next, d1..dk]` in one forward and keeps a prefix of it. Attention caches
//! (full and sliding-window) drop the rejected positions. A recurrent layer (a gated delta
//! net, a Mamba mixer, a short convolution) holds a state only at the end of a forward, so
//! before the verification forward it schedules a capture after each of the round's tokens
//! (the model splits that layer's scan at them, the same arithmetic token by token), and
//! rolling back restores the capture where the accepted prefix ends. A layer-skip draft runs
//! the target's own first layers ahead; their recurrent states are saved before it and put
//! back after.

use kvcache::{LayerCache, LayerSnapshot};

use crate::engine::step::StepError;

/// What each layer's recurrent cache captured during a round, by layer (empty for the others).
pub struct RoundCaptures(Vec<Vec<(usize, LayerSnapshot)>>);

/// Schedules, in the recurrent layers of `caches` (a sequence at `start`), a capture after
/// each of the round's `width` tokens.
pub fn capture_round(
    caches: &mut [Option<LayerCache>],
    start: usize,
    width: usize,
) -> Result<(), StepError> {
    let offsets: Vec<usize> = (start + 1..=start + width).collect();
    for cache in caches.iter_mut().flatten() {
        if matches!(cache, LayerCache::Recurrent(_)) {
            cache.schedule_captures(&offsets)?;
        }
    }
    Ok(())
}

/// Takes what the recurrent layers of `caches` captured during the round.
pub fn round_captures(caches: &mut [Option<LayerCache>]) -> RoundCaptures {
    RoundCaptures(
        caches
            .iter_mut()
            .map(|cache| match cache {
                Some(cache @ LayerCache::Recurrent(_)) => cache.take_captures(),
                _ => Vec::new(),
            })
            .collect(),
    )
}

/// Brings every layer of `caches` back to `to` positions: attention caches rewind, recurrent
/// layers restore the state captured there (a layer already at `to` is left as it is).
pub fn rewind_round(
    caches: &mut [Option<LayerCache>],
    captures: &RoundCaptures,
    to: usize,
) -> Result<(), StepError> {
    for (layer, cache) in caches.iter_mut().enumerate() {
        let Some(cache) = cache else { continue };
        if !matches!(cache, LayerCache::Recurrent(_)) {
            cache.rewind(to)?;
            continue;
        }
        if cache.offset() == to {
            continue;
        }
        let snapshot = captures
            .0
            .get(layer)
            .and_then(|taken| taken.iter().find(|(at, _)| *at == to))
            .map(|(_, snapshot)| snapshot)
            .ok_or_else(|| {
                StepError::Internal(format!(
                    "layer {layer} captured no state at position {to} to roll back to"
                ))
            })?;
        cache.restore(snapshot)?;
    }
    Ok(())
}

/// The whole state of the recurrent layers among the first `layers` of `caches`, before a
/// layer-skip draft moves them on.
pub fn save_recurrent(
    caches: &[Option<LayerCache>],
    layers: usize,
) -> Result<Vec<Option<LayerSnapshot>>, StepError> {
    caches
        .iter()
        .take(layers)
        .map(|cache| match cache {
            Some(cache @ LayerCache::Recurrent(_)) => {
                let at = cache.offset();
                Ok(Some(cache.snapshot(at..at)?))
            }
            _ => Ok(None),
        })
        .collect()
}

/// Puts back what [`save_recurrent`] saved; the other layers of the first `saved.len()` rewind
/// to `to`.
pub fn restore_recurrent(
    caches: &mut [Option<LayerCache>],
    saved: &[Option<LayerSnapshot>],
    to: usize,
) -> Result<(), StepError> {
    for (cache, saved) in caches.iter_mut().zip(saved) {
        let Some(cache) = cache else { continue };
        match saved {
            Some(snapshot) => cache.restore(snapshot)?,
            None => cache.rewind(to)?,
        }
    }
    Ok(())
}
