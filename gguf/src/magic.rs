//! The four bytes every GGUF file starts with: the one place anything asks "is this GGUF?".

use std::io::Read;
use std::path::Path;

/// The magic at byte 0 of every GGUF file.
pub const MAGIC: &[u8; 4] = b"GGUF";

/// Whether `bytes` (a file's first bytes, or all of it) start with GGUF's magic.
pub fn is_gguf(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// Whether the file at `path` starts with GGUF's magic. A directory, a missing or unreadable
/// file, or one shorter than the magic is not GGUF.
pub fn is_gguf_file(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut magic))
        .is_ok()
        && is_gguf(&magic)
}
