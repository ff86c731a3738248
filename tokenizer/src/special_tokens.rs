//! BOS, EOS and the set of tokens that end generation, merged from every source a checkpoint
//! ships.
//!
//! Checkpoints disagree with themselves: `tokenizer_config.json` may name one EOS,
//! `generation_config.json` a list, GGUF an `eos` plus an `eot`. Generation must stop on any of
//! them, so every source adds to one set instead of overriding the others.

use std::collections::BTreeSet;

/// Token texts that end a turn in the chat formats we know. They join the stop set only when
/// the vocabulary has them as special (control) tokens, so a plain-text `</s>` never stops.
const END_OF_TURN_TEXTS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|end|>",
    "<|endoftext|>",
    "<|return|>",
    "</s>",
    "<eos>",
];

/// The special ids of one vocabulary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning of sequence, if the vocabulary has one.
    pub bos: Option<u32>,
    /// Every id named as end of sequence, by any source, in ascending order.
    pub eos: BTreeSet<u32>,
    /// Every id that ends generation: `eos` plus end-of-turn and end-of-message tokens.
    pub stop: BTreeSet<u32>,
    /// Padding, if named.
    pub pad: Option<u32>,
    /// Unknown-token id, if the vocabulary has one.
    pub unk: Option<u32>,
    /// Whether plain encoding prepends `bos` (the checkpoint's `add_bos_token`).
    pub add_bos: bool,
    /// Whether plain encoding appends an EOS (the checkpoint's `add_eos_token`).
    pub add_eos: bool,
}

impl SpecialTokens {
    /// Records `id` as an end-of-sequence token (it also stops generation).
    pub fn add_eos(&mut self, id: u32) {
        self.eos.insert(id);
        self.stop.insert(id);
    }

    /// Records `id` as a token that stops generation without being EOS (end of turn, of message).
    pub fn add_stop(&mut self, id: u32) {
        self.stop.insert(id);
    }

    /// Sets BOS unless an earlier, more authoritative source already did.
    pub(crate) fn bos_if_unset(&mut self, id: Option<u32>) {
        if self.bos.is_none() {
            self.bos = id;
        }
    }

    /// Adds the known end-of-turn tokens that `special_id` reports as special in this vocabulary.
    pub(crate) fn add_known_end_of_turn(&mut self, special_id: impl Fn(&str) -> Option<u32>) {
        for text in END_OF_TURN_TEXTS {
            if let Some(id) = special_id(text) {
                self.stop.insert(id);
            }
        }
    }
}
