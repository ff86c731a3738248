//! Structured output as per-step token masks, built on llguidance.
//!
//! A [`GrammarCompiler`] is made once per tokenizer; it compiles a [`GrammarSpec`] (any JSON
//! object, a JSON Schema, a regular expression or a Lark grammar) into a [`Grammar`], which a
//! generation loop steps token by token: [`Grammar::mask`] before sampling, [`Grammar::consume`]
//! after, [`Grammar::rollback`] when speculative tokens are rejected. End tokens are allowed
//! exactly when the output is complete.
//!
//! Files:
//! - `spec`: what a request asks for (including structural forms: a thinking region that
//!   must close before the constrained output, free text followed by tool calls pinned to
//!   their schemas), the mapping from Ollama's `format` and OpenAI's
//!   `response_format`, and the caps on schema size and nesting.
//! - `schema_shape`: measures of a schema that bound its compile cost (nesting, `$ref` chains,
//!   breadth), and rebasing local `$ref`s when a schema is embedded in another.
//! - `schema_progress`: whether a schema's `$ref` cycles let a value ever be finished.
//! - `schema_walk`: where a schema's subschemas sit, as JSON pointers.
//! - `schema_fit`: a valid schema fitted to what llguidance compiles (keywords it cannot
//!   enforce dropped from their subschema and reported); invalid schemas refused.
//! - `schema_close`: objects of tool arguments closed to their listed properties.
//! - `token_env`: the vocabulary as llguidance sees it, and how special and end tokens are
//!   treated.
//! - `compile_thread`: the thread a compile runs on, its stack and its deadline.
//! - `compiler`: compiling specs, with the per-tokenizer factory and compiled-grammar caches.
//! - `grammar`: stepping one compiled grammar.
//! - `error`: the crate's error type.

mod compile_thread;
mod compiler;
mod error;
mod grammar;
mod schema_close;
mod schema_fit;
mod schema_progress;
mod schema_shape;
mod schema_walk;
mod spec;
mod token_env;

pub use compiler::GrammarCompiler;
pub use error::{Error, Result};
pub use grammar::Grammar;
pub use schema_close::close_objects;
pub use schema_fit::{Loosened, fit_schema};
pub use schema_shape::rebase_refs;
pub use spec::{GrammarSpec, Limits};
