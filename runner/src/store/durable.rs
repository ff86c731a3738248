//! Writes that survive a crash or a power cut whole or not at all: a temporary file in the
//! destination's folder, synced, renamed over the destination, then the folder synced so the
//! rename itself is on disk.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use crate::fault::{self, Point};

/// Replaces `path` with `bytes`: a reader (or a crash) sees the old content or the new, never
/// a part.
pub(super) fn replace_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut temp = tempfile::NamedTempFile::new_in(dir)?;
    temp.write_all(bytes)?;
    temp.as_file().sync_all()?;
    fault::reached(Point::ManifestWrite);
    temp.persist(path).map_err(|e| e.error)?;
    fault::reached(Point::ManifestRenamed);
    sync_dir(dir)
}

/// Makes the names in `dir` (files renamed or removed there) durable.
#[cfg(unix)]
pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// Other systems cannot open a folder to sync it; their renames are as durable as they make
/// them.
#[cfg(not(unix))]
pub(super) fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}

/// Creates `dir` (and its parents), syncing the parent of each folder it made, so a manifest
/// written inside is not lost with its folder.
pub(super) fn create_dir(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dir(parent)?;
    }
    match fs::create_dir(dir) {
        Ok(()) => sync_dir(dir.parent().unwrap_or(Path::new("."))),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}
