//! Everything between text and token ids.
//!
//! This crate will own vocabularies (HF `tokenizer.json` and GGUF metadata), chat templates,
//! the incremental UTF-8-safe detokenizer, stop strings that span tokens and the per-family
//! output parsers for thinking blocks and tool calls.
