//! Builds an HF `tokenizers::Tokenizer` from GGUF vocabulary metadata.
//!
//! Both GGUF vocabulary kinds become the same HF pipeline, so one encode/decode path serves
//! GGUF and `tokenizer.json` checkpoints alike:
//! - `gpt2`: byte-level BPE with the stored merges, split first by the regexes that
//!   `tokenizer.ggml.pre` names ([`PreTokenizerSpec`]).
//! - `gemma4`: SentencePiece-style BPE (raw UTF-8, `▁` for spaces) with stored merges, split
//!   only at line breaks, with byte fallback.
//! - `llama`: SentencePiece BPE. GGUF stores scores instead of merges; SentencePiece merges the
//!   adjacent pair whose joined text is the highest-scoring token, so every split of every token
//!   into two tokens becomes a merge ranked by the joined token's score. Characters outside the
//!   vocabulary fall back to `<0xXX>` byte tokens.
//!
//! Token types decide how each token is matched: control and unknown tokens become special
//! added tokens, user-defined ones plain added tokens (matched in any text, as llama.cpp does).

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior,
};

use crate::error::{Error, Result};
use crate::pre_tokenizer::PreTokenizerSpec;
use crate::special_tokens::SpecialTokens;
use crate::{GgufMetadata, MetaValue};

/// GGUF token types (`tokenizer.ggml.token_type`), as llama.cpp numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    fn from_code(code: i64) -> Option<Self> {
        Some(match code {
            // 0 is "undefined" in older converters; llama.cpp treats it as normal text.
            0 | 1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }
}

/// What a GGUF vocabulary yields besides the HF tokenizer itself.
pub(crate) struct GgufVocab {
    pub(crate) tokenizer: tokenizers::Tokenizer,
    pub(crate) specials: SpecialTokens,
    pub(crate) chat_template: Option<String>,
}

const SPACE_MARK: &str = "\u{2581}";

/// Builds the tokenizer described by `meta`'s `tokenizer.*` keys.
pub(crate) fn build_gguf_vocab(meta: &GgufMetadata) -> Result<GgufVocab> {
    let model = required_str(meta, "tokenizer.ggml.model")?;
    if !matches!(model, "gpt2" | "llama" | "gemma4") {
        return Err(Error::UnsupportedModel(model.to_string()));
    }
    let tokens = string_array(meta, "tokenizer.ggml.tokens")?
        .ok_or_else(|| Error::MissingKey("tokenizer.ggml.tokens".into()))?;
    let types = token_types(meta, tokens.len())?;
    let mut specials = SpecialTokens::default();
    let mut tokenizer = match model {
        "gpt2" => {
            // llama.cpp's defaults for BPE vocabularies before the file's own keys apply.
            specials.add_bos = false;
            build_byte_level_bpe(meta, &tokens)?
        }
        "llama" => {
            specials.add_bos = true;
            specials.bos = Some(1);
            specials.add_eos(2);
            specials.unk = Some(0);
            build_sentencepiece_bpe(meta, &tokens, &types)?
        }
        "gemma4" => build_sentencepiece_merges_bpe(meta, &tokens)?,
        other => return Err(Error::UnsupportedModel(other.to_string())),
    };
    register_added_tokens(&mut tokenizer, &tokens, &types)?;
    read_special_ids(meta, &tokens, &mut specials)?;
    let is_special = |text: &str| {
        let id = tokens.iter().position(|t| *t == text)?;
        matches!(types[id], TokenType::Control | TokenType::UserDefined)
            .then_some(u32::try_from(id).ok()?)
    };
    specials.add_known_end_of_turn(is_special);
    let chat_template = optional_str(meta, "tokenizer.chat_template")?.map(str::to_string);
    Ok(GgufVocab {
        tokenizer,
        specials,
        chat_template,
    })
}

fn build_byte_level_bpe(meta: &GgufMetadata, tokens: &[&str]) -> Result<tokenizers::Tokenizer> {
    let merges = stored_merges(meta)?;
    let pre = optional_str(meta, "tokenizer.ggml.pre")?.unwrap_or("default");
    let spec = PreTokenizerSpec::for_name(pre)?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_map(tokens), merges)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(Error::tokenizers)?;
    let mut pre_tokenizers = spec.splits()?;
    pre_tokenizers.push(ByteLevel::new(false, false, false).into());
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(PreTokenizerSequence::new(pre_tokenizers)));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    Ok(tokenizer)
}

/// `tokenizer.ggml.merges`: "left right" pairs, best first.
fn stored_merges(meta: &GgufMetadata) -> Result<Vec<(String, String)>> {
    let merges = string_array(meta, "tokenizer.ggml.merges")?
        .ok_or_else(|| Error::MissingKey("tokenizer.ggml.merges".into()))?;
    merges
        .iter()
        .enumerate()
        .map(|(i, merge)| {
            // Split at the first space after the first character: a merge may start with a
            // space in vocabularies that don't byte-encode it.
            let first_len = merge.chars().next().map_or(0, char::len_utf8);
            merge[first_len..]
                .find(' ')
                .map(|at| first_len + at)
                .map(|at| (merge[..at].to_string(), merge[at + 1..].to_string()))
                .ok_or_else(|| {
                    Error::bad_key(
                        "tokenizer.ggml.merges",
                        format!("merge {i} `{merge}` has no space"),
                    )
                })
        })
        .collect()
}

/// Gemma 4: BPE over raw UTF-8 with `▁` for spaces and stored merges, split only at line
/// breaks; bytes outside the vocabulary fall back to `<0xXX>` tokens.
fn build_sentencepiece_merges_bpe(
    meta: &GgufMetadata,
    tokens: &[&str],
) -> Result<tokenizers::Tokenizer> {
    let merges = stored_merges(meta)?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_map(tokens), merges)
        .byte_fallback(true)
        .build()
        .map_err(Error::tokenizers)?;
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer
        .with_normalizer(Some(
            Replace::new(" ", SPACE_MARK).map_err(Error::tokenizers)?,
        ))
        .map_err(Error::tokenizers)?;
    let lines = Split::new(
        SplitPattern::Regex(r"[^\n]+|[\n]+".into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(Error::tokenizers)?;
    tokenizer.with_pre_tokenizer(Some(lines));
    let decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE_MARK, " ")
            .map_err(Error::tokenizers)?
            .into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

fn build_sentencepiece_bpe(
    meta: &GgufMetadata,
    tokens: &[&str],
    types: &[TokenType],
) -> Result<tokenizers::Tokenizer> {
    let scores = float_array(meta, "tokenizer.ggml.scores")?
        .ok_or_else(|| Error::MissingKey("tokenizer.ggml.scores".into()))?;
    if scores.len() != tokens.len() {
        return Err(Error::bad_key(
            "tokenizer.ggml.scores",
            format!("{} scores for {} tokens", scores.len(), tokens.len()),
        ));
    }
    let merges = merges_from_scores(tokens, types, &scores);
    let unk = optional_id(meta, "tokenizer.ggml.unknown_token_id", tokens.len())?.unwrap_or(0);
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab_map(tokens), merges)
        .byte_fallback(true);
    if let Some(unk_text) = tokens.get(unk as usize) {
        builder = builder.unk_token((*unk_text).to_string()).fuse_unk(true);
    }
    let bpe = builder.build().map_err(Error::tokenizers)?;
    let add_space_prefix = optional_bool(meta, "tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if add_space_prefix {
        normalizers.push(Prepend::new(SPACE_MARK.to_string()).into());
    }
    normalizers.push(
        Replace::new(" ", SPACE_MARK)
            .map_err(Error::tokenizers)?
            .into(),
    );
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE_MARK, " ")
            .map_err(Error::tokenizers)?
            .into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        // The prefix space the encoder invented is not part of the text.
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer
        .with_normalizer(Some(NormalizerSequence::new(normalizers)))
        .map_err(Error::tokenizers)?;
    tokenizer.with_pre_tokenizer(None::<PreTokenizerWrapper>);
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// SentencePiece merges, best first: each way of writing a token as two shorter tokens, ranked
/// by the joined token's score (then its id, then the split point, for a stable order).
fn merges_from_scores(
    tokens: &[&str],
    types: &[TokenType],
    scores: &[f64],
) -> Vec<(String, String)> {
    let index: HashMap<&str, u32> = vocab_lookup(tokens);
    let mut ranked: Vec<(f64, u32, usize, &str, &str)> = Vec::new();
    for (id, (&text, &ty)) in tokens.iter().zip(types).enumerate() {
        if ty == TokenType::Byte {
            continue;
        }
        for (split, _) in text.char_indices().skip(1) {
            let (left, right) = text.split_at(split);
            if index.contains_key(left) && index.contains_key(right) {
                ranked.push((scores[id], id as u32, split, left, right));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    ranked
        .into_iter()
        .map(|(_, _, _, l, r)| (l.to_string(), r.to_string()))
        .collect()
}

/// Text → id, keeping the first id of any text that appears twice (llama.cpp does the same).
fn vocab_lookup<'a>(tokens: &[&'a str]) -> HashMap<&'a str, u32> {
    let mut map = HashMap::with_capacity(tokens.len());
    for (id, text) in tokens.iter().enumerate() {
        map.entry(*text).or_insert(id as u32);
    }
    map
}

fn vocab_map(tokens: &[&str]) -> tokenizers::models::bpe::Vocab {
    vocab_lookup(tokens)
        .into_iter()
        .map(|(text, id)| (text.to_string(), id))
        .collect()
}

fn register_added_tokens(
    tokenizer: &mut tokenizers::Tokenizer,
    tokens: &[&str],
    types: &[TokenType],
) -> Result<()> {
    let mut special = Vec::new();
    let mut plain = Vec::new();
    for (&text, &ty) in tokens.iter().zip(types) {
        if text.is_empty() {
            continue;
        }
        match ty {
            TokenType::Control | TokenType::Unknown => {
                special.push(AddedToken::from(text, true).normalized(false));
            }
            TokenType::UserDefined => plain.push(AddedToken::from(text, false).normalized(false)),
            _ => {}
        }
    }
    tokenizer
        .add_special_tokens(special)
        .map_err(Error::tokenizers)?;
    tokenizer.add_tokens(plain).map_err(Error::tokenizers)?;
    Ok(())
}

fn read_special_ids(
    meta: &GgufMetadata,
    tokens: &[&str],
    specials: &mut SpecialTokens,
) -> Result<()> {
    let n = tokens.len();
    if let Some(bos) = optional_id(meta, "tokenizer.ggml.bos_token_id", n)? {
        specials.bos = Some(bos);
    }
    if let Some(eos) = optional_id(meta, "tokenizer.ggml.eos_token_id", n)? {
        // The file's EOS replaces the vocabulary kind's default, not joins it.
        specials.eos.clear();
        specials.stop.clear();
        specials.add_eos(eos);
    }
    for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(id) = optional_id(meta, key, n)? {
            specials.add_stop(id);
        }
    }
    if let Some(unk) = optional_id(meta, "tokenizer.ggml.unknown_token_id", n)? {
        specials.unk = Some(unk);
    }
    specials.pad = optional_id(meta, "tokenizer.ggml.padding_token_id", n)?;
    if let Some(add) = optional_bool(meta, "tokenizer.ggml.add_bos_token")? {
        specials.add_bos = add;
    }
    if let Some(add) = optional_bool(meta, "tokenizer.ggml.add_eos_token")? {
        specials.add_eos = add;
    }
    if specials.add_bos && specials.bos.is_none() {
        return Err(Error::bad_key(
            "tokenizer.ggml.add_bos_token",
            "set, but no BOS id is given",
        ));
    }
    Ok(())
}

fn required_str<'a>(meta: &'a GgufMetadata, key: &str) -> Result<&'a str> {
    optional_str(meta, key)?.ok_or_else(|| Error::MissingKey(key.to_string()))
}

fn optional_str<'a>(meta: &'a GgufMetadata, key: &str) -> Result<Option<&'a str>> {
    meta.get(key)
        .map(|v| {
            v.as_str()
                .ok_or_else(|| Error::bad_key(key, "expected a string"))
        })
        .transpose()
}

fn optional_bool(meta: &GgufMetadata, key: &str) -> Result<Option<bool>> {
    meta.get(key)
        .map(|v| {
            v.as_bool()
                .ok_or_else(|| Error::bad_key(key, "expected a boolean"))
        })
        .transpose()
}

/// A token id key; ids past the vocabulary are an error, except llama.cpp's "none" markers
/// (-1 or `u32::MAX`), which read as absent.
fn optional_id(meta: &GgufMetadata, key: &str, vocab_size: usize) -> Result<Option<u32>> {
    let Some(value) = meta.get(key) else {
        return Ok(None);
    };
    let id = value
        .as_i64()
        .ok_or_else(|| Error::bad_key(key, "expected an integer"))?;
    if id == -1 || id == i64::from(u32::MAX) {
        return Ok(None);
    }
    match u32::try_from(id) {
        Ok(id) if (id as usize) < vocab_size => Ok(Some(id)),
        _ => Err(Error::bad_key(
            key,
            format!("id {id} is outside the vocabulary of {vocab_size}"),
        )),
    }
}

fn array<'a>(meta: &'a GgufMetadata, key: &str) -> Result<Option<&'a [MetaValue]>> {
    meta.get(key)
        .map(|v| {
            v.as_array()
                .ok_or_else(|| Error::bad_key(key, "expected an array"))
        })
        .transpose()
}

fn string_array<'a>(meta: &'a GgufMetadata, key: &str) -> Result<Option<Vec<&'a str>>> {
    let Some(items) = array(meta, key)? else {
        return Ok(None);
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str()
                .ok_or_else(|| Error::bad_key(key, format!("element {i} is not a string")))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn float_array(meta: &GgufMetadata, key: &str) -> Result<Option<Vec<f64>>> {
    let Some(items) = array(meta, key)? else {
        return Ok(None);
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_f64()
                .ok_or_else(|| Error::bad_key(key, format!("element {i} is not a number")))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn token_types(meta: &GgufMetadata, count: usize) -> Result<Vec<TokenType>> {
    let key = "tokenizer.ggml.token_type";
    let Some(items) = array(meta, key)? else {
        return Ok(vec![TokenType::Normal; count]);
    };
    if items.len() != count {
        return Err(Error::bad_key(
            key,
            format!("{} types for {count} tokens", items.len()),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_i64().and_then(TokenType::from_code).ok_or_else(|| {
                Error::bad_key(key, format!("element {i} is not a known token type"))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_gguf_metadata;
    use crate::vocab::Tokenizer;

    /// `gguf::Writer` with one method per kind of pair these tests write.
    struct GgufWriter(gguf::Writer);

    impl GgufWriter {
        fn new() -> Self {
            GgufWriter(gguf::Writer::default())
        }

        fn pair(self, key: &str, value: MetaValue) -> Self {
            GgufWriter(self.0.meta(key, value))
        }

        fn string(self, key: &str, v: &str) -> Self {
            self.pair(key, MetaValue::String(v.into()))
        }

        fn u32(self, key: &str, v: u32) -> Self {
            self.pair(key, MetaValue::U32(v))
        }

        fn bool(self, key: &str, v: bool) -> Self {
            self.pair(key, MetaValue::Bool(v))
        }

        fn strings(self, key: &str, v: &[&str]) -> Self {
            let items = v.iter().map(|s| MetaValue::String(s.to_string()));
            self.pair(key, MetaValue::Array(items.collect()))
        }

        fn f32s(self, key: &str, v: &[f32]) -> Self {
            self.pair(
                key,
                MetaValue::Array(v.iter().copied().map(MetaValue::F32).collect()),
            )
        }

        fn i32s(self, key: &str, v: &[i32]) -> Self {
            self.pair(
                key,
                MetaValue::Array(v.iter().copied().map(MetaValue::I32).collect()),
            )
        }

        fn finish(self) -> Vec<u8> {
            self.0.build()
        }
    }

    fn spm(scores: &[f32]) -> GgufWriter {
        GgufWriter::new()
            .string("tokenizer.ggml.model", "llama")
            .strings(
                "tokenizer.ggml.tokens",
                &["<unk>", "<s>", "</s>", "a", "b", "c", "ab", "bc"],
            )
            .f32s("tokenizer.ggml.scores", scores)
            .i32s("tokenizer.ggml.token_type", &[2, 3, 3, 1, 1, 1, 1, 1])
            .bool("tokenizer.ggml.add_space_prefix", false)
    }

    fn build(writer: GgufWriter) -> Result<Tokenizer> {
        Tokenizer::from_gguf_metadata(&parse_gguf_metadata(&writer.finish()).unwrap())
    }

    #[test]
    fn sentencepiece_merges_follow_scores() {
        let ab_first = build(spm(&[0.0, 0.0, 0.0, -1.0, -1.0, -1.0, -2.0, -3.0])).unwrap();
        assert_eq!(ab_first.encode("abc", false).unwrap(), [6, 5]);
        let bc_first = build(spm(&[0.0, 0.0, 0.0, -1.0, -1.0, -1.0, -3.0, -2.0])).unwrap();
        assert_eq!(bc_first.encode("abc", false).unwrap(), [3, 7]);
        // llama defaults: BOS 1 added, EOS 2.
        assert_eq!(bc_first.encode("abc", true).unwrap(), [1, 3, 7]);
        assert!(bc_first.is_stop(2));
        assert_eq!(bc_first.decode(&[1, 3, 7], true).unwrap(), "abc");
    }

    #[test]
    fn byte_level_bpe_uses_stored_merges() {
        let tok = build(
            GgufWriter::new()
                .string("tokenizer.ggml.model", "gpt2")
                .string("tokenizer.ggml.pre", "gpt-2")
                .strings("tokenizer.ggml.tokens", &["a", "b", "ab", "<|endoftext|>"])
                .i32s("tokenizer.ggml.token_type", &[1, 1, 1, 3])
                .strings("tokenizer.ggml.merges", &["a b"])
                .u32("tokenizer.ggml.eos_token_id", 3),
        )
        .unwrap();
        assert_eq!(tok.encode("abab<|endoftext|>", true).unwrap(), [2, 2, 3]);
        assert_eq!(tok.eos().iter().copied().collect::<Vec<_>>(), [3]);
        assert_eq!(tok.decode(&[2, 0, 3], true).unwrap(), "aba");
    }

    #[test]
    fn bad_metadata_is_an_error_naming_the_key() {
        let err = |w: GgufWriter| build(w).unwrap_err().to_string();
        assert!(err(GgufWriter::new()).contains("tokenizer.ggml.model"));
        assert!(err(GgufWriter::new().string("tokenizer.ggml.model", "rwkv")).contains("rwkv"));
        assert!(
            err(GgufWriter::new().string("tokenizer.ggml.model", "llama"))
                .contains("tokenizer.ggml.tokens")
        );
        assert!(err(spm(&[0.0; 3])).contains("3 scores for 8 tokens"));
        assert!(
            err(spm(&[0.0; 8]).u32("tokenizer.ggml.bos_token_id", 99))
                .contains("outside the vocabulary")
        );
        let bad_type = GgufWriter::new()
            .string("tokenizer.ggml.model", "llama")
            .strings("tokenizer.ggml.tokens", &["a"])
            .f32s("tokenizer.ggml.scores", &[0.0])
            .i32s("tokenizer.ggml.token_type", &[42]);
        assert!(err(bad_type).contains("token type"));
        let gpt2 = || {
            GgufWriter::new()
                .string("tokenizer.ggml.model", "gpt2")
                .strings("tokenizer.ggml.tokens", &["a", "b", "ab"])
        };
        assert!(err(gpt2()).contains("tokenizer.ggml.merges"));
        assert!(err(gpt2().strings("tokenizer.ggml.merges", &["ab"])).contains("has no space"));
        assert!(
            err(gpt2()
                .strings("tokenizer.ggml.merges", &["a b"])
                .string("tokenizer.ggml.pre", "zz"))
            .contains("zz")
        );
        assert!(
            err(gpt2()
                .strings("tokenizer.ggml.merges", &["a b"])
                .u32("tokenizer.ggml.pre", 1))
            .contains("string")
        );
    }

    #[test]
    fn none_markers_read_as_absent() {
        let tok = build(spm(&[0.0; 8]).u32("tokenizer.ggml.padding_token_id", u32::MAX)).unwrap();
        assert_eq!(tok.special_tokens().pad, None);
    }
}
