//! The coding agents, installed pinned into the per-user cache: Claude Code and the Codex CLI
//! from npm (one `node_modules`), aider from PyPI (its own venv).
//!
//! npm installs each agent's native binary for this platform from its optional dependencies
//! (Claude Code's postinstall copies it over a placeholder); both binaries are run once with
//! `--version` before the folder is renamed into place, so a cached install is a working one.
//! Node.js is needed only to install (Claude Code is a native binary) and to start Codex's
//! launcher (`codex.js`, Node 16 or later).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::cache::{cached_folder, run, venv_python};

/// The npm packages, as current on 2026-12-05.
const NPM_PINS: &[&str] = &["@anthropic-ai/claude-code@2.1.332", "@openai/codex@0.171.0"];

/// aider, as current on 2026-12-05 (it brings litellm 1.81.10).
const AIDER_PINS: &[&str] = &["aider-chat==0.86.2"];

/// The installed agents' executables.
pub struct Agents {
    pub claude: PathBuf,
    pub codex: PathBuf,
}

/// Claude Code and Codex, installed when the cache lacks them.
pub fn npm_agents() -> Result<Agents, String> {
    let name = format!(
        "agents-npm-{}",
        NPM_PINS
            .iter()
            .map(|pin| pin.trim_start_matches('@').replace(['/', '@'], "-"))
            .collect::<Vec<_>>()
            .join("-")
    );
    let bin = |dir: &Path, tool: &str| dir.join("node_modules").join(".bin").join(tool);
    let folder = cached_folder(&name, |building| {
        run(Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
            .arg("--prefix")
            .arg(building)
            .args(NPM_PINS)
            // npm's own cache beside ours, not in the user's `~/.npm`.
            .env("npm_config_cache", building.with_file_name("npm-cache"))
            .env("npm_config_update_notifier", "false"))?;
        for tool in ["claude", "codex"] {
            run(Command::new(bin(building, tool)).arg("--version"))
                .map_err(|why| format!("the installed `{tool}` does not run: {why}"))?;
        }
        Ok(())
    })?;
    Ok(Agents {
        claude: bin(&folder, "claude"),
        codex: bin(&folder, "codex"),
    })
}

/// The Python of aider's venv (run aider as `python -m aider`: the venv's `aider` script
/// names the folder the venv was built in), installed when the cache lacks it.
pub fn aider_python() -> Result<PathBuf, String> {
    venv_python("aider-venv", AIDER_PINS)
}
