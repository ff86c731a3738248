//! Ollama's store, read in place: a store laid out as Ollama lays it out (manifests by
//! registry, namespace, model and tag; blobs by digest), built here around the real
//! `smollm2:135m` GGUF (hard-linked, so nothing is copied), is listed, resolved by Ollama's
//! names and served from the very blob file.

use crate::support;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use runner::engine::LoopConfig;
use runner::model_name::ModelName;
use runner::ollama_store::OllamaStore;
use runner::store::{Store, StoreError};
use serde_json::json;
use sha2::{Digest, Sha256};
use support::{MODEL, get, post, start_server_in};

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", runner::store::hex(&Sha256::digest(bytes)))
}

/// Writes a small blob into `root`'s blobs; returns its digest.
fn small_blob(root: &Path, bytes: &[u8]) -> String {
    let digest = digest(bytes);
    fs::write(root.join("blobs").join(digest.replace(':', "-")), bytes).unwrap();
    digest
}

fn write_manifest(root: &Path, path: &str, layers: serde_json::Value) {
    let file = root.join("manifests").join(path);
    fs::create_dir_all(file.parent().unwrap()).unwrap();
    let manifest = json!({"schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": "sha256:00", "size": 0},
        "layers": layers});
    fs::write(file, manifest.to_string()).unwrap();
}

/// An Ollama store in `root` holding the GGUF at `gguf` (hard-linked) under two names, and a
/// model whose weights are not a GGUF at all.
fn ollama_store(root: &Path, gguf: &Path, gguf_digest: &str) {
    fs::create_dir_all(root.join("blobs")).unwrap();
    let blob = root.join("blobs").join(gguf_digest.replace(':', "-"));
    fs::hard_link(gguf, &blob).unwrap();
    let size = fs::metadata(&blob).unwrap().len();
    let params = small_blob(root, br#"{"temperature": 0, "num_predict": 3}"#);
    let system = small_blob(root, b"You are terse.");
    let model = json!({"mediaType": "application/vnd.ollama.image.model",
                       "digest": gguf_digest, "size": size});
    let layers = json!([model,
        {"mediaType": "application/vnd.ollama.image.template", "digest": system, "size": 14},
        {"mediaType": "application/vnd.ollama.image.params", "digest": params, "size": 37},
        {"mediaType": "application/vnd.ollama.image.system", "digest": system, "size": 14}]);
    write_manifest(root, "registry.ollama.ai/library/tiny/latest", layers);
    write_manifest(root, "registry.ollama.ai/me/other/v1", json!([model]));
    let junk = small_blob(root, b"not a gguf file");
    write_manifest(
        root,
        "hf.co/org/broken/q4",
        json!([{"mediaType": "application/vnd.ollama.image.model", "digest": junk, "size": 15}]),
    );
}

#[test]
fn an_ollama_store_is_listed_resolved_and_served_in_place() {
    // The GGUF comes through the project's pull path, into a store of its own.
    let source_home = tempfile::tempdir().unwrap();
    let source = Store::open(source_home.path().to_path_buf()).unwrap();
    let name = ModelName::parse(MODEL).unwrap();
    if let Err(e) = runner::pull::pull(&source, &name, &mut |_| {}) {
        if std::env::var_os("CI").is_some() {
            panic!("CI is set and {MODEL} could not be pulled: {e}");
        }
        eprintln!("SKIP: {MODEL} could not be pulled ({e})");
        return;
    }
    let layer = source.get(&name).unwrap().manifest.layers[0].clone();
    let gguf = source.blob_path(&layer.digest);
    let ollama_dir = tempfile::tempdir().unwrap();
    ollama_store(ollama_dir.path(), &gguf, &layer.digest);

    let home = tempfile::tempdir().unwrap();
    let store = Store::open(home.path().to_path_buf())
        .unwrap()
        .with_ollama(Some(OllamaStore::at(ollama_dir.path().to_path_buf())));
    let listed: Vec<String> = store
        .list()
        .unwrap()
        .iter()
        .map(|e| e.name.to_string())
        .collect();
    assert_eq!(
        listed,
        ["hf.co/org/broken:q4", "me/other:v1", "tiny:latest"]
    );
    let broken = store.list().unwrap().remove(0);
    assert!(broken.unusable.is_some(), "the broken model says why");
    assert!(matches!(
        store.get(&ModelName::parse("hf.co/org/broken:q4").unwrap()),
        Err(StoreError::Unusable { .. })
    ));

    // Resolved by Ollama's names; options and system prompt come along.
    let tiny = store.get(&ModelName::parse("tiny").unwrap()).unwrap();
    assert!(tiny.from_ollama);
    assert_eq!(tiny.manifest.system.as_deref(), Some("You are terse."));
    assert_eq!(tiny.manifest.parameters["num_predict"], 3);
    assert_eq!(tiny.manifest.details.family, "llama");

    // Served from the blob itself: the view's weights are the same inode, and nothing was
    // copied into mlxkit's store.
    let view = store.materialize(&tiny.manifest).unwrap();
    let weights = fs::metadata(view.join("model.gguf")).unwrap();
    let blob = fs::metadata(
        ollama_dir
            .path()
            .join("blobs")
            .join(layer.digest.replace(':', "-")),
    )
    .unwrap();
    assert_eq!((weights.dev(), weights.ino()), (blob.dev(), blob.ino()));
    assert_eq!(fs::read_dir(home.path().join("blobs")).unwrap().count(), 0);

    // And through the server.
    let server = start_server_in(home, store, &[], LoopConfig::from_env(), |_| {}).expect("server");
    let (status, tags) = get(&server, "/api/tags");
    assert_eq!(status, 200);
    let tiny_tag = tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "tiny:latest")
        .unwrap()
        .clone();
    assert_eq!(tiny_tag["store"], "ollama");
    let (status, reply) = post(
        &server,
        "/api/generate",
        json!({"model": "tiny", "prompt": "Say hi.", "stream": false}),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply["eval_count"], 3,
        "the manifest's params apply: {reply}"
    );
    let (status, reply) = post(
        &server,
        "/api/generate",
        json!({"model": "hf.co/org/broken:q4", "prompt": "hi", "stream": false}),
    );
    assert_eq!(status, 400, "{reply}");
    let r = support::client()
        .delete(format!("{}/api/delete", server.base))
        .json(&json!({"model": "tiny"}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 400, "Ollama's store is never written");
    assert!(
        ollama_dir
            .path()
            .join("blobs")
            .join(layer.digest.replace(':', "-"))
            .exists()
    );
}
