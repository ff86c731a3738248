//! The `mlxkit` server and command-line tool, composed from the workspace's crates: it
//! parses, builds, wires and serves; the model, sampling and caching logic lives in the
//! crates below it.
//!
//! # A request's walk
//!
//! Each step only calls the next one down; none imports the module that calls it.
//!
//! 1. **Server** ([`server`]): an API module ([`server::ollama`], [`server::openai`],
//!    [`server::responses`], [`server::anthropic`]) reads its fields and leases the model from
//!    the [`model_keeper`] (load on first use beside the resident models while they fit,
//!    the least recently used idle one out when one does not, a bounded queue).
//! 2. **Request builder** ([`server::request`]): the one path every API and the CLI take.
//!    It renders the prompt off the async runtime ([`server::prompt`], `tokenizer`'s chat
//!    templates; media through [`server::images`] and [`server::audio`]), holds it to the
//!    context, compiles the output constraint ([`server::structured`], `grammar`) and submits
//!    the job ([`server::generation`]). It fails with a [`server::request_error::RequestError`]
//!    that each API turns into its wire format at its edge. Embeddings take its shorter path,
//!    [`server::embedding_request`]: inputs tokenized, held to the context, evaluated.
//! 3. **Engine** ([`engine`]): the job crosses to the MLX worker (`mlx-thread`) and
//!    waits in admission (`engine::admission`) until its KV reservation fits.
//! 4. **Prefix trie** (`engine::prefix_cache` over `prefix-trie`): admission restores the
//!    longest cached prefix and schedules the snapshots its prefill will capture.
//! 5. **nn** (`engine::prefill`, `engine::decode` over `nn`, `kvcache`, `mlx`): prompt chunks
//!    under a per-step token budget, then one batched forward for every decoding sequence.
//! 6. **Sampler and speculation** (`sampler`; `engine::speculation` over `speculate`): one
//!    sampler call per step samples every row, grammar masks and penalties applied; a
//!    drafted row is verified in the same forward and rolled back to what was accepted.
//! 7. **Events** (`engine::job`'s `Event`s over a channel): tokens, then the end or an error;
//!    retirement (`engine::retirement`) hands the prefill's snapshots to the trie.
//! 8. **Server again** ([`server::generation`], then [`server::sse`] or the Ollama
//!    handlers' NDJSON): detokenized, held back at stop strings, split into content,
//!    thinking and tool calls, and written in the API's stream or one response.
//!
//! The CLI ([`cli`]) takes the same path from step 2: `mlxkit run` and `mlxkit bench` build
//! their jobs with [`server::request`] too.
//!
//! # Modules
//!
//! - [`cli`]: the `mlxkit` commands (arguments, one function per command, the chat REPL, the
//!   bench harness); [`logging`]: text or JSON log lines.
//! - [`server`]: Ollama's, OpenAI's and Anthropic's HTTP APIs and the request builder.
//! - [`model_keeper`]: which models are resident (fit to memory, the least recently used idle
//!   one out), leased to requests; `keep_alive`.
//! - [`engine`]: the MLX worker, the resident models and their step loops over many requests
//!   at once (batched decode, the prefix trie behind every request, speculation,
//!   cancellation), stepped in turn.
//! - [`store`]: content-addressed blobs and manifests under `$MLXKIT_HOME`; [`model_name`];
//!   [`ollama_store`]: the models an Ollama installation pulled, read in place.
//! - [`pull`]: catalog models fetched from their packages, with the drafter heads trained for
//!   them ([`shipped_heads`]); [`import`]: local GGUF files and
//!   transformers folders; [`checkpoint_details`]: what a checkpoint is, read at import and
//!   from Ollama's store; [`model_source`]: what a `FROM` names; [`modelfile`]: `create -f`;
//!   [`create`]: `create --quantize` through `quant`'s pipeline; [`create_model`]: a
//!   Modelfile's model written to the store; [`export`]: a stored model written out as a
//!   transformers / mlx-lm folder.
//! - [`capabilities`]: what a model can be asked to do (tools, thinking, images, audio);
//!   [`model_info`]: `show`'s description of a checkpoint in Ollama's GGUF-key shape;
//!   [`timestamp`]: times as the APIs and the store write them; [`fault`]: crash points for
//!   the crash-consistency tests.

pub mod capabilities;
pub mod checkpoint_details;
pub mod cli;
pub mod create;
pub mod create_model;
pub mod engine;
pub mod export;
pub mod fault;
pub mod group;
pub mod import;
pub mod logging;
pub mod model_info;
pub mod model_keeper;
pub mod model_name;
pub mod model_source;
pub mod modelfile;
pub mod ollama_store;
pub mod pull;
pub mod server;
pub mod shipped_heads;
pub mod store;
pub mod timestamp;
