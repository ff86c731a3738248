//! The pre-tokenizer each GGUF `tokenizer.ggml.pre` value stands for.
//!
//! GGUF stores a byte-level BPE vocabulary without the split regex its tokenizer.json had; the
//! `pre` name selects it. The patterns are the ones llama.cpp applies for each name (its own
//! adaptation of the tokenizer.json regexes: case-insensitive contractions spelled out as
//! character classes), applied one after another, each splitting the pieces the previous left.

use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::{Error, Result};

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek LLM: letters of Latin, Greek, Cyrillic and other cased scripts as llama.cpp lists
/// them, ASCII and full-width punctuation, trailing whitespace, CJK, numbers.
const DEEPSEEK_LLM: &[&str] = &[
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
];

/// How a byte-level BPE vocabulary splits text before merging.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PreTokenizerSpec {
    /// Regexes applied in order; every piece of text, matched or not, stays a piece.
    pub(crate) patterns: &'static [&'static str],
    /// Whether a word found whole in the vocabulary skips merging (Llama 3's `ignore_merges`).
    pub(crate) ignore_merges: bool,
}

impl PreTokenizerSpec {
    /// The spec for a `tokenizer.ggml.pre` value; unknown names are an error rather than a
    /// silent fallback, because a wrong split yields valid-looking but wrong ids.
    pub(crate) fn for_name(pre: &str) -> Result<Self> {
        let (patterns, ignore_merges): (&'static [&'static str], bool) = match pre {
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" => (&[LLAMA3], true),
            "dbrx" | "smaug-bpe" => (&[LLAMA3], false),
            "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "hunyuan" | "grok-2" => (&[QWEN2], false),
            "qwen35" => (&[QWEN35], false),
            "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "trillion" | "roberta-bpe"
            | "jina-es" | "jina-de" | "jina-v2-es" | "jina-v2-de" | "mellum" => (&[GPT2], false),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => (&[r"\p{N}", GPT2], false),
            "deepseek-llm" => (DEEPSEEK_LLM, false),
            "deepseek-coder" => (
                &[
                    r"[\r\n]",
                    r"\s?\p{L}+",
                    r"\s?\p{P}+",
                    "[一-龥ࠀ-一가-퟿]+",
                    r"\p{N}",
                ],
                false,
            ),
            "falcon" => (&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"], false),
            "default" => (
                &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
                false,
            ),
            other => {
                return Err(Error::bad_key(
                    "tokenizer.ggml.pre",
                    format!("pre-tokenizer `{other}` is not one we know the split regex of"),
                ));
            }
        };
        Ok(PreTokenizerSpec {
            patterns,
            ignore_merges,
        })
    }

    /// The regex splits as HF pre-tokenizers, in order.
    pub(crate) fn splits(&self) -> Result<Vec<PreTokenizerWrapper>> {
        self.patterns
            .iter()
            .map(|pattern| {
                Split::new(
                    SplitPattern::Regex((*pattern).to_string()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map(PreTokenizerWrapper::from)
                .map_err(Error::tokenizers)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_pattern_compiles() {
        for pre in [
            "llama-bpe",
            "qwen2",
            "qwen35",
            "gpt-2",
            "smollm",
            "falcon",
            "default",
            "dbrx",
        ] {
            let spec = PreTokenizerSpec::for_name(pre).unwrap();
            assert_eq!(spec.splits().unwrap().len(), spec.patterns.len(), "{pre}");
        }
    }

    #[test]
    fn unknown_names_are_refused() {
        let err = PreTokenizerSpec::for_name("made-up")
            .unwrap_err()
            .to_string();
        assert!(err.contains("made-up"), "{err}");
    }
}
