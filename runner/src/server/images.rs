//! Images in a prompt, for a model that reads them: the `[img-N]` tags the request's messages
//! carry (put where each image was sent, see `prompt`) become the model's image layout in the
//! rendered text ([`crate::engine::loader::ImagePrompt::expansion`]), the text is tokenized in
//! one piece as the model's processor does, and each run of image tokens is matched to its
//! image, decoded under [`media::ImageLimits`] and preprocessed for the encoder.
//!
//! A tag's item may be an audio clip instead, for a model that reads audio: it becomes one run
//! of audio tokens per segment of the clip ([`crate::server::audio`]), matched the same way.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use crate::engine::loader::{ImageLayout, ImagePrompt};
use crate::engine::{EncoderInput, ImageProcessing, ModelInfo, PromptMedia, UndecodedImage};
use crate::server::audio;
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
    /// Each image's (or audio segment's) token range, which of the request's media it is and,
    /// for audio, which segment of the clip.
    pub images: Vec<(Range<usize>, usize, usize)>,
    /// The segments of each audio clip the prompt shows, by media index: decoded once here,
    /// since their token counts decide the layout.
    pub audio: HashMap<usize, Vec<audio::Segment>>,
}

/// What a tag's item becomes: its text, and per run of media tokens in it, the token and
/// the run's length.
#[derive(Clone)]
struct ItemLayout {
    text: String,
    runs: Vec<(u32, usize)>,
}

/// Expands the `[img-N]` tags of `text` (N below `images.len()`) into `info`'s image layout
/// and tokenizes the result (adding the model's BOS with `add_special`). Fails when a tag
/// names an image not sent, when a dynamic-resolution model's image has no readable size, or
/// when the text holds the image token itself (typed by a client), which would make its runs
/// mismatch the images. Audio clips whose segments are in `known` (from an earlier expansion
/// of the same request) are not decoded again.
pub fn expand(
    info: &ModelInfo,
    text: &str,
    images: &[Arc<[u8]>],
    add_special: bool,
    known: &HashMap<usize, Vec<audio::Segment>>,
) -> Result<Expanded, ApiError> {
    if info.vision.is_none() && info.audio.is_none() {
        return Err(not_supported(info));
    }
    let segments = media::split_prompt(text, images.len())
        .map_err(|e| ApiError::bad_request(format!("media in the prompt: {e}")))?;
    let mut expanded = String::with_capacity(text.len());
    let mut order: Vec<(usize, usize, u32, usize)> = Vec::new();
    let mut layouts: HashMap<usize, ItemLayout> = HashMap::new();
    let mut clips: HashMap<usize, Vec<audio::Segment>> = HashMap::new();
    for segment in &segments {
        match segment {
            media::Segment::Text(t) => expanded.push_str(t),
            media::Segment::Media(index) => {
                let layout = match layouts.get(index) {
                    Some(done) => done.clone(),
                    None => {
                        let bytes = images.get(*index).ok_or_else(|| {
                            ApiError::internal(format!("media item {index} was not kept"))
                        })?;
                        if let Some(segments) = known.get(index) {
                            clips.insert(*index, segments.clone());
                        }
                        let done = item_layout(info, bytes, *index, &mut clips)?;
                        layouts.insert(*index, done.clone());
                        done
                    }
                };
                expanded.push_str(&layout.text);
                for (k, &(token, count)) in layout.runs.iter().enumerate() {
                    order.push((*index, k, token, count));
                }
            }
        }
    }
    let tokens = prompt::encode(info, &expanded, add_special)?;
    let media_tokens: Vec<u32> = info
        .vision
        .iter()
        .map(|v| v.input.image_token)
        .chain(info.audio.iter().map(|a| a.input.audio_token))
        .collect();
    let runs = media_runs(&tokens, &media_tokens);
    let matches = runs.len() == order.len()
        && runs
            .iter()
            .zip(&order)
            .all(|((range, token), &(_, _, want, n))| *token == want && range.len() == n);
    if !matches {
        return Err(ApiError::bad_request(format!(
            "the prompt holds image or audio tokens besides those of its {} media runs",
            order.len()
        )));
    }
    let ranges: Vec<Range<usize>> = runs.into_iter().map(|(range, _)| range).collect();
    media::validate_expansions(&ranges, order.len(), tokens.len())
        .map_err(|e| ApiError::internal(format!("laying out the media: {e}")))?;
    Ok(Expanded {
        tokens,
        images: ranges
            .into_iter()
            .zip(order)
            .map(|(range, (index, k, _, _))| (range, index, k))
            .collect(),
        audio: clips,
    })
}

/// The layout of media item `index` (`bytes`): an image as the model lays out images, an
/// audio clip as one run per segment (its segments kept in `clips`, or taken from there when
/// already cut). Fails when the model does not read the item's kind.
fn item_layout(
    info: &ModelInfo,
    bytes: &[u8],
    index: usize,
    clips: &mut HashMap<usize, Vec<audio::Segment>>,
) -> Result<ItemLayout, ApiError> {
    let is_audio = matches!(media::detect(bytes), Ok(media::MediaFormat::Audio(_)));
    if is_audio {
        let prompt = info.audio.as_ref().ok_or_else(|| {
            ApiError::bad_request(format!("model `{}` does not support audio", info.name))
        })?;
        let segments = match clips.remove(&index) {
            Some(segments) => segments,
            None => audio::segments(prompt, bytes, info.context_length)?,
        };
        let layout = ItemLayout {
            text: audio::layout(prompt, &segments),
            runs: segments
                .iter()
                .map(|s| (prompt.input.audio_token, s.tokens))
                .collect(),
        };
        clips.insert(index, segments);
        return Ok(layout);
    }
    let vision = info.vision.as_ref().ok_or_else(|| not_supported(info))?;
    let (text, count) = image_layout(vision, bytes)?;
    Ok(ItemLayout {
        text,
        runs: vec![(vision.input.image_token, count)],
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

/// Each maximal run of one of `media_tokens` in `tokens`, with its token.
fn media_runs(tokens: &[u32], media_tokens: &[u32]) -> Vec<(Range<usize>, u32)> {
    let mut runs = Vec::new();
    let mut open: Option<(usize, u32)> = None;
    for (at, &id) in tokens.iter().enumerate() {
        if let Some((start, token)) = open
            && token != id
        {
            runs.push((start..at, token));
            open = None;
        }
        if open.is_none() && media_tokens.contains(&id) {
            open = Some((at, id));
        }
    }
    if let Some((start, token)) = open {
        runs.push((start..tokens.len(), token));
    }
    runs
}

/// The images of `expanded` ready for the engine: each image sent decoded under the default
/// [`media::ImageLimits`] and preprocessed once, however often the prompt shows it, unless the
/// engine already holds its features ([`EncoderInput::Undecoded`]).
pub fn prepare(
    info: &ModelInfo,
    expanded: &Expanded,
    images: &[Arc<[u8]>],
) -> Result<Vec<PromptMedia>, ApiError> {
    let mut prepared: HashMap<usize, (media::MediaId, EncoderInput)> = HashMap::new();
    let mut out = Vec::with_capacity(expanded.images.len());
    for (range, index, segment) in &expanded.images {
        if let Some(clip) = expanded.audio.get(index) {
            let segment = clip.get(*segment).ok_or_else(|| {
                ApiError::internal(format!("audio {index} has no segment {segment}"))
            })?;
            out.push(PromptMedia {
                tokens: range.clone(),
                id: segment.id,
                input: EncoderInput::Audio(segment.features.clone()),
            });
            continue;
        }
        let vision = info.vision.as_ref().ok_or_else(|| not_supported(info))?;
        let (id, input) = match prepared.get(index) {
            Some(done) => done.clone(),
            None => {
                let bytes = images.get(*index).ok_or_else(|| {
                    ApiError::internal(format!("image {index} was not kept with the request"))
                })?;
                let invalid =
                    |e: media::Error| ApiError::bad_request(format!("invalid image: {e}"));
                let processing = match &vision.layout {
                    ImageLayout::Fixed { processor, .. } => ImageProcessing::Fixed(*processor),
                    ImageLayout::Patches { processor, .. } => {
                        let (width, height) =
                            media::upright_dimensions(bytes, &media::ImageLimits::default())
                                .map_err(invalid)?;
                        let grid = processor.grid(width, height).map_err(invalid)?;
                        ImageProcessing::Patches(*processor, grid)
                    }
                };
                let image = UndecodedImage {
                    bytes: bytes.clone(),
                    processing,
                };
                let id = image.id();
                let input = if info.encoded.contains(&id) {
                    EncoderInput::Undecoded(Arc::new(image))
                } else {
                    image.decode().map_err(invalid)?
                };
                prepared.insert(*index, (id, input.clone()));
                (id, input)
            }
        };
        out.push(PromptMedia {
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
    use super::media_runs;

    #[test]
    fn runs_of_media_tokens() {
        assert_eq!(
            media_runs(&[1, 9, 9, 2, 9, 3], &[9]),
            vec![(1..3, 9), (4..5, 9)]
        );
        assert_eq!(media_runs(&[9, 9], &[9]), vec![(0..2, 9)]);
        assert!(media_runs(&[1, 2], &[9]).is_empty());
        // Runs of two different media tokens side by side are two runs.
        assert_eq!(
            media_runs(&[8, 8, 9, 1], &[8, 9]),
            vec![(0..2, 8), (2..3, 9)]
        );
    }
}
