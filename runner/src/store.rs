//! The model store: content-addressed blobs plus one manifest per `name:tag`.
//!
//! ```text
//! $MLXKIT_HOME/                      (default ~/.mlxkit)
//!   writer.lock                      held by whoever changes the store (see `writer`)
//!   blobs/sha256-<hex>               file contents, named by their digest
//!   manifests/<folder>/<tag>         JSON: which blobs make up the model, and its settings;
//!                                    the folder is the name with `/` written `%2F`
//!   views/<manifest digest>/<path>   symlinks giving a model's files their original names
//!   state/<manifest digest>/         what serving the model taught the engine (depth controllers)
//!   tmp/                             scratch space of a create in progress
//! ```
//!
//! Reading takes no lock. Changing (create, pull, copy, remove, garbage collection) happens
//! only through a [`StoreWriter`], which holds an exclusive file lock on `writer.lock`, so the
//! CLI and a server sharing a store take turns. Every write goes to a temporary file in the
//! same folder, is synced and renamed into place, and the folder is synced, so a reader never
//! sees half a blob or half a manifest, and a crash leaves either the old manifest or the new
//! one. What a crash leaves besides (temporary files, blobs no manifest names) is removed at
//! the next start (see `leftovers`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::model_name::ModelName;
use crate::ollama_store::{OllamaModel, OllamaStore};

mod durable;
pub mod leftovers;
pub mod manifest;
mod references;
mod writer;

pub use manifest::{Details, Format, Layer, Manifest, hex};
pub use writer::StoreWriter;

/// What went wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// No manifest for this name.
    #[error("model `{0}` not found, try pulling it first")]
    NotFound(String),
    /// A blob's content does not hash to its name.
    #[error("blob {digest} is corrupt (its content hashes to {actual}); pull the model again")]
    Corrupt {
        /// The digest the blob is filed under.
        digest: String,
        /// What its content hashes to.
        actual: String,
    },
    /// A manifest could not be parsed.
    #[error("manifest of `{name}` is unreadable: {message}")]
    BadManifest {
        /// The model.
        name: String,
        /// The parser's message.
        message: String,
    },
    /// A model of Ollama's store that mlxkit cannot serve.
    #[error("`{name}` (in Ollama's store) cannot be served: {reason}")]
    Unusable {
        /// The model.
        name: String,
        /// Why.
        reason: String,
    },
    /// A change asked of a model that belongs to Ollama's store, which is read, never written.
    #[error("`{0}` is in Ollama's store, which mlxkit only reads; change it with `ollama`")]
    Foreign(String),
    /// A file's content does not hash to the digest it was promised to have.
    #[error("{what} is corrupt: its SHA-256 is {actual}, expected {expected}")]
    Mismatch {
        /// What was being stored.
        what: String,
        /// The digest it should have.
        expected: String,
        /// What its content hashes to.
        actual: String,
    },
    /// A manifest about to be written names a blob the store does not hold (removed while the
    /// manifest was being made).
    #[error("`{name}` needs blob {digest}, which is no longer in the store; try again")]
    MissingBlob {
        /// The model.
        name: String,
        /// The blob.
        digest: String,
    },
    /// A source given to the store is not a regular file.
    #[error("{0} is not a regular file")]
    NotAFile(String),
}

type Result<T> = std::result::Result<T, StoreError>;

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// How long a blob no manifest names is kept before start-up removes it, unless
/// `MLXKIT_ORPHAN_GRACE` (seconds) says otherwise. Writers hold the lock while a blob is
/// unnamed, so the wait only guards against a writer that does not take it (an older mlxkit).
const DEFAULT_ORPHAN_GRACE: std::time::Duration = std::time::Duration::from_secs(3600);

/// A model known to the store.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its name.
    pub name: ModelName,
    /// Its manifest.
    pub manifest: Manifest,
    /// When its manifest file was last written.
    pub modified: std::time::SystemTime,
    /// Whether it is read from Ollama's store.
    pub from_ollama: bool,
    /// Why it cannot be served, for a listed model that cannot (Ollama's store holds
    /// architectures mlxkit lacks).
    pub unusable: Option<String>,
}

/// The store under one root folder, and the Ollama installation it also reads.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    ollama: Option<OllamaStore>,
    orphan_grace: std::time::Duration,
}

impl Store {
    /// The store at `$MLXKIT_HOME`, else `~/.mlxkit`.
    pub fn from_env() -> Result<Store> {
        let root = match std::env::var_os("MLXKIT_HOME").filter(|v| !v.is_empty()) {
            Some(dir) => PathBuf::from(dir),
            None => std::env::var_os("HOME")
                .map(|home| PathBuf::from(home).join(".mlxkit"))
                .ok_or_else(|| StoreError::Io {
                    what: "finding the home folder for",
                    path: PathBuf::from("~/.mlxkit"),
                    source: io::Error::new(
                        io::ErrorKind::NotFound,
                        "HOME is not set; set MLXKIT_HOME",
                    ),
                })?,
        };
        let mut store = Store::open(root)?.with_ollama(OllamaStore::from_env());
        if let Some(seconds) = std::env::var("MLXKIT_ORPHAN_GRACE")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
        {
            store.orphan_grace = std::time::Duration::from_secs(seconds);
        }
        Ok(store)
    }

    /// The same store, removing unnamed blobs at start-up only once they are `grace` old.
    pub fn with_orphan_grace(mut self, grace: std::time::Duration) -> Store {
        self.orphan_grace = grace;
        self
    }

    /// The same store, also reading the models of `ollama` (ours win on a name both have).
    pub fn with_ollama(mut self, ollama: Option<OllamaStore>) -> Store {
        self.ollama = ollama;
        self
    }

    /// The store at `root`, creating its folders. A relative `root` is made absolute now (the
    /// views' links name blobs by absolute path, which a relative root would break).
    pub fn open(root: PathBuf) -> Result<Store> {
        let root = std::path::absolute(&root).map_err(io_err("finding", &root))?;
        for dir in ["blobs", "manifests", "views"] {
            let path = root.join(dir);
            fs::create_dir_all(&path).map_err(io_err("creating", &path))?;
        }
        Ok(Store {
            root,
            ollama: None,
            orphan_grace: DEFAULT_ORPHAN_GRACE,
        })
    }

    /// The root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where what the engine learns while serving a model is kept (the speculation depth
    /// controllers): `state/<manifest digest>/`, created on first write.
    pub fn state_dir(&self, manifest: &Manifest) -> PathBuf {
        self.root
            .join("state")
            .join(manifest.digest().trim_start_matches("sha256:"))
    }

    /// The path of the blob `digest` (`sha256:<hex>`) in this store.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        self.root.join("blobs").join(digest.replace(':', "-"))
    }

    /// Where the blob `digest` is: this store's, else Ollama's (read in place).
    fn locate_blob(&self, digest: &str) -> PathBuf {
        let ours = self.blob_path(digest);
        match &self.ollama {
            Some(ollama) if !ours.exists() && ollama.blob_path(digest).exists() => {
                ollama.blob_path(digest)
            }
            _ => ours,
        }
    }

    fn manifest_path(&self, name: &ModelName) -> PathBuf {
        self.root
            .join("manifests")
            .join(name.folder())
            .join(&name.tag)
    }

    /// Checks that a blob's content still hashes to its digest.
    pub fn verify_blob(&self, layer: &Layer) -> Result<()> {
        let path = self.locate_blob(&layer.digest);
        let mut file = fs::File::open(&path).map_err(io_err("opening", &path))?;
        let mut hasher = Sha256::new();
        io::copy(&mut file, &mut hasher).map_err(io_err("reading", &path))?;
        let actual = format!("sha256:{}", hex(&hasher.finalize()));
        if actual != layer.digest {
            return Err(StoreError::Corrupt {
                digest: layer.digest.clone(),
                actual,
            });
        }
        Ok(())
    }

    /// The manifest of `name`.
    pub fn get(&self, name: &ModelName) -> Result<Entry> {
        let path = self.manifest_path(name);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return match self.ollama.as_ref().and_then(|o| o.get(name)) {
                    Some(model) => match model.unusable {
                        Some(reason) => Err(StoreError::Unusable {
                            name: name.to_string(),
                            reason,
                        }),
                        None => Ok(ollama_entry(model)),
                    },
                    None => Err(StoreError::NotFound(name.to_string())),
                };
            }
            Err(e) => return Err(io_err("reading", &path)(e)),
        };
        let manifest: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| StoreError::BadManifest {
                name: name.to_string(),
                message: e.to_string(),
            })?;
        let modified = fs::metadata(&path)
            .and_then(|m| m.modified())
            .unwrap_or(std::time::SystemTime::UNIX_EPOCH);
        Ok(Entry {
            name: name.clone(),
            manifest,
            modified,
            from_ollama: false,
            unusable: None,
        })
    }

    /// Every model in the store, by name.
    pub fn list(&self) -> Result<Vec<Entry>> {
        let mut entries: Vec<Entry> = self
            .names()?
            .iter()
            .filter_map(|name| self.get(name).ok())
            .collect();
        // Ollama's models, usable or not (a listing says why not), unless ours shadow them.
        let ours: std::collections::HashSet<ModelName> =
            entries.iter().map(|e| e.name.clone()).collect();
        for model in self.ollama.iter().flat_map(OllamaStore::list) {
            if !ours.contains(&model.name) {
                entries.push(ollama_entry(model));
            }
        }
        entries.sort_by_key(|e| e.name.to_string());
        Ok(entries)
    }

    /// The names of this store's own manifests (`manifests/<folder>/<tag>`), skipping
    /// temporary files and whatever no name maps to.
    fn names(&self) -> Result<Vec<ModelName>> {
        let manifests = self.root.join("manifests");
        let mut names = Vec::new();
        for folder in fs::read_dir(&manifests).map_err(io_err("listing", &manifests))? {
            let folder = folder.map_err(io_err("listing", &manifests))?;
            let Ok(tags) = fs::read_dir(folder.path()) else {
                continue;
            };
            let folder_name = folder.file_name().to_string_lossy().into_owned();
            for tag in tags.flatten() {
                let tag_name = tag.file_name().to_string_lossy().into_owned();
                if tag.file_type().is_ok_and(|t| t.is_file())
                    && let Some(name) = ModelName::from_folder(&folder_name, &tag_name)
                {
                    names.push(name);
                }
            }
        }
        Ok(names)
    }

    /// Takes the writer lock, waiting for whoever holds it; `on_wait` is called first when
    /// someone does.
    pub fn lock(&self, on_wait: &mut dyn FnMut()) -> Result<StoreWriter<'_>> {
        StoreWriter::lock(self, on_wait)
    }

    /// Takes the writer lock if nobody holds it.
    pub fn try_lock(&self) -> Result<Option<StoreWriter<'_>>> {
        StoreWriter::try_lock(self)
    }

    /// A folder where the model's files appear under their original names (symlinks to the
    /// blobs), after checking every blob's digest. Returns the folder and, for GGUF models, the
    /// weights file.
    pub fn materialize(&self, manifest: &Manifest) -> Result<PathBuf> {
        for layer in &manifest.layers {
            self.verify_blob(layer)?;
        }
        let view = self
            .root
            .join("views")
            .join(manifest.digest().replace(':', "-"));
        fs::create_dir_all(&view).map_err(io_err("creating", &view))?;
        for layer in &manifest.layers {
            let link = view.join(&layer.path);
            if let Some(parent) = link.parent() {
                fs::create_dir_all(parent).map_err(io_err("creating", parent))?;
            }
            let blob = self.locate_blob(&layer.digest);
            if fs::read_link(&link).ok().as_deref() == Some(blob.as_path()) {
                continue;
            }
            // Made beside it and renamed over it, so that a request reading the folder while
            // another materializes it (transcriptions do, per request) never finds the file
            // missing, as removing the old link first would leave it for a moment.
            let staged = staging_path(&link);
            let _ = fs::remove_file(&staged);
            symlink(&blob, &staged).map_err(io_err("linking", &staged))?;
            fs::rename(&staged, &link).map_err(io_err("linking", &link))?;
        }
        Ok(view)
    }
}

fn ollama_entry(model: OllamaModel) -> Entry {
    Entry {
        name: model.name,
        manifest: model.manifest,
        modified: model.modified,
        from_ollama: true,
        unusable: model.unusable,
    }
}

/// A name beside `link` no other materialization uses at the same time: the process and a
/// counter.
fn staging_path(link: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = link.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".staged-{}-{n}", std::process::id()));
    link.with_file_name(name)
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
fn symlink(target: &Path, link: &Path) -> io::Result<()> {
    fs::copy(target, link).map(|_| ())
}
