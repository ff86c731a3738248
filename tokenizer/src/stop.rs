//! Stop strings that may span token boundaries.
//!
//! Text that could still turn out to be the start of a stop string is held back until the next
//! piece decides it, so a stop string never leaks into the output, not even its first half.

/// What one [`StopMatcher::push`] releases.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopOutput {
    /// Text now known not to belong to any stop string.
    pub text: String,
    /// Set once a stop string matched; `text` then ends just before it.
    pub stopped: Option<String>,
}

/// Scans streamed text for any of a set of stop strings.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops`; empty strings are ignored (they would match everywhere).
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> Self {
        let stops = stops
            .into_iter()
            .map(Into::into)
            .filter(|s: &String| !s.is_empty())
            .collect();
        StopMatcher {
            stops,
            held: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop string has matched; further pushes then release nothing.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Feeds the next piece of text.
    pub fn push(&mut self, piece: &str) -> StopOutput {
        if self.stopped {
            return StopOutput::default();
        }
        self.held.push_str(piece);
        self.release(false)
    }

    /// Ends the stream: held text that never completed a stop string is released, and a match
    /// that was waiting on an earlier, still-open candidate now stops the stream.
    pub fn finish(&mut self) -> StopOutput {
        if self.stopped {
            return StopOutput::default();
        }
        self.release(true)
    }

    /// Releases what is decided. The result is the same however the text was split: output ends
    /// before the earliest-starting stop string in the whole text (the shortest, if several
    /// start there).
    fn release(&mut self, at_end: bool) -> StopOutput {
        let earliest_match = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()).map(|at| (at, stop.len())))
            .min();
        // A stop string that has started but not finished could still match before a later
        // complete match, so it blocks everything from its start on.
        let open_start = if at_end {
            None
        } else {
            self.earliest_open_start()
        };
        match (earliest_match, open_start) {
            (Some((at, len)), open) if open.is_none_or(|open| at <= open) => {
                let stop = self.held[at..at + len].to_string();
                let text = self.held[..at].to_string();
                self.held.clear();
                self.stopped = true;
                StopOutput {
                    text,
                    stopped: Some(stop),
                }
            }
            (_, open) => {
                let split = open.unwrap_or(self.held.len());
                let text = self.held[..split].to_string();
                self.held.drain(..split);
                StopOutput {
                    text,
                    stopped: None,
                }
            }
        }
    }

    /// The first byte from which the held text is a proper prefix of some stop string.
    fn earliest_open_start(&self) -> Option<usize> {
        let held = self.held.as_str();
        (0..held.len())
            .filter(|&start| held.is_char_boundary(start))
            .find(|&start| {
                let tail = &held.as_bytes()[start..];
                self.stops
                    .iter()
                    .any(|stop| stop.len() > tail.len() && stop.as_bytes().starts_with(tail))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let mut m = StopMatcher::new(stops.iter().copied());
        let mut out = String::new();
        for piece in pieces {
            let o = m.push(piece);
            out.push_str(&o.text);
            if o.stopped.is_some() {
                return (out, o.stopped);
            }
        }
        let o = m.finish();
        out.push_str(&o.text);
        (out, o.stopped)
    }

    #[test]
    fn stop_spanning_pieces_is_never_leaked() {
        let mut m = StopMatcher::new(["</answer>"]);
        assert_eq!(m.push("The result </an").text, "The result ");
        let o = m.push("swer> trailing");
        assert_eq!(o.text, "");
        assert_eq!(o.stopped.as_deref(), Some("</answer>"));
        assert!(m.is_stopped());
        assert_eq!(m.push("more").text, "");
        assert_eq!(m.finish(), StopOutput::default());
    }

    #[test]
    fn false_start_is_released_when_decided() {
        let mut m = StopMatcher::new(["STOP"]);
        assert_eq!(m.push("ST").text, "");
        assert_eq!(m.push("ART").text, "START");
        assert_eq!(m.push("S").text, "");
        assert_eq!(m.finish().text, "S");
    }

    #[test]
    fn earliest_match_wins() {
        assert_eq!(
            run(&["bc", "abcd"], &["xabcd"]),
            ("x".into(), Some("abcd".into()))
        );
        assert_eq!(
            run(&["bc", "abcd"], &["xabc", "e"]),
            ("xa".into(), Some("bc".into()))
        );
        assert_eq!(
            run(&["bc", "abcd"], &["xabc"]),
            ("xa".into(), Some("bc".into()))
        );
        assert_eq!(
            run(&["ab", "abc"], &["zabc"]),
            ("z".into(), Some("ab".into()))
        );
    }

    #[test]
    fn multibyte_text_is_never_split() {
        assert_eq!(run(&["é!"], &["caf", "é", "?"]), ("café?".into(), None));
        assert_eq!(
            run(&["日本"], &["今日", "本"]),
            ("今".into(), Some("日本".into()))
        );
    }

    proptest! {
        /// Whatever the split, the output equals the one-shot result.
        #[test]
        fn any_split_matches_one_shot(text in "[ab€ ]{0,24}", cuts in prop::collection::vec(0usize..30, 0..6)) {
            let stops = ["ab€", "b b", "€€", "a", "aba b"];
            let whole = run(&stops, &[&text]);
            let mut bounds: Vec<usize> = cuts.into_iter().filter(|&c| c <= text.len() && text.is_char_boundary(c)).collect();
            bounds.sort();
            let mut pieces = Vec::new();
            let mut last = 0;
            for b in bounds { pieces.push(&text[last..b]); last = b; }
            pieces.push(&text[last..]);
            prop_assert_eq!(run(&stops, &pieces), whole);
        }
    }
}
