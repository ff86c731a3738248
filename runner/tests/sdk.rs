//! The official Python SDKs (`anthropic`, `openai`, `ollama`) against the live server: the
//! clients agents and apps use, not our idea of their requests. `sdk/clients.py` holds the
//! checks; the SDKs are installed once, pinned, into a venv in the per-user cache.
//!
//! When the venv cannot be built (no Python, no package index) the test fails loudly under
//! `CI` and is skipped with a notice otherwise.

use crate::support;

use support::cache::{required, run_client_checks, venv_python};
use support::{MODEL, serial, server};

/// The SDK versions the checks were written against.
const PINS: &[&str] = &["anthropic==2.16.0", "openai==3.57.0", "ollama==0.6.3"];

#[test]
fn the_official_sdks_are_served() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let Some(python) = required("the SDK venv", venv_python("sdk-venv", PINS)) else {
        return;
    };
    run_client_checks(
        &python,
        "sdk/clients.py",
        &s.base,
        MODEL,
        &["anthropic:", "openai:", "ollama:"],
    );
}
