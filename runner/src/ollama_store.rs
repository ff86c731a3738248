//! The models an existing Ollama installation pulled, read in place: `$OLLAMA_MODELS`, else
//! `~/.ollama/models`. Ollama keeps a manifest per name
//! (`manifests/<host>/<namespace>/<model>/<tag>`, an OCI-style list of layers) and each layer
//! as a blob named by its digest (`blobs/sha256-<hex>`). A model's GGUF layer is served from
//! that very file (the view links to it), never copied.
//!
//! Names resolve as Ollama resolves them: `llama3.2:1b` is
//! `registry.ollama.ai/library/llama3.2:1b`, `me/model` is `registry.ollama.ai/me/model:latest`,
//! and `host/ns/model:tag` is itself. What mlxkit takes from a manifest: the GGUF weights, the
//! default options (`params`) and the system prompt. Ollama's Go chat template is not read;
//! the GGUF's own (Jinja) template is used, as for any GGUF import.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Deserialize;
use serde_json::Value;

use crate::model_name::ModelName;
use crate::store::manifest::{Format, Layer, Manifest};

const DEFAULT_HOST: &str = "registry.ollama.ai";
const DEFAULT_NAMESPACE: &str = "library";
const MODEL_LAYER: &str = "application/vnd.ollama.image.model";
const PARAMS_LAYER: &str = "application/vnd.ollama.image.params";
const SYSTEM_LAYER: &str = "application/vnd.ollama.image.system";
/// The largest manifest, params or system layer read (they are a few hundred bytes).
const SMALL_LAYER_BYTES: u64 = 1 << 20;

/// An Ollama models folder.
#[derive(Debug, Clone)]
pub struct OllamaStore {
    root: PathBuf,
}

/// One model of it.
#[derive(Debug, Clone)]
pub struct OllamaModel {
    /// Its name, as Ollama shows it.
    pub name: ModelName,
    /// Its manifest in mlxkit's terms.
    pub manifest: Manifest,
    /// When Ollama wrote its manifest.
    pub modified: SystemTime,
    /// Why mlxkit cannot serve it, when it cannot.
    pub unusable: Option<String>,
}

#[derive(Deserialize)]
struct OciManifest {
    #[serde(default)]
    layers: Vec<OciLayer>,
}

#[derive(Deserialize)]
struct OciLayer {
    #[serde(rename = "mediaType")]
    media_type: String,
    digest: String,
    #[serde(default)]
    size: u64,
}

impl OllamaStore {
    /// The installation at `$OLLAMA_MODELS`, else `~/.ollama/models`, when that folder exists.
    pub fn from_env() -> Option<OllamaStore> {
        let root = match std::env::var_os("OLLAMA_MODELS").filter(|v| !v.is_empty()) {
            Some(dir) => PathBuf::from(dir),
            None => PathBuf::from(std::env::var_os("HOME")?).join(".ollama/models"),
        };
        root.join("manifests")
            .is_dir()
            .then_some(OllamaStore { root })
    }

    /// The installation at `root` (a folder holding `manifests/` and `blobs/`).
    pub fn at(root: PathBuf) -> OllamaStore {
        OllamaStore { root }
    }

    /// Where Ollama keeps the blob `digest` (`sha256:<hex>`).
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        self.root.join("blobs").join(digest.replace(':', "-"))
    }

    /// `name`'s manifest path, resolved as Ollama resolves names.
    fn manifest_path(&self, name: &ModelName) -> PathBuf {
        let parts: Vec<&str> = name.name.split('/').collect();
        let mut path = self.root.join("manifests");
        match parts.as_slice() {
            [model] => path.extend([DEFAULT_HOST, DEFAULT_NAMESPACE, model]),
            [namespace, model] => path.extend([DEFAULT_HOST, namespace, model]),
            all => path.extend(all),
        }
        path.join(&name.tag)
    }

    /// The model `name`, if Ollama has it.
    pub fn get(&self, name: &ModelName) -> Option<OllamaModel> {
        let path = self.manifest_path(name);
        path.is_file().then(|| self.read(name.clone(), &path))
    }

    /// Every model Ollama has, usable or not.
    pub fn list(&self) -> Vec<OllamaModel> {
        let manifests = self.root.join("manifests");
        let mut models = Vec::new();
        // host/namespace/model/tag; a namespace of more than one level is rare but legal.
        let mut stack = vec![(manifests.clone(), 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() && depth < 6 {
                    stack.push((path, depth + 1));
                } else if path.is_file()
                    && depth >= 3
                    && let Some(name) = display_name(&manifests, &path)
                {
                    models.push(self.read(name, &path));
                }
            }
        }
        models.sort_by_key(|m| m.name.to_string());
        models
    }

    fn read(&self, name: ModelName, path: &Path) -> OllamaModel {
        let modified = fs::metadata(path)
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut manifest = Manifest {
            format: Format::Gguf,
            layers: Vec::new(),
            parameters: Default::default(),
            template: None,
            system: None,
            draft: None,
            source: format!("ollama:{}", path.display()),
            details: Default::default(),
            created_at: crate::timestamp::rfc3339(modified),
        };
        let unusable = self.fill(path, &mut manifest).err();
        OllamaModel {
            name,
            manifest,
            modified,
            unusable,
        }
    }

    /// Reads the manifest at `path` into `manifest`; the error says why it cannot be served.
    fn fill(&self, path: &Path, manifest: &mut Manifest) -> Result<(), String> {
        let size = fs::metadata(path)
            .map_err(|e| format!("reading its manifest: {e}"))?
            .len();
        if size > SMALL_LAYER_BYTES {
            return Err(format!("its manifest is {size} bytes, too large to be one"));
        }
        let bytes = fs::read(path).map_err(|e| format!("reading its manifest: {e}"))?;
        let oci: OciManifest =
            serde_json::from_slice(&bytes).map_err(|e| format!("its manifest is not JSON: {e}"))?;
        for layer in &oci.layers {
            match layer.media_type.as_str() {
                MODEL_LAYER if manifest.layers.is_empty() => manifest.layers.push(Layer {
                    path: "model.gguf".into(),
                    digest: layer.digest.clone(),
                    size: layer.size,
                }),
                PARAMS_LAYER => {
                    let text = self.small_layer(&layer.digest)?;
                    if let Ok(Value::Object(params)) = serde_json::from_str(&text) {
                        manifest.parameters.extend(params);
                    }
                }
                SYSTEM_LAYER => manifest.system = Some(self.small_layer(&layer.digest)?),
                _ => {}
            }
        }
        let weights = manifest
            .layers
            .first()
            .ok_or("its manifest has no model layer")?;
        let blob = self.blob_path(&weights.digest);
        let (_, details) = crate::checkpoint_details::describe(&blob).map_err(|e| e.to_string())?;
        manifest.details = details;
        Ok(())
    }

    fn small_layer(&self, digest: &str) -> Result<String, String> {
        let path = self.blob_path(digest);
        let size = fs::metadata(&path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?
            .len();
        if size > SMALL_LAYER_BYTES {
            return Err(format!(
                "layer {digest} is {size} bytes, too large to be settings"
            ));
        }
        fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))
    }
}

/// The name Ollama shows for the manifest at `path` under `manifests`: the default host and
/// namespace are left out.
fn display_name(manifests: &Path, path: &Path) -> Option<ModelName> {
    let relative = path.strip_prefix(manifests).ok()?;
    let parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let (tag, repository) = parts.split_last()?;
    let repository: Vec<&str> = match repository {
        [host, namespace, model] if host == DEFAULT_HOST && namespace == DEFAULT_NAMESPACE => {
            vec![model]
        }
        [host, rest @ ..] if host == DEFAULT_HOST => rest.iter().map(String::as_str).collect(),
        all => all.iter().map(String::as_str).collect(),
    };
    ModelName::parse(&format!("{}:{tag}", repository.join("/"))).ok()
}
