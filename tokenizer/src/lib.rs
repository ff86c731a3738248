//! Everything between text and token ids.
//!
//! - [`Tokenizer`] (`vocab.rs`): one vocabulary from a Hugging Face `tokenizer.json`
//!   (`hf_config.rs` reads its side files) or from GGUF metadata (the `gguf` crate reads the
//!   metadata, `gguf_vocab.rs` turns it into an HF tokenizer, `pre_tokenizer.rs` knows the split
//!   regex of each `tokenizer.ggml.pre`). BOS, EOS and stop tokens from every source are merged
//!   in `special_tokens.rs`.
//! - [`ChatTemplate`] (`chat_template.rs`): renders conversations with minijinja as HF's
//!   Python jinja2 would (`template_env.rs` holds the Python-compatible helpers,
//!   `template_fallback.rs` the family templates for checkpoints that ship none).
//! - [`FillInMiddle`] (`fill_in_middle.rs`): the markers of code models' infill prompts.
//! - [`Detokenizer`] (`detokenizer.rs`): streamed text pieces that never split a character.
//! - [`StopMatcher`] (`stop.rs`): stop strings that may span pieces, never leaked.
//! - [`OutputParser`] (`parser/`): splits model output into content, thinking and tool calls,
//!   per [`Family`] (`family.rs`), while it streams.
//! - [`ToolFormat`] (`tool_format.rs`): whether a template shows tools, and how tools reach a
//!   prompt whose template cannot show them ([`tool_messages`]).
//!
//! One request, end to end (the model's sampling loop is elided):
//!
//! ```no_run
//! # fn main() -> tokenizer::Result<()> {
//! use tokenizer::*;
//! let tok = Tokenizer::from_gguf_file("model.gguf".as_ref())?;
//! let template = ChatTemplate::for_tokenizer(&tok)?;
//! let options = RenderOptions { add_generation_prompt: true, ..Default::default() };
//! let prompt = template.render(&[Message::new("user", "Hi")], None, &options)?;
//! let prompt_ids = tok.encode(&prompt, false)?;
//! let config = Family::detect(&tok).map(Family::parser_config).unwrap_or_default();
//! let mut parser = OutputParser::new(config.starting_in_thinking(false));
//! let mut stops = StopMatcher::new(["\nUser:"]);
//! let mut detok = Detokenizer::with_context(&tok, false, &prompt_ids);
//! # let generated: Vec<u32> = Vec::new();
//! for id in generated {
//!     if tok.is_stop(id) {
//!         break;
//!     }
//!     let released = stops.push(&detok.push(id)?);
//!     for event in parser.push(&released.text) {
//!         println!("{event:?}"); // Content, Thinking, ToolCall or Error
//!     }
//!     if released.stopped.is_some() {
//!         break;
//!     }
//! }
//! // At the end: flush the detokenizer into the matcher, the matcher into the parser.
//! let tail = stops.push(&detok.finish()?).text + &stops.finish().text;
//! let events = [parser.push(&tail), parser.finish()].concat();
//! # let _ = events;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod chat_template;
mod detokenizer;
mod error;
mod family;
mod fill_in_middle;
mod gguf_vocab;
mod hf_config;
mod parser;
mod pre_tokenizer;
mod special_tokens;
mod stop;
mod template_env;
mod template_fallback;
mod tool_format;
mod vocab;

pub use chat_template::{
    ChatTemplate, FunctionCall, LateSystem, Message, MessageToolCall, RenderOptions, RenderedChat,
};
pub use detokenizer::Detokenizer;
pub use error::{Error, Result};
pub use family::Family;
pub use fill_in_middle::FillInMiddle;
// GGUF metadata is read by the `gguf` crate; these are its names as this crate has always
// spelt them.
pub use gguf::{
    MetaValue, Metadata as GgufMetadata, parse_metadata as parse_gguf_metadata,
    read_metadata as read_gguf_metadata,
};
pub use hf_config::HfSideFiles;
pub use parser::{OutputParser, ParserConfig, ParserEvent, ThinkingTags, ToolCall, ToolCallFormat};
pub use special_tokens::SpecialTokens;
pub use stop::{StopMatcher, StopOutput};
pub use tool_format::{ToolFormat, tool_messages};
pub use vocab::{Tokenizer, VocabSource};
