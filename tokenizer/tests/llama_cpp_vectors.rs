//! GGUF-built tokenizers against llama.cpp's own test vectors (`ggml-vocab-*.gguf` with
//! `.inp`/`.out`, from the `llama_cpp_python==0.3.36` sdist).

mod support;

use tokenizer::Tokenizer;

/// Encodes every vector of `vocab`; returns (passed, total) and prints each mismatch.
fn check(vocab: &str) -> Option<(usize, usize)> {
    let models = support::llama_cpp_vocabs()?;
    let tok = Tokenizer::from_gguf_file(&models.join(format!("ggml-vocab-{vocab}.gguf")))
        .unwrap_or_else(|e| panic!("{vocab}: {e}"));
    let vectors = support::llama_cpp_vectors(&models, vocab);
    let mut passed = 0;
    for (text, expected) in &vectors {
        let got = tok.encode(text, false).unwrap();
        if &got == expected {
            passed += 1;
        } else {
            eprintln!("{vocab}: {text:?}\n  expected {expected:?}\n  got      {got:?}");
        }
    }
    println!(
        "{vocab}: {passed}/{} vectors match llama.cpp",
        vectors.len()
    );
    Some((passed, vectors.len()))
}

macro_rules! vocab_test {
    ($name:ident, $vocab:literal) => {
        #[test]
        fn $name() {
            if let Some((passed, total)) = check($vocab) {
                assert_eq!(passed, total, "{}: {passed}/{total}", $vocab);
            }
        }
    };
}

vocab_test!(llama_bpe, "llama-bpe");
vocab_test!(qwen2, "qwen2");
vocab_test!(qwen35, "qwen35");
vocab_test!(gpt_2, "gpt-2");
vocab_test!(llama_spm, "llama-spm");
vocab_test!(phi_3, "phi-3");
vocab_test!(starcoder, "starcoder");
vocab_test!(refact, "refact");
vocab_test!(command_r, "command-r");
vocab_test!(mpt, "mpt");
vocab_test!(falcon, "falcon");
vocab_test!(gemma_4, "gemma-4");
vocab_test!(deepseek_coder, "deepseek-coder");
vocab_test!(deepseek_llm, "deepseek-llm");
