//! The vocabulary of a real model file: SmolLM2-135M-Instruct's GGUF (`tokenizer.ggml.pre =
//! smollm`), read from its metadata without touching the tensors.

mod support;

use tokenizer::{Family, Tokenizer, read_gguf_metadata};

#[test]
fn smollm2_vocabulary_from_its_gguf() {
    let Some(path) = support::smollm2_gguf() else {
        return;
    };
    let meta = read_gguf_metadata(&path).unwrap();
    assert_eq!(meta["tokenizer.ggml.pre"].as_str(), Some("smollm"));
    assert_eq!(meta["general.architecture"].as_str(), Some("llama"));

    // The same tokenizer from the file and from metadata read elsewhere.
    let tok = Tokenizer::from_gguf_metadata(&meta).unwrap();
    let from_file = Tokenizer::from_gguf_file(&path).unwrap();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos().iter().copied().collect::<Vec<_>>(), [2]);
    assert_eq!(tok.id_to_token(2).as_deref(), Some("<|im_end|>"));
    assert!(!tok.special_tokens().add_bos);
    assert_eq!(Family::detect(&tok), Some(Family::ChatMl));
    assert!(
        tok.chat_template()
            .is_some_and(|t| t.contains("<|im_start|>"))
    );

    for text in [
        "Hello world",
        "Once upon a time, there was a little",
        "fn main() { 42 }",
        "naïve 日本 🦙",
    ] {
        let ids = tok.encode(text, true).unwrap();
        assert_eq!(ids, from_file.encode(text, true).unwrap());
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
    }
    // The smollm pre-tokenizer splits every digit.
    assert_eq!(tok.encode("12345", false).unwrap().len(), 5);
}
