//! Which blobs the store's manifests name, as garbage collection must count them: every file
//! under `manifests/` (any name, any depth, half-written temporary files too) is read as text
//! and every `sha256:<64 hex>` in it counts, so no manifest that exists, or may be about to,
//! can lose a blob — whether or not it parses.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::Path;

const PREFIX: &[u8] = b"sha256:";
const HEX_DIGITS: usize = 64;

/// Every digest named under `manifests`.
pub(super) fn named_under(manifests: &Path) -> io::Result<HashSet<String>> {
    let mut digests = HashSet::new();
    let mut folders = vec![manifests.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in fs::read_dir(&folder)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                folders.push(entry.path());
            } else if kind.is_file() {
                match fs::read(entry.path()) {
                    Ok(bytes) => digests.extend(digests_in(&bytes)),
                    // Renamed or removed since it was listed: whatever replaced it is read
                    // too, or was never there.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(digests)
}

/// The `sha256:<hex>` strings in `bytes`.
fn digests_in(bytes: &[u8]) -> impl Iterator<Item = String> + '_ {
    bytes
        .windows(PREFIX.len() + HEX_DIGITS)
        .filter(|w| {
            w.starts_with(PREFIX)
                && w[PREFIX.len()..]
                    .iter()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        })
        .map(|w| String::from_utf8_lossy(w).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_digest_in_any_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = format!("sha256:{}", "a".repeat(64));
        let b = format!("sha256:{}", &"0123456789".repeat(7)[..64]);
        fs::create_dir_all(dir.path().join("x%2Fy")).unwrap();
        fs::write(
            dir.path().join("x%2Fy/v1"),
            format!("{{\"digest\":\"{a}\"}}"),
        )
        .unwrap();
        fs::create_dir_all(dir.path().join("old/nested")).unwrap();
        // Not JSON at all (a half-written temporary file): still counted.
        fs::write(dir.path().join("old/nested/.tmp123"), format!("{{\"di {b}")).unwrap();
        let found = named_under(dir.path()).unwrap();
        assert_eq!(found, HashSet::from([a, b]));
    }
}
