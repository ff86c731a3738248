//! One chat request from text to events: render the conversation with the chat template,
//! encode it, then stream the reply's token ids back into text pieces and split them into
//! thinking, content and a tool call as they arrive.
//!
//! ```sh
//! cargo run --example stream_reply   # from tokenizer
//! ```
//!
//! A real checkpoint's `tokenizer.json` would be read with `Tokenizer::from_hf_dir` or
//! `Tokenizer::from_gguf_file`. This example builds a tiny one in memory instead: one token
//! per byte (GPT-2's byte-level alphabet, no merges) plus Qwen3's marker tokens, so its family
//! (and with it a fallback chat template and the output parser's tags) is recognised. The
//! model's reply is a fixed text encoded up front, standing in for sampled tokens.

use serde_json::{Map, Value, json};
use tokenizer::{
    ChatTemplate, Detokenizer, Family, HfSideFiles, Message, OutputParser, ParserEvent,
    RenderOptions, Tokenizer,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tok = byte_level_tokenizer()?;
    let family = Family::detect(&tok).ok_or("no family recognised")?;
    println!(
        "vocabulary of {} tokens, family {family:?}",
        tok.vocab_size()
    );

    // The checkpoint ships no template here, so the family's fallback renders the prompt.
    let template = ChatTemplate::for_tokenizer(&tok)?;
    let tools = [json!({
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"]
            }
        }
    })];
    let options = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    let messages = [Message::new("user", "Is it warm in Zürich?")];
    let prompt = template.render(&messages, Some(&tools), &options)?;
    let prompt_ids = tok.encode(&prompt, false)?;
    let tail: String = prompt
        .chars()
        .rev()
        .take(60)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    println!(
        "prompt: {} chars, {} tokens, ends {tail:?}",
        prompt.len(),
        prompt_ids.len()
    );

    // What the model "generates", as token ids.
    let reply = "<think>\nThe user asks about Zürich; call the tool.\n</think>\n\n\
                 Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \
                 \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call><|im_end|>";
    let generated = tok.encode(reply, false)?;

    // Templates that end in an open `<think>` start the reply inside the thinking block.
    let config = family.parser_config();
    let opens_thinking = config.prompt_opens_thinking(&prompt);
    let mut parser = OutputParser::new(config.starting_in_thinking(opens_thinking));
    let mut detok = Detokenizer::with_context(&tok, false, &prompt_ids);
    let (mut streamed, mut pieces, mut events) = (0, 0, Vec::new());
    for &id in &generated {
        if tok.is_stop(id) {
            println!("stop token {id} ({:?}) ends the reply", tok.id_to_token(id));
            break;
        }
        // A byte-level token may hold half of "ü": the detokenizer holds it until the
        // character is complete, so no piece is ever invalid UTF-8.
        let piece = detok.push(id)?;
        streamed += 1;
        if !piece.is_empty() {
            pieces += 1;
        }
        events.extend(parser.push(&piece));
    }
    events.extend(parser.push(&detok.finish()?));
    events.extend(parser.finish());
    println!("{streamed} reply tokens became {pieces} text pieces");

    // Events arrive piece by piece; consecutive text of one kind is joined for display.
    for event in merge(events) {
        match event {
            ParserEvent::Thinking(text) => println!("  thinking: {:?}", text),
            ParserEvent::Content(text) => println!("  content:  {:?}", text),
            ParserEvent::ToolCall(call) => {
                println!("  tool call: {}({})", call.name, call.arguments)
            }
            ParserEvent::Error(message) => println!("  error: {message}"),
        }
    }
    Ok(())
}

fn merge(events: Vec<ParserEvent>) -> Vec<ParserEvent> {
    let mut merged: Vec<ParserEvent> = Vec::new();
    for event in events {
        match (merged.last_mut(), event) {
            (Some(ParserEvent::Thinking(a)), ParserEvent::Thinking(b))
            | (Some(ParserEvent::Content(a)), ParserEvent::Content(b)) => a.push_str(&b),
            (_, event) => merged.push(event),
        }
    }
    merged
}

/// A byte-level BPE vocabulary with no merges: ids 0..256 are the bytes, then Qwen3's markers.
fn byte_level_tokenizer() -> Result<Tokenizer, tokenizer::Error> {
    let vocab: Map<String, Value> = byte_characters()
        .into_iter()
        .enumerate()
        .map(|(id, c)| (c.to_string(), json!(id)))
        .collect();
    let added: Vec<Value> = [
        ("<|endoftext|>", true),
        ("<|im_start|>", true),
        ("<|im_end|>", true),
        ("<think>", false),
        ("</think>", false),
        ("<tool_call>", false),
        ("</tool_call>", false),
    ]
    .iter()
    .enumerate()
    .map(|(i, (content, special))| {
        json!({ "id": 256 + i, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special })
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
    // tokenizer_config.json names the end-of-turn token, which makes it a stop token.
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
