//! Crash consistency: `mlxkit create`, `pull` (from a local download cache), `cp` and `rm`
//! are killed at random points — `kill -9` after a random delay, or an abort at a write point
//! named by `MLXKIT_FAULT` — and after each, the next start (`mlxkit list`, which tidies the
//! store) must find: every listed model's manifest whole and every blob it names present and
//! hashing to its digest, no model listed without the settings its create gave it, and
//! nothing left over (no scratch folders, temporary files or unnamed blobs). At the end, every
//! model left loads and answers a fixed prompt with the greedy tokens of the checkpoint it was
//! made from.
//!
//! The models are the tiny Llama fixture; pulls use the real `smollm2:135m` GGUF from the
//! per-user download cache (linked, not copied) and are left out, with a notice, when it is
//! not there. The seed is printed; `STORE_CRASH_SEED` replays one.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use runner::model_name::ModelName;
use runner::store::Store;

const RUNS: usize = 60;
/// The write points `MLXKIT_FAULT` can abort at (see `runner::fault`).
const POINTS: [&str; 7] = [
    "blob-write",
    "blob-persisted",
    "manifest-write",
    "manifest-renamed",
    "collect",
    "create-commit",
    "scratch",
];

fn tiny_llama() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/tests/fixtures/llama")
}

fn mlxkit(home: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mlxkit"));
    command
        .env("MLXKIT_HOME", home.join("store"))
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("OLLAMA_MODELS", home.join("no-ollama"))
        .env("MLXKIT_ORPHAN_GRACE", "0")
        .env_remove("MLXKIT_FAULT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// A download cache under `home/cache` whose `smollm2:135m` is the real cached file (linked),
/// or `None` when the per-user cache lacks it.
fn local_cache(home: &Path) -> Option<()> {
    let entry = quant::package::find("smollm2:135m")?;
    let real = quant::package::cached_path(entry, &quant::package::default_cache_dir()?);
    if !real.is_file() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set and smollm2:135m is not in the download cache"
        );
        eprintln!("notice: smollm2:135m is not in the download cache; no pulls are crashed");
        return None;
    }
    let cached = quant::package::cached_path(entry, &home.join("cache/mlxkit/models"));
    fs::create_dir_all(cached.parent()?).ok()?;
    std::os::unix::fs::symlink(&real, &cached).ok()?;
    let mut marker = cached.into_os_string();
    marker.push(".sha256");
    fs::write(marker, format!("{}\n", entry.sha256)).ok()?;
    Some(())
}

/// The real `smollm2:135m` GGUF in the per-user download cache.
fn real_smollm2() -> PathBuf {
    let entry = quant::package::find("smollm2:135m").unwrap();
    quant::package::cached_path(entry, &quant::package::default_cache_dir().unwrap())
}

/// The greedy next token after each position of a fixed prompt, from the checkpoint at `path`
/// (the tiny fixture's prompt; its ids are valid in either model's vocabulary).
fn greedy(path: &Path) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let golden: serde_json::Value =
        serde_json::from_slice(&fs::read(tiny_llama().join("golden.json"))?)?;
    let prompt: Vec<u32> = golden["prompt_ids"]
        .as_array()
        .ok_or("golden.json has no prompt_ids")?
        .iter()
        .filter_map(|id| id.as_u64().map(|id| id as u32))
        .collect();
    let loaded = nn::load::load(path, Some(mlx::Dtype::F32))?;
    let model = loaded.model.as_ref();
    let mut caches = model.new_caches()?;
    let forward = model.forward(&nn::Batch::single(&prompt, 0)?, &mut caches)?;
    let logits = model.unembed(&forward.hidden)?.squeeze(&[0])?;
    Ok(logits.argmax(-1, false)?.to_vec::<u32>()?)
}

/// One change to the store, as `mlxkit` arguments, and the name it makes (if any) with
/// whether that name must carry a SYSTEM prompt.
fn pick_operation(
    rng: &mut impl Rng,
    home: &Path,
    models: &[String],
    can_pull: bool,
) -> (Vec<String>, &'static str) {
    let slot = rng.random_range(0..4);
    let any = |rng: &mut dyn rand::RngCore| models[rng.random_range(0..models.len())].clone();
    let mut kinds = vec!["create", "create"];
    if !models.is_empty() {
        kinds.extend(["derive", "copy", "rm"]);
    }
    if can_pull {
        kinds.push("pull");
    }
    match kinds[rng.random_range(0..kinds.len())] {
        "create" => {
            let modelfile = home.join(format!("cfg-{slot}.Modelfile"));
            fs::write(
                &modelfile,
                format!(
                    "FROM {}\nSYSTEM \"\"\"system {slot}\"\"\"\nPARAMETER temperature 0.{slot}",
                    tiny_llama().display()
                ),
            )
            .unwrap();
            let name = if slot % 2 == 0 {
                format!("cfg-{slot}")
            } else {
                format!("ns/cfg-{slot}:v1")
            };
            (
                vec![
                    "create".into(),
                    name,
                    "-f".into(),
                    modelfile.display().to_string(),
                ],
                "create",
            )
        }
        "derive" => {
            let modelfile = home.join(format!("derived-{slot}.Modelfile"));
            fs::write(
                &modelfile,
                format!("FROM {}\nSYSTEM derived {slot}", any(rng)),
            )
            .unwrap();
            (
                vec![
                    "create".into(),
                    format!("derived-{slot}"),
                    "-f".into(),
                    modelfile.display().to_string(),
                ],
                "derive",
            )
        }
        "copy" => {
            let to = match slot {
                0 => "copy:a".to_string(),
                1 => "copy/a:b".to_string(),
                2 => "me/copy:v1".to_string(),
                _ => "copy".to_string(),
            };
            (vec!["cp".into(), any(rng), to], "copy")
        }
        "rm" => (vec!["rm".into(), any(rng)], "rm"),
        _ => (vec!["pull".into(), "smollm2:135m".into()], "pull"),
    }
}

/// What the next start must find in the store at `root`; `verified` remembers blobs whose
/// content was hashed already (a blob's name is its content: once right, it stays right).
fn check(root: &Path, store: &Store, verified: &mut HashSet<String>, context: &str) -> Vec<String> {
    let entries = store.list().unwrap();
    let mut named = HashSet::new();
    for entry in &entries {
        let name = entry.name.to_string();
        for layer in &entry.manifest.layers {
            named.insert(layer.digest.clone());
            if verified.contains(&layer.digest) {
                assert!(
                    store.blob_path(&layer.digest).is_file(),
                    "{context}: {name} lost {}",
                    layer.digest
                );
                continue;
            }
            store
                .verify_blob(layer)
                .unwrap_or_else(|e| panic!("{context}: {name}: {e}"));
            verified.insert(layer.digest.clone());
        }
        let m = &entry.manifest;
        if name.contains("cfg-") {
            assert!(
                m.system
                    .as_deref()
                    .is_some_and(|s| s.starts_with("system "))
                    && m.parameters.contains_key("temperature"),
                "{context}: {name} is listed half-configured: {m:?}"
            );
        }
        if name.starts_with("derived-") {
            assert!(
                m.system
                    .as_deref()
                    .is_some_and(|s| s.starts_with("derived ")),
                "{context}: {name} is listed without its SYSTEM"
            );
        }
    }
    // Every manifest file is a listed model (none unreadable, no temporary file left).
    let mut files = 0;
    for folder in fs::read_dir(root.join("manifests")).unwrap() {
        for tag in fs::read_dir(folder.unwrap().path()).unwrap() {
            let tag = tag.unwrap();
            assert!(
                !tag.file_name().to_string_lossy().starts_with('.'),
                "{context}: {} left",
                tag.path().display()
            );
            files += 1;
        }
    }
    assert_eq!(files, entries.len(), "{context}: unreadable manifests");
    let tmp = root.join("tmp");
    assert!(
        !tmp.is_dir() || fs::read_dir(&tmp).unwrap().count() == 0,
        "{context}: scratch folders left"
    );
    for blob in fs::read_dir(root.join("blobs")).unwrap() {
        let file = blob.unwrap().file_name().to_string_lossy().into_owned();
        let digest = file.replacen("sha256-", "sha256:", 1);
        assert!(
            named.contains(&digest),
            "{context}: {file} left (temporary or unnamed)"
        );
    }
    entries.iter().map(|e| e.name.to_string()).collect()
}

#[test]
fn killed_writes_leave_a_consistent_store_after_the_next_start() {
    let seed = std::env::var("STORE_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random::<u64>());
    eprintln!("STORE_CRASH_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let home = tempfile::tempdir().unwrap();
    let root = home.path().join("store");
    let store = Store::open(root.clone()).unwrap();
    runner::import::import_path(
        &store,
        &ModelName::parse("base").unwrap(),
        &tiny_llama(),
        "test",
        &mut |_, _, _| {},
    )
    .unwrap();
    let can_pull = local_cache(home.path()).is_some();
    let mut verified = HashSet::new();
    let mut models = check(&root, &store, &mut verified, "start");
    let mut outcomes: HashMap<String, usize> = HashMap::new();
    let started = Instant::now();
    for run in 0..RUNS {
        let (args, what) = pick_operation(&mut rng, home.path(), &models, can_pull);
        let mut command = mlxkit(home.path());
        command.args(&args);
        let fault = rng.random_bool(0.5).then(|| {
            format!(
                "{}:{}",
                POINTS[rng.random_range(0..POINTS.len())],
                rng.random_range(1..=3)
            )
        });
        if let Some(fault) = &fault {
            command.env("MLXKIT_FAULT", fault);
        }
        let mut child = command.spawn().unwrap();
        let how = match &fault {
            Some(fault) => format!("MLXKIT_FAULT={fault}"),
            None => {
                let delay = rng.random_range(0..150);
                std::thread::sleep(Duration::from_millis(delay));
                let _ = child.kill();
                format!("kill -9 after {delay} ms")
            }
        };
        let status = child.wait().unwrap();
        let outcome = if status.success() {
            "finished"
        } else if status.code().is_some() {
            "failed"
        } else {
            "killed"
        };
        *outcomes.entry(format!("{what} {outcome}")).or_default() += 1;
        let context = format!(
            "run {run} (seed {seed}): `mlxkit {}` with {how}: {outcome}",
            args.join(" ")
        );
        // The next start: tidies, then lists.
        let listed = mlxkit(home.path()).arg("list").output().unwrap();
        assert!(
            listed.status.success(),
            "{context}: the next start failed: {}",
            String::from_utf8_lossy(&listed.stderr)
        );
        models = check(&root, &store, &mut verified, &context);
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "{context}: too slow to finish"
        );
    }
    eprintln!(
        "{RUNS} runs in {:.1} s: {outcomes:?}",
        started.elapsed().as_secs_f64()
    );
    // Every model left loads through its view and answers as the checkpoint it was made from.
    let mut answers: HashMap<String, Vec<u32>> = HashMap::new();
    for entry in store.list().unwrap() {
        let view = store.materialize(&entry.manifest).unwrap();
        let weights = runner::engine::from_store::weights_path(&view, &entry.manifest).unwrap();
        let answer = greedy(&weights).unwrap_or_else(|e| panic!("{}: {e}", entry.name));
        // Pulls store the GGUF; creates import the tiny fixture's folder.
        let source = match entry.manifest.format {
            runner::store::Format::Gguf => real_smollm2(),
            runner::store::Format::Safetensors => tiny_llama(),
        };
        let original = answers
            .entry(source.display().to_string())
            .or_insert_with(|| greedy(&source).unwrap());
        assert_eq!(&answer, original, "{} answers differently", entry.name);
        eprintln!("{} answers as {}", entry.name, source.display());
    }
    // The runs reached every kind of ending.
    assert!(
        outcomes.keys().any(|k| k.ends_with("killed")),
        "{outcomes:?}"
    );
    assert!(
        outcomes.keys().any(|k| k.ends_with("finished")),
        "{outcomes:?}"
    );
}
