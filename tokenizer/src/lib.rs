//! Everything between text and token ids.
//!
//! - [`Tokenizer`] (`vocab.rs`): one vocabulary from a Hugging Face `tokenizer.json`
//!   (`hf_config.rs` reads its side files) or from GGUF metadata (`gguf_meta.rs` reads the
//!   metadata, `gguf_vocab.rs` turns it into an HF tokenizer, `pre_tokenizer.rs` knows the split
//!   regex of each `tokenizer.ggml.pre`). BOS, EOS and stop tokens from every source are merged
//!   in `special_tokens.rs`.
//! - [`ChatTemplate`] (`chat_template.rs`): renders conversations with minijinja as HF's
//!   Python jinja2 would (`template_env.rs` holds the Python-compatible helpers,
//!   `template_fallback.rs` the family templates for checkpoints that ship none).
//! - [`Detokenizer`] (`detokenizer.rs`): streamed text pieces that never split a character.
//! - [`StopMatcher`] (`stop.rs`): stop strings that may span pieces, never leaked.
//! - [`OutputParser`] (`parser/`): splits model output into content, thinking and tool calls,
//!   per [`Family`] (`family.rs`), while it streams.
//!
//! ```no_run
//! # fn main() -> tokenizer::Result<()> {
//! use tokenizer::{Detokenizer, Tokenizer};
//! let tok = Tokenizer::from_gguf_file("model.gguf".as_ref())?;
//! let ids = tok.encode("Hello world", true)?;
//! let mut detok = Detokenizer::new(&tok, true);
//! let mut text = String::new();
//! for &id in &ids {
//!     text.push_str(&detok.push(id)?);
//! }
//! text.push_str(&detok.finish()?);
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod chat_template;
mod detokenizer;
mod error;
mod family;
mod gguf_meta;
mod gguf_vocab;
mod hf_config;
mod parser;
mod pre_tokenizer;
mod special_tokens;
mod stop;
mod template_env;
mod template_fallback;
mod vocab;

pub use chat_template::{ChatTemplate, FunctionCall, Message, MessageToolCall, RenderOptions};
pub use detokenizer::Detokenizer;
pub use error::{Error, Result};
pub use family::Family;
pub use gguf_meta::{GgufMetadata, MetaValue, parse_gguf_metadata, read_gguf_metadata};
pub use hf_config::HfSideFiles;
pub use parser::{OutputParser, ParserConfig, ParserEvent, ThinkingTags, ToolCall, ToolCallFormat};
pub use special_tokens::SpecialTokens;
pub use stop::{StopMatcher, StopOutput};
pub use vocab::{Tokenizer, VocabSource};
