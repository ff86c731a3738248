//! The runner's behaviour tests, one module per subject, linked into one test binary.
//!
//! One binary rather than one per file: each file's binary linked the whole server, about
//! 120 MB apiece (3.7 GB for 31 of them), which cost a cold build minutes of linking and a CI
//! run its disk (its linker died of a bus error, lld's way of meeting a full disk). In one
//! process the modules share what `support` starts (one `smollm2:135m` server for every
//! module that asks for it) and `support::serial` orders the tests that read its shared
//! state; a module's own servers stay its own.
//!
//! Run it by name, `cargo test --workspace --test integration` (a module: add its name after):
//! it is `test = false`, so a plain `cargo test` leaves it out and scripts/test can run it
//! beside every other test binary. Its `group` module runs after that, alone: a group's ranks
//! spin on two cores while they wait for each other.
//!
//! Five files stay binaries of their own. `allocator.rs`: `scripts/check-platforms` builds it
//! to get the `mlxkit` binary for arm64 without building these. `operations.rs` and
//! `vision_http.rs` count with the process's metrics recorder, which every server in a process
//! shares, so other modules' requests would move their counts. `logs.rs` installs the
//! process's tracing subscriber. `resident.rs` reads each model's weights as the growth of
//! MLX's active memory across its load, which every engine in a process moves.

mod steps;
mod support;

mod agent_libraries;
mod agents;
mod anthropic;
mod assistant_http;
mod audio_http;
mod block_drafter_http;
mod create;
mod draft_model;
mod edge;
mod embeddings;
mod engine;
mod export;
mod fairness;
mod group;
mod hostile;
mod hybrid_http;
mod info;
mod limits;
mod llava_http;
mod ollama_store;
mod prefix_scenarios;
mod qwen2_5_vl_http;
mod responses;
mod sdk;
mod server;
mod speculation;
mod speculation_http;
mod store;
mod store_crash;
mod structured;
mod tool_output;
mod transcriptions_http;
