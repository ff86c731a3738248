//! Comparing two vocabularies id by id, as a draft model's loader does against its target's.

use tokenizer::{HfSideFiles, Tokenizer};

/// A word-level tokenizer whose ids are `words` in order.
fn word_level(words: &[&str]) -> Tokenizer {
    let vocab: serde_json::Map<String, serde_json::Value> = words
        .iter()
        .enumerate()
        .map(|(id, w)| (w.to_string(), serde_json::json!(id)))
        .collect();
    let json = serde_json::json!({
        "version": "1.0",
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": words[0]},
        "pre_tokenizer": {"type": "Whitespace"},
    });
    let side = HfSideFiles {
        tokenizer_config: None,
        special_tokens_map: None,
        generation_config: None,
        chat_template: None,
    };
    Tokenizer::from_hf_bytes(json.to_string().as_bytes(), &side).unwrap()
}

#[test]
fn the_same_words_at_the_same_ids_are_the_same_vocabulary() {
    let a = word_level(&["<unk>", "hello", "world"]);
    let b = word_level(&["<unk>", "hello", "world"]);
    assert_eq!(a.vocabulary_difference(&b), None);
}

#[test]
fn a_difference_names_the_size_or_the_first_differing_id() {
    let target = word_level(&["<unk>", "hello", "world"]);
    let longer = word_level(&["<unk>", "hello", "world", "again"]);
    assert_eq!(
        target.vocabulary_difference(&longer).as_deref(),
        Some("4 tokens against 3")
    );
    let swapped = word_level(&["<unk>", "world", "hello"]);
    assert_eq!(
        target.vocabulary_difference(&swapped).as_deref(),
        Some("token 1 is \"world\" against \"hello\"")
    );
}
