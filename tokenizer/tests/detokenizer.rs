//! Streamed pieces concatenate to the full decode, for random id sequences and for encodings of
//! random text, on a synthetic SentencePiece vocabulary (always) and on real vocabularies
//! (when the fixtures are available).

mod support;

use std::sync::OnceLock;

use proptest::prelude::*;
use tokenizer::{Detokenizer, GgufMetadata, MetaValue, Tokenizer};

/// A tiny SentencePiece vocabulary with byte fallback: `<unk> <s> </s>`, 256 byte tokens, then
/// word pieces including multi-byte characters.
fn synthetic_spm() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![2, 3, 3];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
        }
        for piece in [
            "▁",
            "a",
            "b",
            "c",
            "é",
            "日",
            "本",
            "ab",
            "▁a",
            "▁ab",
            "▁日本",
            "日本",
            "!",
            "▁Hello",
            "H",
            "e",
            "l",
            "o",
            "He",
            "ll",
            "Hell",
            "Hello",
            "▁H",
        ] {
            tokens.push(piece.into());
            types.push(1);
        }
        let scores: Vec<MetaValue> = (0..tokens.len())
            .map(|i| MetaValue::F32(-(i as f32)))
            .collect();
        let mut meta = GgufMetadata::new();
        meta.insert(
            "tokenizer.ggml.model".into(),
            MetaValue::String("llama".into()),
        );
        meta.insert(
            "tokenizer.ggml.tokens".into(),
            MetaValue::Array(tokens.into_iter().map(MetaValue::String).collect()),
        );
        meta.insert("tokenizer.ggml.scores".into(), MetaValue::Array(scores));
        meta.insert(
            "tokenizer.ggml.token_type".into(),
            MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()),
        );
        Tokenizer::from_gguf_metadata(&meta).unwrap()
    })
}

fn real_vocabs() -> &'static Vec<(&'static str, Tokenizer)> {
    static TOKS: OnceLock<Vec<(&'static str, Tokenizer)>> = OnceLock::new();
    TOKS.get_or_init(|| {
        let mut out = Vec::new();
        if let Some(dir) = support::lenml_tokenizer("llama3") {
            out.push(("llama3", Tokenizer::from_hf_dir(&dir).unwrap()));
        }
        if let Some(dir) = support::lenml_tokenizer("gemma3") {
            out.push(("gemma3", Tokenizer::from_hf_dir(&dir).unwrap()));
        }
        if let Some(models) = support::llama_cpp_vocabs() {
            out.push((
                "llama-spm",
                Tokenizer::from_gguf_file(&models.join("ggml-vocab-llama-spm.gguf")).unwrap(),
            ));
        }
        out
    })
}

fn streamed(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> String {
    let mut detok = Detokenizer::new(tok, skip_special);
    let mut text = String::new();
    for &id in ids {
        text.push_str(&detok.push(id).unwrap());
    }
    text.push_str(&detok.finish().unwrap());
    text
}

#[test]
fn multi_token_characters_are_released_whole() {
    let tok = synthetic_spm();
    // "€" has no piece: it is three byte tokens.
    let ids = tok.encode("a€b", false).unwrap();
    let mut detok = Detokenizer::new(tok, true);
    let pieces: Vec<String> = ids.iter().map(|&id| detok.push(id).unwrap()).collect();
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    assert!(pieces.iter().any(|p| p.contains('€')), "{pieces:?}");
    assert_eq!(pieces.concat() + &detok.finish().unwrap(), "a€b");
}

#[test]
fn sentencepiece_spaces_survive_streaming() {
    let tok = synthetic_spm();
    let ids = tok.encode("Hello ab 日本", false).unwrap();
    assert_eq!(streamed(tok, &ids, true), "Hello ab 日本");
    // With the prompt as context, the first generated word keeps its space.
    let prompt = tok.encode("Hello", false).unwrap();
    let reply = tok.encode("Hello ab", false).unwrap()[prompt.len()..].to_vec();
    let mut detok = Detokenizer::with_context(tok, true, &prompt);
    let text: String = reply.iter().map(|&id| detok.push(id).unwrap()).collect();
    assert_eq!(text + &detok.finish().unwrap(), " ab");
}

#[test]
fn unfinished_character_is_flushed_at_the_end() {
    let tok = synthetic_spm();
    let e2 = tok.token_to_id("<0xE2>").unwrap();
    let a = tok.token_to_id("a").unwrap();
    assert_eq!(
        streamed(tok, &[a, e2], true),
        tok.decode(&[a, e2], true).unwrap()
    );
    assert!(streamed(tok, &[a, e2], true).ends_with('\u{FFFD}'));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn synthetic_random_ids_stream_to_the_full_decode(
        ids in prop::collection::vec(0u32..282, 0..40),
        skip in any::<bool>(),
    ) {
        let tok = synthetic_spm();
        prop_assert_eq!(streamed(tok, &ids, skip), tok.decode(&ids, skip).unwrap());
    }

    #[test]
    fn synthetic_text_round_trips_through_the_stream(text in "[abcé日本€🦙 !H]{0,24}") {
        let tok = synthetic_spm();
        let ids = tok.encode(&text, false).unwrap();
        prop_assert_eq!(streamed(tok, &ids, true), tok.decode(&ids, true).unwrap());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn real_random_ids_stream_to_the_full_decode(
        raw in prop::collection::vec(any::<u32>(), 0..48),
        low_ids in any::<bool>(),
        skip in any::<bool>(),
    ) {
        for (name, tok) in real_vocabs() {
            // Low ids are single bytes in these vocabularies: the hardest case.
            let bound = if low_ids { 600 } else { tok.vocab_size() as u32 };
            let ids: Vec<u32> = raw.iter().map(|r| r % bound).collect();
            prop_assert_eq!(streamed(tok, &ids, skip), tok.decode(&ids, skip).unwrap(), "{}", name);
        }
    }

    #[test]
    fn real_text_streams_back(text in "\\PC{0,40}") {
        for (name, tok) in real_vocabs() {
            let ids = tok.encode(&text, false).unwrap();
            prop_assert_eq!(streamed(tok, &ids, true), tok.decode(&ids, true).unwrap(), "{}", name);
        }
    }
}
