//! Images in a prompt, for a model that reads them: the `[img-N]` tags the request's messages
//! carry (put where each image was sent, see `prompt`) become the model's image layout in the
//! rendered text ([`crate::engine::prompt_media::ImagePrompt::expansion`]), the text is tokenized in
//! one piece as the model's processor does, and each run of image tokens is matched to its
//! image, decoded under [`media::ImageLimits`] and preprocessed for the encoder.
//!
//! An image a model pans and scans (Gemma 3 with `do_pan_and_scan`) becomes one run for the
//! whole image and one per crop. A tag's item may be an audio clip instead, for a model that
//! reads audio: it becomes one run of audio tokens per segment of the clip
//! ([`crate::server::audio`]), matched the same way.
//!
//! An image whose features the engine keeps is sent to it undecoded; every other is decoded
//! once per request, whatever number of crops and places it has.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::ops::Range;
use std::sync::Arc;

use crate::engine::job::decode_image;
use crate::engine::prompt_media::{ImageLayout, ImagePrompt};
use crate::engine::{EncoderInput, ImageProcessing, ModelInfo, PromptMedia, UndecodedImage};
use crate::server::audio;
use crate::server::prompt_tokens;
use crate::server::request_error::RequestError;

/// The most images one request may carry: each is decoded and preprocessed before the engine
/// sees it (a 64 MiB body of tiny images must not become gigabytes of pixels).
pub const MAX_IMAGES: usize = 32;

/// A rendered text with its `[img-N]` tags expanded and tokenized: the tokens, and for each
/// image's run of image tokens, in prompt order, its range and the index of the image sent.
pub struct Expanded {
    /// Prompt token ids.
    pub tokens: Vec<u32>,
    /// Each image's (or audio segment's) token range, which of the request's media it is and
    /// which of its runs: for audio the segment of the clip, for an image 0 for the whole
    /// image and k for its pan-and-scan crop k - 1.
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
) -> Result<Expanded, RequestError> {
    if info.vision.is_none() && info.audio.is_none() {
        return Err(not_supported(info));
    }
    let segments = media::split_prompt(text, images.len())
        .map_err(|e| RequestError::invalid(format!("media in the prompt: {e}")))?;
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
                            RequestError::internal(format!("media item {index} was not kept"))
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
    let tokens = prompt_tokens::encode(info, &expanded, add_special)?;
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
        return Err(RequestError::invalid(format!(
            "the prompt holds image or audio tokens besides those of its {} media runs",
            order.len()
        )));
    }
    let ranges: Vec<Range<usize>> = runs.into_iter().map(|(range, _)| range).collect();
    media::validate_expansions(&ranges, order.len(), tokens.len())
        .map_err(|e| RequestError::internal(format!("laying out the media: {e}")))?;
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
) -> Result<ItemLayout, RequestError> {
    let is_audio = matches!(media::detect(bytes), Ok(media::MediaFormat::Audio(_)));
    if is_audio {
        let prompt = info.audio.as_ref().ok_or_else(|| {
            RequestError::refused(format!("model `{}` does not support audio", info.name))
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
    let (text, counts) = image_layout(vision, bytes)?;
    Ok(ItemLayout {
        text,
        runs: counts
            .into_iter()
            .map(|count| (vision.input.image_token, count))
            .collect(),
    })
}

/// The text an image (`bytes`) becomes in the prompt and its runs of image tokens: the
/// model's one layout (the whole image, then any pan-and-scan crops), or for a
/// dynamic-resolution model as many tokens as the grid its size gives (sizes read from the
/// header, under the default [`media::ImageLimits`]).
fn image_layout(vision: &ImagePrompt, bytes: &[u8]) -> Result<(String, Vec<usize>), RequestError> {
    match &vision.layout {
        ImageLayout::Fixed {
            expansion,
            pan_and_scan,
            ..
        } => {
            let crops = crops_of(pan_and_scan.as_ref(), bytes)?.len();
            Ok((
                ImageLayout::with_crops(expansion, crops),
                vec![vision.input.tokens_per_image; 1 + crops],
            ))
        }
        ImageLayout::Patches {
            processor,
            start,
            image,
            end,
        } => {
            let (width, height) = upright_size(bytes)?;
            let grid = processor.grid(width, height).map_err(invalid_image)?;
            let count = grid.tokens(processor.merge_size);
            let mut text = String::with_capacity(start.len() + count * image.len() + end.len());
            text.push_str(start);
            for _ in 0..count {
                text.push_str(image);
            }
            text.push_str(end);
            Ok((text, vec![count]))
        }
    }
}

/// The pan-and-scan crops of the image `bytes` (none without pan and scan).
fn crops_of(
    pan_and_scan: Option<&media::PanAndScan>,
    bytes: &[u8],
) -> Result<Vec<media::CropRect>, RequestError> {
    match pan_and_scan {
        None => Ok(Vec::new()),
        Some(pan) => {
            let (width, height) = upright_size(bytes)?;
            Ok(pan.crops(width, height))
        }
    }
}

/// The size the image `bytes` decodes to, from its header.
fn upright_size(bytes: &[u8]) -> Result<(u32, u32), RequestError> {
    media::upright_dimensions(bytes, &media::ImageLimits::default()).map_err(invalid_image)
}

fn invalid_image(e: media::Error) -> RequestError {
    RequestError::invalid(format!("invalid image: {e}"))
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
) -> Result<Vec<PromptMedia>, RequestError> {
    // By (media index, run): an image's whole view and each crop, prepared once however
    // often the prompt shows them, from one decode of the image.
    let mut prepared: HashMap<(usize, usize), (media::MediaId, EncoderInput)> = HashMap::new();
    let mut decoded: HashMap<usize, media::RgbImage> = HashMap::new();
    let mut crops: HashMap<usize, Vec<media::CropRect>> = HashMap::new();
    let mut out = Vec::with_capacity(expanded.images.len());
    for (range, index, run) in &expanded.images {
        if let Some(clip) = expanded.audio.get(index) {
            let segment = clip.get(*run).ok_or_else(|| {
                RequestError::internal(format!("audio {index} has no segment {run}"))
            })?;
            out.push(PromptMedia {
                tokens: range.clone(),
                id: segment.id,
                input: EncoderInput::Audio(segment.features.clone()),
            });
            continue;
        }
        let vision = info.vision.as_ref().ok_or_else(|| not_supported(info))?;
        let (id, input) = match prepared.get(&(*index, *run)) {
            Some(done) => done.clone(),
            None => {
                let bytes = images.get(*index).ok_or_else(|| {
                    RequestError::internal(format!("image {index} was not kept with the request"))
                })?;
                let processing = match &vision.layout {
                    ImageLayout::Fixed {
                        processor,
                        pan_and_scan,
                        ..
                    } => {
                        // Run 0 is the whole image, run k its crop k - 1.
                        let crop = match run.checked_sub(1) {
                            None => None,
                            Some(k) => {
                                let rects = match crops.entry(*index) {
                                    Entry::Occupied(rects) => rects.into_mut(),
                                    Entry::Vacant(slot) => {
                                        slot.insert(crops_of(pan_and_scan.as_ref(), bytes)?)
                                    }
                                };
                                Some(*rects.get(k).ok_or_else(|| {
                                    RequestError::internal(format!("image {index} has no crop {k}"))
                                })?)
                            }
                        };
                        ImageProcessing::Fixed(*processor, crop)
                    }
                    ImageLayout::Patches { processor, .. } => {
                        let (width, height) = upright_size(bytes)?;
                        let grid = processor.grid(width, height).map_err(invalid_image)?;
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
                    let rgb = match decoded.entry(*index) {
                        Entry::Occupied(rgb) => rgb.into_mut(),
                        Entry::Vacant(slot) => {
                            slot.insert(decode_image(bytes).map_err(invalid_image)?)
                        }
                    };
                    image.preprocess(rgb).map_err(invalid_image)?
                };
                prepared.insert((*index, *run), (id, input.clone()));
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

fn not_supported(info: &ModelInfo) -> RequestError {
    RequestError::refused(format!("model `{}` does not support images", info.name))
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
