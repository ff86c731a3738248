//! One request's constraint, stepped token by token: the allowed-token mask, consumption,
//! rollback for speculative decoding, and whether the output may end here.

use std::sync::Arc;

use llguidance::Matcher;

use crate::error::compiler_message;
use crate::{Error, Result};

/// A compiled grammar positioned somewhere in the output.
///
/// Masks use llguidance's layout, which the sampler takes as is: bit `i % 32` of word `i / 32`
/// set means token `i` may come next. End tokens are set exactly when the output so far is
/// complete.
pub struct Grammar {
    matcher: Matcher,
    vocab_size: usize,
    ends: Arc<[u32]>,
    /// End tokens consumed after the matcher had already stopped; llguidance does not record
    /// those, so rollback must undo them here first.
    ends_after_stop: usize,
    /// The mask at the start of the output, computed when compiling; dropped on the first
    /// [`Grammar::mask`] or any move.
    start_mask: Option<Vec<u32>>,
}

impl Grammar {
    /// A grammar at the start of the output, with its first mask computed now (by the
    /// compiling thread, so that the step loop does not pay for the cold lexer) and kept for
    /// the first [`Grammar::mask`]. Fails when no token can start the output.
    pub(crate) fn start(matcher: Matcher, vocab_size: usize, ends: Arc<[u32]>) -> Result<Self> {
        let mut grammar = Self {
            matcher,
            vocab_size,
            ends,
            ends_after_stop: 0,
            start_mask: None,
        };
        grammar.start_mask = Some(grammar.mask()?);
        Ok(grammar)
    }

    /// The tokens allowed next, `vocab_size().div_ceil(32)` words. Once the grammar is
    /// finished only the end tokens are allowed.
    pub fn mask(&mut self) -> Result<Vec<u32>> {
        if let Some(words) = self.start_mask.take() {
            return Ok(words);
        }
        let vob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| Error::Matcher(compiler_message(&e.to_string())))?;
        let mut words = vob.as_slice().to_vec();
        words.resize(self.vocab_size.div_ceil(32), 0);
        Ok(words)
    }

    /// Advances past `token`. A token the grammar does not allow is an error that leaves the
    /// state unchanged.
    pub fn consume(&mut self, token: u32) -> Result<()> {
        self.start_mask = None;
        let rejected = |message: &str| Error::TokenRejected {
            token,
            message: message.to_string(),
        };
        if token as usize >= self.vocab_size {
            return Err(rejected(&format!(
                "outside the vocabulary of {}",
                self.vocab_size
            )));
        }
        if let Some(message) = self.matcher.get_error() {
            return Err(Error::Matcher(compiler_message(&message)));
        }
        if self.matcher.is_stopped() {
            return if self.ends.contains(&token) {
                self.ends_after_stop += 1;
                Ok(())
            } else {
                Err(rejected(
                    "the output is complete; only an end token may follow",
                ))
            };
        }
        // Validating first keeps a rejected token from putting the matcher in its terminal
        // error state.
        let valid = self
            .matcher
            .validate_tokens(&[token])
            .map_err(|e| Error::Matcher(compiler_message(&e.to_string())))?;
        if valid == 0 {
            return Err(rejected("not allowed here"));
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| rejected(&compiler_message(&e.to_string())))
    }

    /// Undoes the last `n` consumed tokens, restoring exactly the earlier state.
    pub fn rollback(&mut self, n: usize) -> Result<()> {
        self.start_mask = None;
        let from_ends = n.min(self.ends_after_stop);
        self.matcher
            .rollback(n - from_ends)
            .map_err(|e| Error::Rollback {
                requested: n,
                message: compiler_message(&e.to_string()),
            })?;
        self.ends_after_stop -= from_ends;
        Ok(())
    }

    /// How many of `draft` the grammar would accept in a row, consuming nothing (for
    /// checking speculative drafts).
    pub fn validate(&mut self, draft: &[u32]) -> Result<usize> {
        // A token outside the vocabulary is where the valid run ends.
        let in_range = draft
            .iter()
            .position(|&t| t as usize >= self.vocab_size)
            .unwrap_or(draft.len());
        let draft = &draft[..in_range];
        if self.matcher.is_stopped() {
            return Ok(draft.iter().take_while(|t| self.ends.contains(t)).count());
        }
        self.matcher
            .validate_tokens(draft)
            .map_err(|e| Error::Matcher(compiler_message(&e.to_string())))
    }

    /// Whether the output so far is complete, so that an end token is allowed now.
    pub fn is_accepting(&mut self) -> bool {
        if self.matcher.is_error() {
            return false;
        }
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }

    /// Whether nothing but an end token can follow (the grammar has run to its end, or an
    /// end token was consumed).
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Tokens the masks cover.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// An independent copy at the same position (for trying a branch without disturbing
    /// this one).
    pub fn fork(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            vocab_size: self.vocab_size,
            ends: self.ends.clone(),
            ends_after_stop: self.ends_after_stop,
            start_mask: self.start_mask.clone(),
        }
    }
}
