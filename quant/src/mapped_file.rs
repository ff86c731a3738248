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

    /// Calls `f` with the bytes of `range` (an error naming `what` if the range leaves the
    /// file), then gives the pages back: a loader copies each tensor once into its own memory,
    /// and the file's pages, faulted in by the copy, would otherwise count in the process's
    /// resident memory until the whole checkpoint closed (the peak of a load held the
    /// checkpoint's size twice over, 90 MB for SmolLM2 135M's GGUF).
    pub(crate) fn read<T>(
        &self,
        range: Range<u64>,
        what: &str,
        f: impl FnOnce(&[u8]) -> Result<T>,
    ) -> Result<T> {
        let out = f(self.slice(range.clone(), what)?)?;
        // The range was checked by `slice`, so it lies inside the mapping.
        self.release(range.start as usize, (range.end - range.start) as usize);
        Ok(out)
    }

    #[allow(unsafe_code)]
    fn release(&self, offset: usize, len: usize) {
        #[cfg(unix)]
        {
            // SAFETY: the mapping is a private, read-only map of a file: dropping its pages
            // discards nothing, and any later read faults them in again from the file, with
            // the same bytes (the assumption every mmap loader makes, see `map_read_only`).
            // A failure only leaves the pages resident, so it is ignored.
            let _ = unsafe {
                self.map
                    .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len)
            };
        }
        #[cfg(not(unix))]
        let _ = (offset, len);
    }
}

#[allow(unsafe_code)]
fn map_read_only(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the mapping is read-only and private to this process. Like every mmap-based
    // loader, we rely on nobody truncating or rewriting a checkpoint while it is open; every
    // offset we read is bounds-checked against the length observed at open time.
    unsafe { Mmap::map(file) }
}
