//! The official Python SDKs (`anthropic`, `openai`, `ollama`) against the live server: the
//! clients agents and apps use, not our idea of their requests. `sdk/clients.py` holds the
//! checks; the SDKs are installed once, pinned, into a venv in the per-user cache.
//!
//! When the venv cannot be built (no Python, no package index) the test fails loudly under
//! `CI` and is skipped with a notice otherwise.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::{MODEL, serial, server};

/// The SDK versions the checks were written against.
const PINS: &[&str] = &["anthropic==2.16.0", "openai==3.57.0", "ollama==0.6.3"];

/// `$XDG_CACHE_HOME/mlxkit` (else `~/.cache/mlxkit`).
fn cache_root() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("mlxkit")
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// The venv's Python, building the venv first when the cache lacks it. It is built beside
/// its final place and renamed into it, so a concurrent run never sees half of it.
fn sdk_python() -> Result<PathBuf, String> {
    let name = format!("sdk-venv-{}", PINS.join("-").replace("==", "-"));
    let venv = cache_root().join(name);
    let python = |dir: &Path| dir.join("bin").join("python");
    if python(&venv).exists() {
        return Ok(python(&venv));
    }
    std::fs::create_dir_all(cache_root()).map_err(|e| e.to_string())?;
    let building = venv.with_extension(format!("building-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&building);
    run(Command::new("python3").args(["-m", "venv"]).arg(&building))?;
    run(Command::new(python(&building))
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(PINS))?;
    if std::fs::rename(&building, &venv).is_err() {
        // Another run got there first.
        let _ = std::fs::remove_dir_all(&building);
    }
    Ok(python(&venv))
}

#[test]
fn the_official_sdks_are_served() {
    let Some(s) = server() else { return };
    let _serial = serial();
    let python = match sdk_python() {
        Ok(python) => python,
        Err(why) if std::env::var_os("CI").is_some() => {
            panic!("CI is set and the SDK venv could not be built: {why}")
        }
        Err(why) => {
            eprintln!("SKIP: the SDK venv could not be built ({why}); set CI=1 to fail instead");
            return;
        }
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/clients.py");
    let output = Command::new(python)
        .arg(script)
        .args([s.base.as_str(), MODEL])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    for sdk in ["anthropic:", "openai:", "ollama:"] {
        assert!(stdout.contains(sdk), "{sdk} did not run: {stdout}");
    }
}
