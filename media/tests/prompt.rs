//! A prompt's media tags (`[img-N]`) split into text and media segments, and the token
//! ranges each media segment expands to checked against the prompt.

use std::ops::Range;

use media::Segment::{Media, Text};
use media::{Error, media_segment_count, split_prompt, validate_expansions};

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
