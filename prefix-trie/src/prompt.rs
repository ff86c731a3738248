//! A request's prompt as the trie sees it: keys, token count and non-causal media spans.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::key::{Key, Lookahead};

/// A media item spliced into the token stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MediaItem {
    /// Token positions of the item's expansion.
    pub tokens: Range<usize>,
    /// Hash of the item's content and preprocessing shape; keys the whole expansion.
    pub content_hash: u64,
    /// Whether the item's tokens attend causally. A non-causal item must be evaluated in one
    /// forward, so no snapshot may land strictly inside it.
    pub causal: bool,
}

/// The keys of a prompt plus what the trie needs to schedule and clamp around media.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt {
    keys: Vec<Key>,
    token_count: usize,
    lookahead: Lookahead,
    non_causal: Vec<Range<usize>>,
}

impl Prompt {
    /// Builds the keys of `tokens`, with each media item's positions keyed by its content hash
    /// (each position by its own mix of the hash, [`Key::media_position`]).
    ///
    /// Fails when a token id is 2^31 or more, or when media items are empty, out of bounds,
    /// out of order or overlapping.
    pub fn new(tokens: &[u32], media: &[MediaItem], lookahead: Lookahead) -> Result<Prompt> {
        let mut unpaired = Vec::with_capacity(tokens.len());
        for (position, &id) in tokens.iter().enumerate() {
            unpaired.push(Key::token(id).ok_or(Error::TokenIdOutOfRange { position, id })?);
        }
        let mut previous_end = 0;
        let mut non_causal = Vec::new();
        for (item, media) in media.iter().enumerate() {
            let range = media.tokens.clone();
            if range.start >= range.end || range.end > tokens.len() {
                return Err(Error::MediaOutOfBounds {
                    item,
                    range,
                    tokens: tokens.len(),
                });
            }
            if range.start < previous_end {
                return Err(Error::MediaOverlap { item, range });
            }
            previous_end = range.end;
            for (within, key) in unpaired[range.clone()].iter_mut().enumerate() {
                *key = Key::media_position(media.content_hash, within);
            }
            if !media.causal {
                non_causal.push(range);
            }
        }
        let keys = match lookahead {
            Lookahead::None => unpaired,
            Lookahead::NextToken => unpaired.windows(2).map(|w| w[0].pair(w[1])).collect(),
        };
        Ok(Prompt {
            keys,
            token_count: tokens.len(),
            lookahead,
            non_causal,
        })
    }

    /// The trie keys, one per cache offset.
    pub fn keys(&self) -> &[Key] {
        &self.keys
    }

    /// Number of tokens the keys were built from.
    pub fn token_count(&self) -> usize {
        self.token_count
    }

    /// The look-ahead the keys were built with.
    pub fn lookahead(&self) -> Lookahead {
        self.lookahead
    }

    /// Token ranges of the non-causal media items, in order.
    pub fn non_causal(&self) -> &[Range<usize>] {
        &self.non_causal
    }

    /// The deepest offset a request may resume at: one token must always be evaluated to
    /// produce the logits decoding starts from.
    pub fn resume_limit(&self) -> usize {
        self.token_count.saturating_sub(1).min(self.keys.len())
    }
}

/// The non-causal span that `offset` falls strictly inside, if any.
pub(crate) fn span_containing(spans: &[Range<usize>], offset: usize) -> Option<Range<usize>> {
    let index = spans.partition_point(|span| span.end <= offset);
    spans.get(index).filter(|span| span.start < offset).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(tokens: Range<usize>, content_hash: u64, causal: bool) -> MediaItem {
        MediaItem {
            tokens,
            content_hash,
            causal,
        }
    }

    #[test]
    fn media_positions_take_the_content_key() {
        let prompt =
            Prompt::new(&[1, 9, 9, 9, 2], &[image(1..4, 42, true)], Lookahead::None).unwrap();
        let media: Vec<Key> = (0..3).map(|i| Key::media_position(42, i)).collect();
        assert_eq!(prompt.keys()[1..4], media[..]);
        assert_eq!(prompt.keys()[0], Key::token(1).unwrap());
        assert!(prompt.non_causal().is_empty());
        // The same item elsewhere keys the same way: keys follow the content, not the offset.
        let later = Prompt::new(&[7, 7, 9, 9, 9], &[image(2..5, 42, true)], Lookahead::None);
        assert_eq!(later.unwrap().keys()[2..5], media[..]);
    }

    #[test]
    fn different_images_with_equal_placeholders_key_differently() {
        let a = Prompt::new(&[1, 9, 9], &[image(1..3, 1, true)], Lookahead::None).unwrap();
        let b = Prompt::new(&[1, 9, 9], &[image(1..3, 2, true)], Lookahead::None).unwrap();
        assert_ne!(a.keys()[1], b.keys()[1]);
    }

    #[test]
    fn look_ahead_keys_pair_neighbours() {
        let prompt = Prompt::new(&[5, 6, 7], &[], Lookahead::NextToken).unwrap();
        let k = |id| Key::token(id).unwrap();
        assert_eq!(prompt.keys(), [k(5).pair(k(6)), k(6).pair(k(7))]);
        assert_eq!(prompt.resume_limit(), 2);
        assert_eq!(
            Prompt::new(&[5, 6, 7], &[], Lookahead::None)
                .unwrap()
                .resume_limit(),
            2
        );
        assert!(
            Prompt::new(&[], &[], Lookahead::NextToken)
                .unwrap()
                .keys()
                .is_empty()
        );
    }

    #[test]
    fn bad_input_is_named() {
        let huge = Prompt::new(&[1, u32::MAX], &[], Lookahead::None);
        assert!(matches!(
            huge,
            Err(Error::TokenIdOutOfRange { position: 1, .. })
        ));
        let past = Prompt::new(&[1, 2], &[image(1..3, 0, true)], Lookahead::None);
        assert!(matches!(past, Err(Error::MediaOutOfBounds { item: 0, .. })));
        let empty = Prompt::new(&[1, 2], &[image(1..1, 0, true)], Lookahead::None);
        assert!(matches!(empty, Err(Error::MediaOutOfBounds { .. })));
        let overlap = Prompt::new(
            &[1, 2, 3, 4],
            &[image(0..2, 0, true), image(1..3, 0, true)],
            Lookahead::None,
        );
        assert!(matches!(overlap, Err(Error::MediaOverlap { item: 1, .. })));
    }

    #[test]
    fn spans_contain_only_interior_offsets() {
        let spans = [2..5, 8..9, 10..14];
        assert_eq!(span_containing(&spans, 2), None);
        assert_eq!(span_containing(&spans, 3), Some(2..5));
        assert_eq!(span_containing(&spans, 5), None);
        assert_eq!(span_containing(&spans, 8), None);
        assert_eq!(span_containing(&spans, 9), None);
        assert_eq!(span_containing(&spans, 13), Some(10..14));
    }
}
