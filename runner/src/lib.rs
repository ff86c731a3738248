//! The `mlxkit` server and command-line tool, composed from the workspace's crates.
//!
//! - [`store`]: content-addressed blobs and manifests under `$MLXKIT_HOME`; [`model_name`];
//!   [`ollama_store`]: the models an Ollama installation pulled, read in place.
//! - [`pull`]: catalog models fetched from their packages; [`import`]: local GGUF files and
//!   transformers folders; [`modelfile`]: `create -f`; [`create`]: `create --quantize` through
//!   `quant`'s pipeline; [`export`]: a stored model written out as a transformers / mlx-lm
//!   folder.
//! - [`engine`]: the MLX worker, the loaded model and its step loop over many requests at once
//!   (batched decode, the prefix trie behind every request, cancellation).
//! - [`model_keeper`]: load on first use, `keep_alive`, one model at a time, a bounded queue.
//! - [`server`]: Ollama's, OpenAI's and Anthropic's HTTP APIs.
//! - [`cli`]: the `mlxkit` commands; [`logging`]: text or JSON log lines.

pub mod capabilities;
pub mod cli;
pub mod create;
pub mod create_model;
pub mod engine;
pub mod export;
pub mod fault;
pub mod import;
pub mod logging;
pub mod model_keeper;
pub mod model_name;
pub mod model_source;
pub mod modelfile;
pub mod ollama_store;
pub mod pull;
pub mod server;
pub mod store;
