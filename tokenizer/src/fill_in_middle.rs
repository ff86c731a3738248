//! Fill-in-the-middle prompts (Ollama's `suffix`): code models trained to write what goes
//! between a prefix and a suffix mark the three parts with special tokens. The vocabulary says
//! whether a model was trained so, and with which spelling.

use crate::error::Result;
use crate::vocab::Tokenizer;

/// The marker spellings of the families we know, as (prefix, suffix, middle): StarCoder's and
/// SmolLM's, Qwen2.5-Coder's and CodeGemma's, and DeepSeek-Coder's.
const MARKERS: &[(&str, &str, &str)] = &[
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
];

/// The ids of a vocabulary's fill-in-the-middle markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillInMiddle {
    /// Opens the text before the gap.
    pub prefix: u32,
    /// Opens the text after the gap.
    pub suffix: u32,
    /// Asks for the gap.
    pub middle: u32,
}

impl FillInMiddle {
    /// The markers of `tokenizer`, when it has all three of one known spelling.
    pub fn of(tokenizer: &Tokenizer) -> Option<Self> {
        MARKERS.iter().find_map(|(prefix, suffix, middle)| {
            Some(Self {
                prefix: tokenizer.token_to_id(prefix)?,
                suffix: tokenizer.token_to_id(suffix)?,
                middle: tokenizer.token_to_id(middle)?,
            })
        })
    }

    /// The prompt asking for what goes between `before` and `after`, in the
    /// prefix-suffix-middle order these models were trained on.
    pub fn prompt(&self, tokenizer: &Tokenizer, before: &str, after: &str) -> Result<Vec<u32>> {
        let mut tokens = Vec::new();
        tokens.extend(
            tokenizer
                .bos()
                .filter(|_| tokenizer.special_tokens().add_bos),
        );
        tokens.push(self.prefix);
        tokens.extend(tokenizer.encode(before, false)?);
        tokens.push(self.suffix);
        tokens.extend(tokenizer.encode(after, false)?);
        tokens.push(self.middle);
        Ok(tokens)
    }
}
