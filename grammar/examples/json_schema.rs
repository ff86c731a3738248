//! Structured output with a JSON Schema: the grammar's per-step token mask, an answer that fits
//! the schema accepted token by token and ended, and one that breaks it refused at the first
//! token that cannot lead to a valid object.
//!
//! ```sh
//! cargo run --example json_schema   # from grammar
//! ```
//!
//! A real engine builds the compiler from a checkpoint's tokenizer (`tokenizer::Tokenizer`) and
//! hands each mask to the sampler before drawing. This example builds a tiny byte-level
//! vocabulary in memory (one token per byte, plus an end-of-turn token), so every token is one
//! character and the masks are easy to print.

use grammar::{Grammar, GrammarCompiler, GrammarSpec};
use serde_json::{Map, Value, json};
use tokenizer::{HfSideFiles, Tokenizer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tok = byte_level_tokenizer()?;
    let compiler = GrammarCompiler::new(&tok)?;
    let end = compiler.end_tokens().to_vec();
    println!(
        "vocabulary of {} tokens, end tokens {end:?}",
        compiler.vocab_size()
    );

    // What Ollama's `format` field would carry.
    let schema = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "temp_c": {"type": "integer"}
        },
        "required": ["city", "temp_c"],
        "additionalProperties": false
    });
    let spec = GrammarSpec::from_ollama_format(Some(&schema))?.ok_or("no grammar asked for")?;

    let mut grammar = compiler.compile(&spec)?;
    println!("allowed first: {}", allowed(&tok, &mut grammar)?);

    // An answer that fits: each token is allowed, and the end token only once it is complete.
    let answer = r#"{"city": "Oslo", "temp_c": -3}"#;
    for id in tok.encode(answer, false)? {
        grammar.consume(id)?;
    }
    println!(
        "after {answer}: accepting {}, allowed: {}",
        grammar.is_accepting(),
        allowed(&tok, &mut grammar)?
    );
    grammar.consume(end[0])?;
    println!("end token consumed: finished {}", grammar.is_finished());

    // An answer that breaks the schema: temp_c must be an integer, not a string.
    let mut grammar = compiler.compile(&spec)?;
    let wrong = r#"{"city": "Oslo", "temp_c": "cold"}"#;
    let ids = tok.encode(wrong, false)?;
    for (i, &id) in ids.iter().enumerate() {
        let mask = grammar.mask()?;
        if !is_set(&mask, id) {
            println!(
                "{wrong}: token {i} ({:?}) refused; allowed there: {}",
                tok.decode(&[id], false)?,
                allowed(&tok, &mut grammar)?
            );
            // Consuming it anyway is an error, and the grammar's state is left as it was.
            let error = grammar
                .consume(id)
                .err()
                .ok_or("the token should be rejected")?;
            println!("consume says: {error}");
            break;
        }
        grammar.consume(id)?;
    }
    Ok(())
}

fn is_set(mask: &[u32], id: u32) -> bool {
    mask[id as usize / 32] >> (id % 32) & 1 == 1
}

/// The tokens the mask allows next, as text.
fn allowed(tok: &Tokenizer, grammar: &mut Grammar) -> Result<String, Box<dyn std::error::Error>> {
    let mask = grammar.mask()?;
    let ids: Vec<u32> = (0..grammar.vocab_size() as u32)
        .filter(|&id| is_set(&mask, id))
        .collect();
    let shown: Vec<String> = ids
        .iter()
        .take(16)
        .map(|&id| tok.decode(&[id], false).map(|text| format!("{text:?}")))
        .collect::<Result<_, _>>()?;
    let more = if ids.len() > shown.len() { " …" } else { "" };
    Ok(format!("{} tokens [{}{more}]", ids.len(), shown.join(" ")))
}

/// A byte-level BPE vocabulary with no merges: ids 0..256 are the bytes, then the markers.
fn byte_level_tokenizer() -> Result<Tokenizer, tokenizer::Error> {
    let vocab: Map<String, Value> = byte_characters()
        .into_iter()
        .enumerate()
        .map(|(id, c)| (c.to_string(), json!(id)))
        .collect();
    let added: Vec<Value> = ["<|im_start|>", "<|im_end|>"]
        .iter()
        .enumerate()
        .map(|(i, content)| {
            json!({ "id": 256 + i, "content": content, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true })
        })
        .collect();
    let byte_level = json!({ "type": "ByteLevel", "add_prefix_space": false,
                             "trim_offsets": true, "use_regex": true });
    let tokenizer_json = json!({
        "version": "1.0",
        "added_tokens": added,
        "pre_tokenizer": byte_level,
        "decoder": byte_level,
        "model": { "type": "BPE", "vocab": vocab, "merges": [] },
    });
    // The end-of-turn token is what a mask allows exactly when the output is complete.
    let config = json!({ "eos_token": "<|im_end|>", "bos_token": null, "add_bos_token": false });
    let (tokenizer_json, config) = (tokenizer_json.to_string(), config.to_string());
    let side = HfSideFiles {
        tokenizer_config: Some(config.as_bytes()),
        special_tokens_map: None,
        generation_config: None,
        chat_template: None,
    };
    Tokenizer::from_hf_bytes(tokenizer_json.as_bytes(), &side)
}

/// GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for
/// characters from U+0100 on.
fn byte_characters() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b)
            } else {
                extra += 1;
                char::from_u32(255 + extra)
            }
            .unwrap_or('\u{FFFD}')
        })
        .collect()
}
