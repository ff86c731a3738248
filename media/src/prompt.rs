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

#[cfg(test)]
mod tests {
    use super::*;
    use Segment::{Media, Text};

    #[test]
    fn tags_split_the_prompt() {
        let got = split_prompt("Look: [img-0] and [img-1][img-0]!", 2).unwrap();
        assert_eq!(
            got,
            vec![
                Text("Look: "),
                Media(0),
                Text(" and "),
                Media(1),
                Media(0),
                Text("!")
            ]
        );
        assert_eq!(media_segment_count(&got), 3);
        assert_eq!(split_prompt("[img-0]", 1).unwrap(), vec![Media(0)]);
        assert_eq!(split_prompt("", 0).unwrap(), vec![]);
    }

    #[test]
    fn near_tags_are_text() {
        for text in [
            "[img-]",
            "[img-x]",
            "[img-1",
            "[img-1234567890]",
            "[IMG-0]",
            "[img-[img-",
        ] {
            assert_eq!(split_prompt(text, 1).unwrap(), vec![Text(text)], "{text}");
        }
        assert_eq!(
            split_prompt("[img-[img-0]", 1).unwrap(),
            vec![Text("[img-"), Media(0)]
        );
    }

    #[test]
    fn out_of_range_index_is_an_error() {
        assert!(matches!(
            split_prompt("[img-2]", 2),
            Err(Error::BadMediaIndex { index: 2, count: 2 })
        ));
        assert!(matches!(
            split_prompt("[img-0]", 0),
            Err(Error::BadMediaIndex { .. })
        ));
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // one-range lists are the point here
    fn expansions_are_validated() {
        assert!(validate_expansions(&[1..5, 5..9], 2, 10).is_ok());
        assert!(validate_expansions(&[], 0, 0).is_ok());
        let bad: [(&[Range<usize>], usize, usize); 5] = [
            (&[1..5], 2, 10),        // a media segment without expansion
            (&[1..5, 4..9], 2, 10),  // overlap
            (&[5..9, 1..3], 2, 10),  // out of order
            (&[1..5, 5..11], 2, 10), // past the end
            (&[3..3], 1, 10),        // empty
        ];
        for (ranges, segments, tokens) in bad {
            assert!(
                matches!(
                    validate_expansions(ranges, segments, tokens),
                    Err(Error::InvalidExpansion { .. })
                ),
                "{ranges:?}"
            );
        }
    }
}
