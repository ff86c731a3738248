//! Putting media features where a prompt's media tokens are: each image (or audio) token's
//! input embedding is replaced by the next row of the features, in prompt order, row by row,
//! as transformers' `masked_scatter` over the token mask does. Families that read images this
//! way (Gemma 3, LLaVA) and audio (Qwen2-Audio) share it.

use mlx::{Array, Dtype};

use crate::model::Batch;
use crate::{Error, Result};

/// A batch's input embeddings with the features in place, and its token ids row by row.
pub(crate) struct Placed {
    /// `[rows, width, hidden]`.
    pub(crate) embedded: Array,
    /// The batch's ids, row-major.
    pub(crate) ids: Vec<u32>,
}

/// What a family's text model needs to place features.
pub(crate) struct MediaTokens {
    /// What the tokens stand for, for errors ("image", "audio").
    pub(crate) kind: &'static str,
    /// The id whose embeddings the features replace.
    pub(crate) token: u32,
    /// The text model's vocabulary: a media id past it is looked up as 0 (as transformers
    /// does), its row replaced either way.
    pub(crate) vocab_size: usize,
    /// The text model's width.
    pub(crate) hidden: i32,
}

/// Embeds `batch.tokens` with `embed` and puts `features` (`[images, tokens_per_image,
/// hidden]`, the images in the order their tokens appear) in place of the image tokens' rows.
/// Fails when the batch's image tokens and the features' rows differ in number, or when the
/// features have another shape.
pub(crate) fn place_image_features(
    batch: &Batch,
    image: &MediaTokens,
    tokens_per_image: i32,
    features: Option<&Array>,
    embed: impl FnOnce(&Array) -> Result<Array>,
) -> Result<Placed> {
    let hidden = image.hidden;
    let rows = match features {
        None => None,
        Some(f) => {
            let s = f.shape();
            if s.len() != 3 || s[1] != tokens_per_image || s[2] != hidden {
                return Err(Error::InvalidInput(format!(
                    "image features of shape {s:?}, expected [images, {tokens_per_image}, \
                     {hidden}]"
                )));
            }
            Some(f.reshape(&[-1, hidden])?)
        }
    };
    place_feature_rows(batch, image, rows.as_ref(), embed)
}

/// Embeds `batch.tokens` with `embed` and puts `features` (`[rows, hidden]`, one row per
/// media token in the order the tokens appear) in their place. Fails when the batch's media
/// tokens and the features' rows differ in number, or when the features have another width.
pub(crate) fn place_feature_rows(
    batch: &Batch,
    media: &MediaTokens,
    features: Option<&Array>,
    embed: impl FnOnce(&Array) -> Result<Array>,
) -> Result<Placed> {
    let (rows, width) = (batch.row_count(), batch.width()?);
    let ids = batch
        .tokens
        .astype(Dtype::I32)?
        .to_vec::<i32>()?
        .into_iter()
        .map(|id| {
            u32::try_from(id)
                .map_err(|_| Error::InvalidInput(format!("token id {id} is out of range")))
        })
        .collect::<Result<Vec<u32>>>()?;
    let (token, kind, hidden) = (media.token, media.kind, media.hidden);
    let media_tokens = ids.iter().filter(|&&id| id == token).count();
    if let Some(f) = features {
        let s = f.shape();
        if s.len() != 2 || s[1] != hidden {
            return Err(Error::InvalidInput(format!(
                "{kind} features of shape {s:?}, expected [rows, {hidden}]"
            )));
        }
    }
    let feature_rows = features.map_or(Ok(0), |f| f.dim(0))? as usize;
    if media_tokens != feature_rows {
        return Err(Error::InvalidInput(format!(
            "{media_tokens} {kind} tokens in the batch for {feature_rows} rows of {kind} features"
        )));
    }
    let lookup = if (token as usize) < media.vocab_size || media_tokens == 0 {
        batch.tokens.clone()
    } else {
        let safe: Vec<i32> = ids
            .iter()
            .map(|&id| if id == token { 0 } else { id as i32 })
            .collect();
        Array::from_slice(&safe, &[rows as i32, width as i32])?
    };
    let mut embedded = embed(&lookup)?;
    if let Some(features) = features.filter(|_| media_tokens > 0) {
        // One gather over the text rows followed by the feature rows: each media token's
        // position takes the next feature row, every other position its own embedding.
        let positions = rows * width;
        let mut next = positions;
        let index = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                let from = if id == token {
                    next += 1;
                    next - 1
                } else {
                    i
                };
                i32::try_from(from)
                    .map_err(|_| Error::InvalidInput(format!("{positions} positions are too many")))
            })
            .collect::<Result<Vec<i32>>>()?;
        let flat = embedded.reshape(&[-1, hidden])?;
        let table = mlx::concatenate(&[flat.clone(), features.astype(flat.dtype())?], 0)?;
        embedded = table
            .take(&Array::from_slice(&index, &[index.len() as i32])?, 0)?
            .reshape(&[rows as i32, width as i32, hidden])?;
    }
    Ok(Placed { embedded, ids })
}
