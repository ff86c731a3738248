//! The libraries agents are built on (`litellm`, LangChain's `ChatOllama` and `ChatOpenAI`)
//! against the live server: plain calls, forced tool calls, structured output and streaming,
//! as those libraries send them. `agent_libraries/clients.py` holds the checks; the libraries
//! are installed once, pinned, into a venv in the per-user cache.
//!
//! When the venv cannot be built (no Python, no package index) the test fails loudly under
//! `CI` and is skipped with a notice otherwise.

use crate::support;

use support::cache::{required, run_client_checks, venv_python};
use support::{MODEL, serial, server};

/// The library versions the checks were written against (about 430 MB, a minute to install).
const PINS: &[&str] = &[
    "litellm==1.110.2",
    "langchain-core==1.8.3",
    "langchain-ollama==1.1.0",
    "langchain-openai==1.8.1",
];

#[test]
fn the_agent_libraries_are_served() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let Some(python) = required(
        "the agent-libraries venv",
        venv_python("agent-libraries-venv", PINS),
    ) else {
        return;
    };
    run_client_checks(
        &python,
        "agent_libraries/clients.py",
        &s.base,
        MODEL,
        &["litellm:", "ChatOllama:", "ChatOpenAI:"],
    );
}
