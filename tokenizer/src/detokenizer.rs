//! [`Detokenizer`]: token ids in, text pieces out, never half a character.
//!
//! Decoding one token at a time is wrong in three ways: a character may span several tokens
//! (byte-level BPE splits `€` into three; SentencePiece byte fallback emits `<0xE2>` …), a
//! SentencePiece word piece decodes differently at the start of a text (its `▁` becomes a
//! dropped leading space), and decoders join pieces (byte fallback fuses bytes). So each step
//! decodes a short window of recent ids twice, without and with the new ones, and releases the
//! difference once it no longer ends in an incomplete character (U+FFFD). A run of byte-fallback
//! tokens is held until it ends, because the decoder judges the run as a whole.

use crate::error::Result;
use crate::vocab::Tokenizer;

const REPLACEMENT: char = '\u{FFFD}';

/// Incremental decoder for one generation stream.
#[derive(Debug, Clone)]
pub struct Detokenizer<'t> {
    tokenizer: &'t Tokenizer,
    skip_special: bool,
    ids: Vec<u32>,
    /// Start of the window decoded for context.
    prefix_offset: usize,
    /// End of what was already released.
    read_offset: usize,
    /// Whether the held ids end in a run of byte-fallback tokens.
    in_byte_run: bool,
}

impl<'t> Detokenizer<'t> {
    /// A detokenizer for a fresh stream; `skip_special` leaves out special tokens' text.
    pub fn new(tokenizer: &'t Tokenizer, skip_special: bool) -> Self {
        Detokenizer {
            tokenizer,
            skip_special,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            in_byte_run: false,
        }
    }

    /// A detokenizer that continues after `context` (e.g. the prompt's last few ids), so the
    /// first generated word keeps the leading space SentencePiece would strip at text start.
    /// The context's own text is not emitted.
    pub fn with_context(tokenizer: &'t Tokenizer, skip_special: bool, context: &[u32]) -> Self {
        let len = context.len();
        Detokenizer {
            tokenizer,
            skip_special,
            ids: context.to_vec(),
            prefix_offset: len.saturating_sub(1),
            read_offset: len,
            in_byte_run: false,
        }
    }

    /// Adds one generated id; returns the text it completed (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        // Byte-fallback decoding judges a run of byte tokens as a whole (an invalid run becomes
        // all U+FFFD, valid bytes included), so a run is released only once it ends. Skipped
        // special tokens print nothing and do not end a run.
        if self.is_byte_token(id) {
            self.in_byte_run = true;
        } else if !self.is_silent(id)? {
            self.in_byte_run = false;
        }
        if self.in_byte_run {
            return Ok(String::new());
        }
        let prefix = self.decode(self.prefix_offset, self.read_offset)?;
        let full = self.decode(self.prefix_offset, self.ids.len())?;
        if full == prefix {
            // The new ids print nothing (skipped special tokens): count them as read so a long
            // run of them cannot grow the window without bound.
            self.read_offset = self.ids.len();
            return Ok(String::new());
        }
        if full.len() <= prefix.len() || full.ends_with(REPLACEMENT) || !full.starts_with(&prefix) {
            // Incomplete character (or a decoder that rewrote the context): wait for more.
            return Ok(String::new());
        }
        let piece = full[prefix.len()..].to_string();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        // Keep the window short: older ids no longer affect new text.
        if self.prefix_offset > 64 {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
        Ok(piece)
    }

    /// Releases whatever is held (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> Result<String> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let prefix = self.decode(self.prefix_offset, self.read_offset)?;
        let full = self.decode(self.prefix_offset, self.ids.len())?;
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        self.in_byte_run = false;
        let common = common_prefix_len(&prefix, &full);
        Ok(full[common..].to_string())
    }

    /// Whether `id` prints nothing in this stream (a skipped special token).
    fn is_silent(&self, id: u32) -> Result<bool> {
        Ok(self.skip_special && self.tokenizer.decode(&[id], true)?.is_empty())
    }

    fn is_byte_token(&self, id: u32) -> bool {
        self.tokenizer.id_to_token(id).is_some_and(|text| {
            let bytes = text.as_bytes();
            bytes.len() == 6
                && bytes.starts_with(b"<0x")
                && bytes[5] == b'>'
                && bytes[3..5].iter().all(u8::is_ascii_hexdigit)
        })
    }

    fn decode(&self, start: usize, end: usize) -> Result<String> {
        if start >= end {
            return Ok(String::new());
        }
        self.tokenizer
            .decode(&self.ids[start..end], self.skip_special)
    }
}

/// Byte length of the longest common prefix that ends on a character boundary.
fn common_prefix_len(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or(a.len().min(b.len()), |((i, _), _)| i)
}
