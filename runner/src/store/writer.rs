//! The one way to change the store: a [`StoreWriter`] holds an exclusive lock on the store's
//! `writer.lock` file for as long as it lives, so writers take turns across threads and
//! processes (the CLI and a server sharing a store), while readers never wait.
//!
//! Under the lock nothing else adds or removes blobs, so a blob that is in place when a
//! manifest is written stays in place: a `rm` cannot collect the blobs of a create in progress,
//! and garbage collection may treat every blob no manifest names as garbage.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read, Write};
use std::ops::Deref;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::{Layer, Manifest, Result, Store, StoreError, durable, hex, io_err, references};
use crate::fault::{self, Point};
use crate::model_name::ModelName;

/// The writer lock, held: the store's changing methods.
#[derive(Debug)]
pub struct StoreWriter<'a> {
    store: &'a Store,
    /// Locked while it is open; the lock goes when it is closed (or the process dies).
    _lock: fs::File,
}

impl Deref for StoreWriter<'_> {
    type Target = Store;

    fn deref(&self) -> &Store {
        self.store
    }
}

fn lock_file(store: &Store) -> Result<fs::File> {
    let path = store.root.join("writer.lock");
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_err("opening", &path))
}

impl<'a> StoreWriter<'a> {
    /// Waits for the lock; `on_wait` is called once first when someone else holds it.
    pub(super) fn lock(store: &'a Store, on_wait: &mut dyn FnMut()) -> Result<StoreWriter<'a>> {
        if let Some(writer) = StoreWriter::try_lock(store)? {
            return Ok(writer);
        }
        on_wait();
        let file = lock_file(store)?;
        file.lock()
            .map_err(io_err("locking", &store.root.join("writer.lock")))?;
        Ok(StoreWriter { store, _lock: file })
    }

    /// The lock, if nobody holds it.
    pub(super) fn try_lock(store: &'a Store) -> Result<Option<StoreWriter<'a>>> {
        let file = lock_file(store)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(StoreWriter { store, _lock: file })),
            Err(fs::TryLockError::WouldBlock) => Ok(None),
            Err(fs::TryLockError::Error(e)) => {
                Err(io_err("locking", &store.root.join("writer.lock"))(e))
            }
        }
    }

    /// Copies `source` (a regular file) into the store, hashing it on the way; returns its
    /// layer record. With `expected` (`sha256:<hex>`), content that hashes otherwise is refused
    /// before it reaches the store. `progress` is called with the bytes copied so far.
    pub fn add_blob(
        &self,
        source: &Path,
        path_in_model: &str,
        expected: Option<&str>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Layer> {
        // A FIFO or a device would block or never end: only regular files are read.
        let regular = fs::metadata(source)
            .map_err(io_err("reading", source))?
            .is_file();
        if !regular {
            return Err(StoreError::NotAFile(path_in_model.to_string()));
        }
        let mut input = fs::File::open(source).map_err(io_err("opening", source))?;
        let blobs = self.root.join("blobs");
        let mut temp = tempfile::NamedTempFile::new_in(&blobs)
            .map_err(io_err("creating a file in", &blobs))?;
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; 1 << 20];
        let mut size = 0u64;
        loop {
            let n = input.read(&mut buffer).map_err(io_err("reading", source))?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
            temp.write_all(&buffer[..n])
                .map_err(io_err("writing", temp.path()))?;
            size += n as u64;
            progress(size);
            fault::reached(Point::BlobWrite);
        }
        let digest = format!("sha256:{}", hex(&hasher.finalize()));
        if let Some(expected) = expected
            && expected != digest
        {
            return Err(StoreError::Mismatch {
                what: path_in_model.to_string(),
                expected: expected.to_string(),
                actual: digest,
            });
        }
        let target = self.blob_path(&digest);
        if target.is_file() {
            // The same content is already stored (another model uses it).
            drop(temp);
        } else {
            temp.as_file()
                .sync_all()
                .map_err(io_err("syncing", &target))?;
            temp.persist(&target).map_err(|e| StoreError::Io {
                what: "moving a blob into",
                path: target.clone(),
                source: e.error,
            })?;
            fault::reached(Point::BlobPersisted);
        }
        Ok(Layer {
            path: path_in_model.to_string(),
            digest,
            size,
        })
    }

    /// Writes `manifest` for `name` in one durable step, replacing any previous one, after
    /// checking that every blob it names is in place; then collects the blobs only the
    /// previous manifest used.
    pub fn put_manifest(&self, name: &ModelName, manifest: &Manifest) -> Result<()> {
        if let Some(missing) = manifest
            .layers
            .iter()
            .find(|l| !self.locate_blob(&l.digest).is_file())
        {
            return Err(StoreError::MissingBlob {
                name: name.to_string(),
                digest: missing.digest.clone(),
            });
        }
        let blobs = self.root.join("blobs");
        // The blobs' names reach the disk before a manifest that names them.
        durable::sync_dir(&blobs).map_err(io_err("syncing", &blobs))?;
        let previous = self.own_manifest(name);
        let path = self.manifest_path(name);
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        durable::create_dir(&dir).map_err(io_err("creating", &dir))?;
        let json = serde_json::to_vec_pretty(manifest).map_err(|e| StoreError::BadManifest {
            name: name.to_string(),
            message: e.to_string(),
        })?;
        durable::replace_file(&path, &json).map_err(io_err("writing", &path))?;
        if let Some(previous) = previous
            && previous.digest() != manifest.digest()
        {
            self.forget(&previous)?;
        }
        Ok(())
    }

    /// `name`'s manifest in this store (not Ollama's), when it has a readable one.
    fn own_manifest(&self, name: &ModelName) -> Option<Manifest> {
        let entry = self.get(name).ok()?;
        (!entry.from_ollama).then_some(entry.manifest)
    }

    /// Removes `name`'s manifest and every blob no other model uses.
    pub fn remove(&self, name: &ModelName) -> Result<()> {
        let entry = self.get(name)?;
        if entry.from_ollama {
            return Err(StoreError::Foreign(name.to_string()));
        }
        let path = self.manifest_path(name);
        fs::remove_file(&path).map_err(io_err("removing", &path))?;
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        durable::sync_dir(&dir).map_err(io_err("syncing", &dir))?;
        // The folder goes with its last tag (it fails harmlessly while others remain).
        let _ = fs::remove_dir(&dir);
        fault::reached(Point::Collect);
        self.forget(&entry.manifest)
    }

    /// Copies `from`'s manifest to `to`.
    pub fn copy(&self, from: &ModelName, to: &ModelName) -> Result<()> {
        let entry = self.get(from)?;
        self.put_manifest(to, &entry.manifest)
    }

    /// Removes what only `manifest` (no longer stored) used: its blobs that no manifest names,
    /// and its view.
    fn forget(&self, manifest: &Manifest) -> Result<()> {
        self.collect(manifest.layers.iter().map(|l| l.digest.clone()))?;
        let view = self
            .root
            .join("views")
            .join(manifest.digest().replace(':', "-"));
        let _ = fs::remove_dir_all(view);
        Ok(())
    }

    /// Removes each blob of `candidates` that no manifest names; returns how many and their
    /// bytes.
    pub fn collect(&self, candidates: impl IntoIterator<Item = String>) -> Result<(usize, u64)> {
        let named = self.named_digests()?;
        let mut removed = (0, 0);
        for digest in candidates.into_iter().collect::<HashSet<_>>() {
            if named.contains(&digest) {
                continue;
            }
            let blob = self.blob_path(&digest);
            let bytes = fs::metadata(&blob).map(|m| m.len()).unwrap_or(0);
            match fs::remove_file(&blob) {
                Ok(()) => {
                    removed.0 += 1;
                    removed.1 += bytes;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("removing", &blob)(e)),
            }
        }
        Ok(removed)
    }

    /// Every digest any file under `manifests/` names.
    pub(super) fn named_digests(&self) -> Result<HashSet<String>> {
        let manifests = self.root.join("manifests");
        references::named_under(&manifests).map_err(io_err("reading", &manifests))
    }
}
