//! Embeddings from a decoder model: a text's vector is its last token's final hidden state
//! (after the final norm, before the output head) — the model's summary of everything it read.
//! APIs that return unit vectors scale it with [`normalize`]. The text is evaluated in
//! prefill-sized chunks on caches of its own, so it neither reads nor disturbs the prefix
//! cache.

use mlx::Dtype;
use nn::model::{Batch, Model};

use crate::engine::step::{Result, StepError};

/// The row tag of an embedding's caches ([`nn::Batch::row_tags`]): sequence ids count up from
/// 0 and never reach it, and one embedding runs at a time.
const EMBEDDING_TAG: u64 = u64::MAX;

/// The embedding of `tokens` (not normalized), evaluated `chunk` tokens per forward.
pub fn embed(model: &dyn Model, tokens: &[u32], chunk: usize) -> Result<Vec<f32>> {
    if tokens.is_empty() {
        return Err(StepError::Request(
            "nothing to embed: the input is empty".into(),
        ));
    }
    let mut caches = model.new_caches()?;
    let mut hidden = None;
    for (i, piece) in tokens.chunks(chunk.max(1)).enumerate() {
        let batch = Batch::single(piece, i * chunk.max(1))?.with_row_tags(vec![EMBEDDING_TAG])?;
        let forward = model.forward(&batch, &mut caches);
        if forward.is_err() {
            let _ = model.release_rows(&[EMBEDDING_TAG]);
        }
        hidden = Some(forward?.hidden);
    }
    model.release_rows(&[EMBEDDING_TAG])?;
    let hidden = hidden.ok_or_else(|| StepError::Internal("nothing was evaluated".into()))?;
    let last = hidden
        .slice_axis(1, -1, hidden.dim(1)?)?
        .astype(Dtype::F32)?;
    last.eval()?;
    Ok(last.to_vec::<f32>()?)
}

/// Scales `vector` to unit Euclidean length (a zero vector stays zero).
pub fn normalize(vector: &mut [f32]) {
    let norm = vector
        .iter()
        .map(|x| f64::from(*x).powi(2))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        for x in vector.iter_mut() {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
}
