//! Images in a prompt, for a model that reads them: the `[img-N]` tags the request's messages
//! carry (put where each image was sent, see `prompt`) become the model's image layout in the
//! rendered text ([`crate::engine::loader::ImagePrompt::expansion`]), the text is tokenized in
//! one piece as the model's processor does, and each run of image tokens is matched to its
//! image, decoded under [`media::ImageLimits`] and preprocessed for the encoder.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use crate::engine::loader::{ImageLayout, ImagePrompt};
use crate::engine::{EncoderInput, ModelInfo, PromptImage};
use crate::server::error::ApiError;
use crate::server::prompt;

/// The most images one request may carry: each is decoded and preprocessed before the engine
/// sees it (a 64 MiB body of tiny images must not become gigabytes of pixels).
pub const MAX_IMAGES: usize = 32;

/// A rendered text with its `[img-N]` tags expanded and tokenized: the tokens, and for each
/// image's run of image tokens, in prompt order, its range and the index of the image sent.
pub struct Expanded {
    /// Prompt token ids.
    pub tokens: Vec<u32>,
    /// Each image's token range and which of the request's images it is.
    pub images: Vec<(Range<usize>, usize)>,
}

/// Expands the `[img-N]` tags of `text` (N below `images.len()`) into `info`'s image layout
/// and tokenizes the result (adding the model's BOS with `add_special`). Fails when a tag
/// names an image not sent, when a dynamic-resolution model's image has no readable size, or
/// when the text holds the image token itself (typed by a client), which would make its runs
/// mismatch the images.
pub fn expand(
    info: &ModelInfo,
    text: &str,
    images: &[Arc<[u8]>],
    add_special: bool,
) -> Result<Expanded, ApiError> {
    let vision = info.vision.as_ref().ok_or_else(|| not_supported(info))?;
    let segments = media::split_prompt(text, images.len())
        .map_err(|e| ApiError::bad_request(format!("images in the prompt: {e}")))?;
    let mut expanded = String::with_capacity(text.len());
    let mut order = Vec::new();
    let mut layouts: HashMap<usize, (String, usize)> = HashMap::new();
    for segment in &segments {
        match segment {
            media::Segment::Text(t) => expanded.push_str(t),
            media::Segment::Media(index) => {
                let (layout, count) = match layouts.get(index) {
                    Some(done) => done.clone(),
                    None => {
                        let bytes = images.get(*index).ok_or_else(|| {
                            ApiError::internal(format!("image {index} was not kept"))
                        })?;
                        let done = image_layout(vision, bytes)?;
                        layouts.insert(*index, done.clone());
                        done
                    }
                };
                expanded.push_str(&layout);
                order.push((*index, count));
            }
        }
    }
    let tokens = prompt::encode(info, &expanded, add_special)?;
    let runs = image_runs(&tokens, vision.input.image_token);
    if runs.len() != order.len() || runs.iter().zip(&order).any(|(r, &(_, n))| r.len() != n) {
        return Err(ApiError::bad_request(format!(
            "the prompt holds image tokens besides its {} images'",
            order.len()
        )));
    }
    let order: Vec<usize> = order.into_iter().map(|(index, _)| index).collect();
    media::validate_expansions(&runs, order.len(), tokens.len())
        .map_err(|e| ApiError::internal(format!("laying out the images: {e}")))?;
    Ok(Expanded {
        tokens,
        images: runs.into_iter().zip(order).collect(),
    })
}

/// The text an image (`bytes`) becomes in the prompt and how many image tokens it holds: the
/// model's one layout, or for a dynamic-resolution model as many tokens as the grid its size
/// gives (read from the header, under the default [`media::ImageLimits`]).
fn image_layout(vision: &ImagePrompt, bytes: &[u8]) -> Result<(String, usize), ApiError> {
    match &vision.layout {
        ImageLayout::Fixed { expansion, .. } => {
            Ok((expansion.clone(), vision.input.tokens_per_image))
        }
        ImageLayout::Patches {
            processor,
            start,
            image,
            end,
        } => {
            let invalid = |e: media::Error| ApiError::bad_request(format!("invalid image: {e}"));
            let (width, height) = media::upright_dimensions(bytes, &media::ImageLimits::default())
                .map_err(invalid)?;
            let grid = processor.grid(width, height).map_err(invalid)?;
            let count = grid.tokens(processor.merge_size);
            let mut text = String::with_capacity(start.len() + count * image.len() + end.len());
            text.push_str(start);
            for _ in 0..count {
                text.push_str(image);
            }
            text.push_str(end);
            Ok((text, count))
        }
    }
}

/// Each maximal run of `image_token` in `tokens`.
fn image_runs(tokens: &[u32], image_token: u32) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let mut start = None;
    for (at, &id) in tokens.iter().enumerate() {
        match (id == image_token, start) {
            (true, None) => start = Some(at),
            (false, Some(s)) => {
                runs.push(s..at);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push(s..tokens.len());
    }
    runs
}

/// The images of `expanded` ready for the engine: each image sent decoded under the default
/// [`media::ImageLimits`] and preprocessed once, however often the prompt shows it.
pub fn prepare(
    info: &ModelInfo,
    expanded: &Expanded,
    images: &[Arc<[u8]>],
) -> Result<Vec<PromptImage>, ApiError> {
    let vision = info.vision.as_ref().ok_or_else(|| not_supported(info))?;
    let limits = media::ImageLimits::default();
    let mut prepared: HashMap<usize, (media::MediaId, EncoderInput)> = HashMap::new();
    let mut out = Vec::with_capacity(expanded.images.len());
    for (range, index) in &expanded.images {
        let (id, input) = match prepared.get(index) {
            Some(done) => done.clone(),
            None => {
                let bytes = images.get(*index).ok_or_else(|| {
                    ApiError::internal(format!("image {index} was not kept with the request"))
                })?;
                let invalid =
                    |e: media::Error| ApiError::bad_request(format!("invalid image: {e}"));
                let done = match &vision.layout {
                    ImageLayout::Fixed { processor, .. } => {
                        let image =
                            media::prepare_image(bytes, &limits, processor).map_err(invalid)?;
                        (image.id, EncoderInput::Pixels(Arc::new(image.pixels)))
                    }
                    ImageLayout::Patches { processor, .. } => {
                        let image = media::prepare_image_patches(bytes, &limits, processor)
                            .map_err(invalid)?;
                        (image.id, EncoderInput::Patches(Arc::new(image.patches)))
                    }
                };
                prepared.insert(*index, done.clone());
                done
            }
        };
        out.push(PromptImage {
            tokens: range.clone(),
            id,
            input,
        });
    }
    Ok(out)
}

fn not_supported(info: &ModelInfo) -> ApiError {
    ApiError::bad_request(format!("model `{}` does not support images", info.name))
}

#[cfg(test)]
mod tests {
    use super::image_runs;

    #[test]
    fn runs_of_the_image_token() {
        assert_eq!(image_runs(&[1, 9, 9, 2, 9, 3], 9), vec![1..3, 4..5]);
        assert_eq!(image_runs(&[9, 9], 9), vec![0..2]);
        assert!(image_runs(&[1, 2], 9).is_empty());
    }
}
