//! Putting image features where a prompt's image tokens are: each image token's input
//! embedding is replaced by the next row of its image's features, in prompt order, row by
//! row, as transformers' `masked_scatter` over the image-token mask does. Families that read
//! images this way (Gemma 3, LLaVA) share it.

use mlx::{Array, Dtype};

use crate::model::Batch;
use crate::{Error, Result};

/// A batch's input embeddings with the image features in place, and its token ids row by row.
pub(crate) struct Placed {
    /// `[rows, width, hidden]`.
    pub(crate) embedded: Array,
    /// The batch's ids, row-major.
    pub(crate) ids: Vec<u32>,
}

/// What a family's text model needs to place features.
pub(crate) struct ImageTokens {
    /// The id whose embeddings the features replace.
    pub(crate) image_token: u32,
    /// The text model's vocabulary: an image id past it is looked up as 0 (as transformers
    /// does), its row replaced either way.
    pub(crate) vocab_size: usize,
    /// Rows of features per image.
    pub(crate) tokens_per_image: i32,
    /// The text model's width.
    pub(crate) hidden: i32,
}

/// Embeds `batch.tokens` with `embed` and puts `features` (`[images, tokens_per_image,
/// hidden]`, the images in the order their tokens appear) in place of the image tokens' rows.
/// Fails when the batch's image tokens and the features' rows differ in number, or when the
/// features have another shape.
pub(crate) fn place_image_features(
    batch: &Batch,
    image: &ImageTokens,
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
    let token = image.image_token;
    let image_tokens = ids.iter().filter(|&&id| id == token).count();
    let (tokens, hidden) = (image.tokens_per_image, image.hidden);
    let features = match features {
        None => None,
        Some(f) => {
            let s = f.shape();
            if s.len() != 3 || s[1] != tokens || s[2] != hidden {
                return Err(Error::InvalidInput(format!(
                    "image features of shape {s:?}, expected [images, {tokens}, {hidden}]"
                )));
            }
            Some(f.reshape(&[-1, hidden])?)
        }
    };
    let feature_rows = features.as_ref().map_or(Ok(0), |f| f.dim(0))? as usize;
    if image_tokens != feature_rows {
        return Err(Error::InvalidInput(format!(
            "{image_tokens} image tokens in the batch for {feature_rows} rows of image features"
        )));
    }
    let lookup = if (token as usize) < image.vocab_size || image_tokens == 0 {
        batch.tokens.clone()
    } else {
        let safe: Vec<i32> = ids
            .iter()
            .map(|&id| if id == token { 0 } else { id as i32 })
            .collect();
        Array::from_slice(&safe, &[rows as i32, width as i32])?
    };
    let mut embedded = embed(&lookup)?;
    if let Some(features) = features {
        // One gather over the text rows followed by the feature rows: each image token's
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
