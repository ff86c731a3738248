//! The vocabulary as llguidance sees it: every token's bytes in a trie, plus the end tokens.
//!
//! Decisions made here, deliberately:
//! - Token bytes come from the tokenizer's `tokenizer.json` form (byte-level BPE or
//!   byte-fallback vocabularies), which is twice as fast as going through a second `tokenizers`.
//! - Added tokens HF marks special (`<|im_start|>`, `<tool_call>` in some vocabularies) are
//!   prefixed with llguidance's special marker, so no JSON, regex or text rule can produce them;
//!   only a Lark grammar that names them (`<|tool_call|>`) can.
//! - Every token that stops generation (EOS, end of turn) is an end token of the trie, and is
//!   forced to be special even where the vocabulary forgot to say so: llguidance then allows it
//!   exactly when the grammar accepts, never as text in the middle of a string.

use std::collections::BTreeSet;
use std::sync::Arc;

use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::{Error, Result};

/// A `TokenizerEnv` over one of our tokenizers.
pub(crate) struct VocabEnv {
    trie: TokTrie,
    tokenizer: tokenizer::Tokenizer,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        // Valid UTF-8 goes through the real tokenizer; stray bytes fall back to greedy trie
        // matching. A tokenizer failure yields the greedy tokens rather than nothing.
        self.trie.tokenize_with_greedy_fallback(bytes, |text| {
            self.tokenizer
                .encode(text, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()))
        })
    }
}

/// Builds the token environment for `tokenizer`, whose serialized `tokenizer.json` form is
/// `json`.
pub(crate) fn build(tokenizer: &tokenizer::Tokenizer, json: &str) -> Result<TokEnv> {
    let json: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| Error::Vocabulary(format!("tokenizer JSON does not parse: {e}")))?;
    let mut words = token_bytes(&json)?;

    let vocab_size = words.len().max(tokenizer.vocab_size());
    words.resize(vocab_size, Vec::new());
    let vocab_u32 = u32::try_from(vocab_size)
        .map_err(|_| Error::Vocabulary(format!("{vocab_size} tokens do not fit in u32 ids")))?;

    let ends: BTreeSet<u32> = tokenizer.stop_tokens().clone();
    let first_end = *ends.first().ok_or(Error::NoEndOfSequence)?;
    if let Some(&bad) = ends.iter().find(|&&id| id >= vocab_u32) {
        return Err(Error::Vocabulary(format!(
            "end token {bad} is outside the vocabulary of {vocab_size}"
        )));
    }
    for &id in &ends {
        let word = &mut words[id as usize];
        if word.first() != Some(&TokTrie::SPECIAL_TOKEN_MARKER) {
            word.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
        }
    }

    let mut info = TokRxInfo::new(vocab_u32, first_end);
    info.tok_bos = tokenizer.bos();
    let ends: Vec<u32> = ends.into_iter().collect();
    let trie = TokTrie::from(&info, &words).with_eos_tokens(&ends);
    Ok(Arc::new(VocabEnv {
        trie,
        tokenizer: tokenizer.clone(),
    }))
}

/// llguidance's byte extraction, which asserts on a few malformed vocabularies (an unknown
/// decoder, a bad `<0x..>` entry); those panics become errors here.
fn token_bytes(json: &serde_json::Value) -> Result<Vec<Vec<u8>>> {
    let outcome = std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(json));
    match outcome {
        Ok(Ok(words)) => Ok(words),
        Ok(Err(e)) => Err(Error::Vocabulary(e.to_string())),
        Err(_) => Err(Error::Vocabulary(
            "token bytes could not be derived (unsupported decoder or malformed vocabulary)"
                .to_string(),
        )),
    }
}
