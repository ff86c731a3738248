//! GGUF-built tokenizers against the HF `tokenizer.json` of the same family, on the same texts:
//! llama.cpp's test texts plus a few of our own (code, emoji, mixed scripts, chat markup).

mod support;

use std::path::Path;

use tokenizer::Tokenizer;

const EXTRA_TEXTS: &[&str] = &[
    "fn main() {\n    println!(\"Hello, {}!\", name);\n}\n",
    "def f(x):\n\treturn x ** 2  # squared\n\n\n",
    "Emoji 🦙🔥 and flags 🇫🇷, accents: naïve café, Ελληνικά, русский, 日本語のテキスト、中文。",
    "Numbers 1234567890 3.14159 -42 1e-9 0xFF",
    "  leading and trailing spaces   ",
    "tabs\tand\r\nwindows\r\nnewlines",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
];

fn texts(models: &Path, vocab: &str) -> Vec<String> {
    let mut texts: Vec<String> = support::llama_cpp_vectors(models, vocab)
        .into_iter()
        .map(|(text, _)| text)
        .collect();
    texts.extend(EXTRA_TEXTS.iter().map(|t| t.to_string()));
    texts
}

/// Compares both tokenizers on every text; returns (passed, total) and prints each mismatch.
fn compare(name: &str, gguf: &Tokenizer, hf: &Tokenizer, texts: &[String]) -> (usize, usize) {
    let mut passed = 0;
    for text in texts {
        let a = gguf.encode(text, false).unwrap();
        let b = hf.encode(text, false).unwrap();
        if a == b {
            passed += 1;
        } else {
            eprintln!("{name}: {text:?}\n  gguf {a:?}\n  hf   {b:?}");
        }
        // Decoding agrees too, whatever the ids.
        assert_eq!(
            gguf.decode(&a, false).unwrap(),
            hf.decode(&b, false).unwrap(),
            "{name}: {text:?}"
        );
    }
    println!(
        "{name}: {passed}/{} texts give identical ids from GGUF and tokenizer.json",
        texts.len()
    );
    (passed, texts.len())
}

#[test]
fn llama3_gguf_matches_tokenizer_json() {
    let (Some(models), Some(hf_dir)) = (
        support::llama_cpp_vocabs(),
        support::lenml_tokenizer("llama3"),
    ) else {
        return;
    };
    let gguf = Tokenizer::from_gguf_file(&models.join("ggml-vocab-llama-bpe.gguf")).unwrap();
    let hf = Tokenizer::from_hf_dir(&hf_dir).unwrap();
    let (passed, total) = compare("llama3", &gguf, &hf, &texts(&models, "llama-bpe"));
    assert_eq!(passed, total);
    assert_eq!(gguf.token_to_id("<|eot_id|>"), hf.token_to_id("<|eot_id|>"));
    assert!(hf.is_stop(hf.token_to_id("<|eot_id|>").unwrap()));
}

#[test]
fn qwen3_tokenizer_json_matches_qwen2_gguf() {
    let (Some(models), Some(hf_dir)) = (
        support::llama_cpp_vocabs(),
        support::lenml_tokenizer("qwen3"),
    ) else {
        return;
    };
    let gguf = Tokenizer::from_gguf_file(&models.join("ggml-vocab-qwen2.gguf")).unwrap();
    let hf = Tokenizer::from_hf_dir(&hf_dir).unwrap();
    let (passed, total) = compare("qwen3", &gguf, &hf, &texts(&models, "qwen2"));
    assert_eq!(passed, total);
    let im_end = hf.token_to_id("<|im_end|>").unwrap();
    assert!(hf.eos().contains(&im_end));
}

#[test]
fn gemma3_gguf_matches_tokenizer_json() {
    let (Some(models), Some(gguf_head), Some(hf_dir)) = (
        support::llama_cpp_vocabs(),
        support::gemma3_gguf_head(),
        support::lenml_tokenizer("gemma3"),
    ) else {
        return;
    };
    let gguf = Tokenizer::from_gguf_file(&gguf_head).unwrap();
    let hf = Tokenizer::from_hf_dir(&hf_dir).unwrap();
    // Gemma's SentencePiece vocabulary: llama.cpp's SPM texts suit it.
    let (passed, total) = compare("gemma3", &gguf, &hf, &texts(&models, "llama-spm"));
    assert_eq!(passed, total);
    assert_eq!(gguf.bos(), hf.bos());
    assert!(hf.is_stop(hf.token_to_id("<end_of_turn>").unwrap()));
    assert!(gguf.is_stop(gguf.token_to_id("<end_of_turn>").unwrap()));
}
