//! The per-user cache the end-to-end tests install real clients into (the official SDKs, the
//! coding agents): pinned versions, each in a folder named after its pins, built beside that
//! folder and renamed into it, so a second run reuses it and a concurrent run never sees half
//! of one.
//!
//! When something cannot be installed (no Python, no npm, no package index) the tests fail
//! loudly under `CI` and are skipped with a notice otherwise ([`required`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

/// `$XDG_CACHE_HOME/mlxkit` (else `~/.cache/mlxkit`).
pub fn cache_root() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("mlxkit")
}

/// Runs `command`, its failure an error holding its stderr.
pub fn run(command: &mut Command) -> Result<(), String> {
    let output = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// The cache's folder `name`, made by `build` (handed an empty folder beside it) when the cache
/// lacks it. A build must not depend on its folder's path: it is renamed afterwards (a venv's
/// scripts name their interpreter by path, so run them as `python -m`).
pub fn cached_folder(
    name: &str,
    build: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<PathBuf, String> {
    // One build of each folder at a time in this process: tests running in parallel that need
    // the same folder build it once, while different folders (a venv, the npm agents) install
    // side by side, their downloads beside the other tests' work.
    static BUILDING: Mutex<BTreeMap<String, Arc<Mutex<()>>>> = Mutex::new(BTreeMap::new());
    let this_one = Arc::clone(
        BUILDING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.to_string())
            .or_default(),
    );
    let _building = this_one.lock().unwrap_or_else(|e| e.into_inner());
    let folder = cache_root().join(name);
    if folder.exists() {
        return Ok(folder);
    }
    std::fs::create_dir_all(cache_root()).map_err(|e| e.to_string())?;
    let building = cache_root().join(format!("{name}.building-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&building);
    std::fs::create_dir_all(&building).map_err(|e| e.to_string())?;
    if let Err(why) = build(&building) {
        let _ = std::fs::remove_dir_all(&building);
        return Err(why);
    }
    if std::fs::rename(&building, &folder).is_err() {
        // Another run got there first.
        let _ = std::fs::remove_dir_all(&building);
    }
    Ok(folder)
}

/// The Python of a venv (`<prefix>-<pins>` in the cache) with `pins` installed.
pub fn venv_python(prefix: &str, pins: &[&str]) -> Result<PathBuf, String> {
    let name = format!("{prefix}-{}", pins.join("-").replace("==", "-"));
    let python = |dir: &Path| dir.join("bin").join("python");
    let venv = cached_folder(&name, |building| {
        run(Command::new("python3").args(["-m", "venv"]).arg(building))?;
        run(Command::new(python(building))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(pins))
    })?;
    Ok(python(&venv))
}

/// `result`'s value; its error panics under `CI` and is a skip notice (`None`) otherwise.
pub fn required<T>(what: &str, result: Result<T, String>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(why) if std::env::var_os("CI").is_some() => {
            panic!("CI is set and {what} could not be installed: {why}")
        }
        Err(why) => {
            eprintln!("SKIP: {what} could not be installed ({why}); set CI=1 to fail instead");
            None
        }
    }
}

/// Runs `script` (under `runner/tests/`) with `python` against the server at `base` for
/// `model`, and checks that it succeeded and printed a line for each of `expected` (the
/// clients it drives, each as `name:`).
pub fn run_client_checks(python: &Path, script: &str, base: &str, model: &str, expected: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let output = Command::new(python)
        .arg(script)
        .args([base, model])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    for client in expected {
        assert!(stdout.contains(client), "{client} did not run: {stdout}");
    }
}
