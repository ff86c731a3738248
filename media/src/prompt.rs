//! Prompts with media: `[img-N]` tags split the rendered prompt into text and media segments,
//! and the token ranges a model expands each media segment into are validated against them.

use std::ops::Range;

use crate::error::{Error, Result};

/// A piece of a prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment<'a> {
    /// Literal text, never empty.
    Text(&'a str),
    /// The request's media item at this index (the `N` of `[img-N]`).
    Media(usize),
}

/// Splits `prompt` at each `[img-N]` tag, checking `N` against `media_count`.
///
/// Text that only resembles a tag (`[img-]`, `[img-x]`, a number too long to be an index) stays
/// text. Fails with [`Error::BadMediaIndex`] when a tag names an item that was not sent.
pub fn split_prompt(prompt: &str, media_count: usize) -> Result<Vec<Segment<'_>>> {
    let mut segments = Vec::new();
    let mut text_start = 0;
    let mut search = 0;
    while let Some(found) = prompt[search..].find("[img-") {
        let tag_start = search + found;
        let digits_start = tag_start + "[img-".len();
        let digits_len = prompt[digits_start..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        let close = digits_start + digits_len;
        let is_tag = (1..=9).contains(&digits_len) && prompt.as_bytes().get(close) == Some(&b']');
        if !is_tag {
            search = digits_start;
            continue;
        }
        // At most nine digits, so the parse cannot overflow and cannot fail.
        let index: usize = prompt[digits_start..close].parse().unwrap_or(usize::MAX);
        if index >= media_count {
            return Err(Error::BadMediaIndex {
                index,
                count: media_count,
            });
        }
        if tag_start > text_start {
            segments.push(Segment::Text(&prompt[text_start..tag_start]));
        }
        segments.push(Segment::Media(index));
        text_start = close + 1;
        search = text_start;
    }
    if text_start < prompt.len() {
        segments.push(Segment::Text(&prompt[text_start..]));
    }
    Ok(segments)
}

/// Checks the token ranges a model returned for the media segments of a prompt.
///
/// There must be exactly one range per media segment, in prompt order; each must be
/// non-empty, start at or after the previous one's end, and end within `token_count`.
pub fn validate_expansions(
    expansions: &[Range<usize>],
    media_segments: usize,
    token_count: usize,
) -> Result<()> {
    let invalid = |range: &Range<usize>, reason: String| Error::InvalidExpansion {
        range: range.clone(),
        reason,
    };
    if expansions.len() != media_segments {
        return Err(invalid(
            &(0..0),
            format!(
                "{} expansions for {media_segments} media segments",
                expansions.len()
            ),
        ));
    }
    let mut previous_end = 0;
    for (i, range) in expansions.iter().enumerate() {
        if range.start >= range.end {
            return Err(invalid(
                range,
                format!("expansion {i} is empty or reversed"),
            ));
        }
        if range.start < previous_end {
            return Err(invalid(
                range,
                format!("expansion {i} starts before the previous one ends at {previous_end}"),
            ));
        }
        if range.end > token_count {
            return Err(invalid(
                range,
                format!("expansion {i} ends past the {token_count} prompt tokens"),
            ));
        }
        previous_end = range.end;
    }
    Ok(())
}

/// Number of media segments in a split prompt.
pub fn media_segment_count(segments: &[Segment<'_>]) -> usize {
    segments
        .iter()
        .filter(|s| matches!(s, Segment::Media(_)))
        .count()
}
