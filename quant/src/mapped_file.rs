//! Read-only memory maps of checkpoint files.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::{Error, Result};

/// A file mapped read-only into memory, with the path kept for error messages.
///
/// Tensors are read lazily: only the pages a tensor touches are faulted in, when MLX copies it.
#[derive(Debug)]
pub(crate) struct MappedFile {
    path: PathBuf,
    map: Mmap,
}

impl MappedFile {
    pub(crate) fn open(path: &Path) -> Result<MappedFile> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let map = map_read_only(&file).map_err(|e| Error::io(path, e))?;
        Ok(MappedFile {
            path: path.to_path_buf(),
            map,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The bytes of `range`, or an error naming `what` if the range leaves the file.
    pub(crate) fn slice(&self, range: Range<u64>, what: &str) -> Result<&[u8]> {
        let len = self.map.len() as u64;
        if range.start > range.end || range.end > len {
            return Err(Error::malformed(
                &self.path,
                format!(
                    "{what}: bytes {}..{} lie outside the file ({len} bytes)",
                    range.start, range.end
                ),
            ));
        }
        // Both ends are ≤ the mapping's length, which is a usize.
        Ok(&self.map[range.start as usize..range.end as usize])
    }
}

#[allow(unsafe_code)]
fn map_read_only(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the mapping is read-only and private to this process. Like every mmap-based
    // loader, we rely on nobody truncating or rewriting a checkpoint while it is open; every
    // offset we read is bounds-checked against the length observed at open time.
    unsafe { Mmap::map(file) }
}
