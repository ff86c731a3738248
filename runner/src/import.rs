//! Importing weights into the store: a GGUF file or a transformers / mlx-lm folder.

use std::path::{Path, PathBuf};

use crate::checkpoint_details::{DescribeError, describe};
use crate::model_name::ModelName;
use crate::store::{Format, Layer, Manifest, Store, StoreError, StoreWriter};

/// What went wrong while importing.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The path is neither a GGUF file nor a folder with `config.json`.
    #[error("{0} is neither a .gguf file nor a folder with config.json and safetensors")]
    Unsupported(PathBuf),
    /// The checkpoint is unreadable or cannot run.
    #[error(transparent)]
    Describe(#[from] DescribeError),
    /// Writing to the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Listing the folder failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Progress of an import: `(file, bytes done, bytes total)`.
pub type Progress<'a> = &'a mut dyn FnMut(&str, u64, u64);

/// Files of a transformers folder worth keeping (weights, configs, vocabularies, templates).
fn keep_file(name: &str) -> bool {
    name.ends_with(".safetensors")
        || name.ends_with(".json")
        || name.ends_with(".jinja")
        || name == "tokenizer.model"
}

/// Imports the checkpoint at `path` as `name`, with `source` recorded in the manifest, under
/// the store's writer lock (waiting for it).
pub fn import_path(
    store: &Store,
    name: &ModelName,
    path: &Path,
    source: &str,
    progress: Progress<'_>,
) -> Result<Manifest, ImportError> {
    let writer = store.lock(&mut || {})?;
    let manifest = import_manifest(&writer, path, source, None, progress)?;
    writer.put_manifest(name, &manifest)?;
    Ok(manifest)
}

/// Stores the files of the checkpoint at `path` as blobs and returns its manifest, with
/// `source` recorded, not yet written: the caller completes and writes it. For a GGUF file,
/// `expected_digest` (`sha256:<hex>`) is what its content must hash to; it is checked on the
/// way in, before the blob reaches the store.
pub fn import_manifest(
    writer: &StoreWriter<'_>,
    path: &Path,
    source: &str,
    expected_digest: Option<&str>,
    progress: Progress<'_>,
) -> Result<Manifest, ImportError> {
    let (format, details) = describe(path)?;
    let mut files: Vec<(PathBuf, String)> = Vec::new();
    match format {
        Format::Gguf => files.push((path.to_path_buf(), "model.gguf".to_string())),
        Format::Safetensors => {
            let dir = if path.is_dir() {
                path.to_path_buf()
            } else {
                path.parent()
                    .map(Path::to_path_buf)
                    .ok_or_else(|| ImportError::Unsupported(path.to_path_buf()))?
            };
            let entries = std::fs::read_dir(&dir).map_err(|source| ImportError::Io {
                path: dir.clone(),
                source,
            })?;
            for entry in entries.flatten() {
                let file_name = entry.file_name().to_string_lossy().into_owned();
                if entry.path().is_file() && keep_file(&file_name) {
                    files.push((entry.path(), file_name));
                }
            }
            files.sort_by(|a, b| a.1.cmp(&b.1));
        }
    }
    let expected = match format {
        Format::Gguf => expected_digest,
        Format::Safetensors => None,
    };
    let mut layers: Vec<Layer> = Vec::with_capacity(files.len());
    for (file, path_in_model) in &files {
        let total = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
        let layer = writer.add_blob(file, path_in_model, expected, &mut |done| {
            progress(path_in_model, done, total)
        })?;
        layers.push(layer);
    }
    Ok(Manifest {
        format,
        layers,
        parameters: Default::default(),
        template: None,
        system: None,
        draft: None,
        source: source.to_string(),
        details,
        created_at: crate::timestamp::rfc3339(std::time::SystemTime::now()),
    })
}
