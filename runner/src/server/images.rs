//! Images in a prompt, for a model that reads them: the `[img-N]` tags the request's messages
//! carry (put where each image was sent, see `prompt`) become the model's image layout in the
//! rendered text ([`crate::engine::loader::ImagePrompt::expansion`]), the text is tokenized in
//! one piece as the model's processor does, and each run of image tokens is matched to its
//! image, decoded under [`media::ImageLimits`] and preprocessed for the encoder.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use crate::engine::{ModelInfo, PromptImage};
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

/// Expands the `[img-N]` tags of `text` (N below `count`) into `info`'s image layout and
/// tokenizes the result (adding the model's BOS with `add_special`). Fails when a tag names an image not sent, or when the text holds the
/// image token itself (typed by a client), which would make its runs mismatch the images.
pub fn expand(
    info: &ModelInfo,
    text: &str,
    count: usize,
    add_special: bool,
) -> Result<Expanded, ApiError> {
    let vision = info.vision.as_ref().ok_or_else(|| not_supported(info))?;
    let segments = media::split_prompt(text, count)
        .map_err(|e| ApiError::bad_request(format!("images in the prompt: {e}")))?;
    let mut expanded = String::with_capacity(text.len());
    let mut order = Vec::new();
    for segment in &segments {
        match segment {
            media::Segment::Text(t) => expanded.push_str(t),
            media::Segment::Media(index) => {
                expanded.push_str(&vision.expansion);
                order.push(*index);
            }
        }
    }
    let tokens = prompt::encode(info, &expanded, add_special)?;
    let runs = image_runs(&tokens, vision.input.image_token);
    let per_image = vision.input.tokens_per_image;
    if runs.len() != order.len() || runs.iter().any(|r| r.len() != per_image) {
        return Err(ApiError::bad_request(format!(
            "the prompt holds image tokens besides its {} images' {per_image} each",
            order.len()
        )));
    }
    media::validate_expansions(&runs, order.len(), tokens.len())
        .map_err(|e| ApiError::internal(format!("laying out the images: {e}")))?;
    Ok(Expanded {
        tokens,
        images: runs.into_iter().zip(order).collect(),
    })
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
    let mut prepared: HashMap<usize, (media::MediaId, Arc<media::PixelValues>)> = HashMap::new();
    let mut out = Vec::with_capacity(expanded.images.len());
    for (range, index) in &expanded.images {
        let (id, pixels) = match prepared.get(index) {
            Some(done) => done.clone(),
            None => {
                let bytes = images.get(*index).ok_or_else(|| {
                    ApiError::internal(format!("image {index} was not kept with the request"))
                })?;
                let image = media::prepare_image(bytes, &limits, &vision.processor)
                    .map_err(|e| ApiError::bad_request(format!("invalid image: {e}")))?;
                let done = (image.id, Arc::new(image.pixels));
                prepared.insert(*index, done.clone());
                done
            }
        };
        out.push(PromptImage {
            tokens: range.clone(),
            id,
            pixels,
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
