//! What interrupted writes leave, removed at start-up: scratch folders of creates (`tmp/`),
//! half-written blobs and manifests (`.tmp*` files), blobs no manifest names and views no
//! model has, once they are older than the store's grace period. Manifests written by older
//! mlxkit versions under nested folders (`manifests/me/foo/v1`) are moved to where their names
//! now live (`manifests/me%2Ffoo/v1`).
//!
//! It runs only when it gets the writer lock at once: a writer in progress owns its temporary
//! files, and the next start tidies instead.

use std::fs;

use std::path::Path;
use std::time::SystemTime;

use super::{Result, Store, StoreWriter, durable, io_err};
use crate::model_name::ModelName;

/// What a tidy removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Removed {
    /// Files and folders removed.
    pub items: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Manifests moved from the nested layout.
    pub moved: usize,
}

impl Removed {
    fn add(&mut self, (items, bytes): (usize, u64)) {
        self.items += items;
        self.bytes += bytes;
    }
}

/// Tidies `store` if no writer holds it (`None` when one does), logging what it removed.
pub fn remove(store: &Store) -> Result<Option<Removed>> {
    let Some(writer) = store.try_lock()? else {
        tracing::info!("another process is changing the store; leftovers are left for later");
        return Ok(None);
    };
    let removed = tidy(&writer)?;
    if removed.items > 0 || removed.moved > 0 {
        tracing::warn!(
            items = removed.items,
            bytes = removed.bytes,
            moved = removed.moved,
            "removed {} leftovers of interrupted writes ({:.1} MB) from the store",
            removed.items,
            removed.bytes as f64 / 1e6
        );
    }
    Ok(Some(removed))
}

fn tidy(writer: &StoreWriter<'_>) -> Result<Removed> {
    let root = writer.root().to_path_buf();
    let mut removed = Removed {
        moved: move_nested_manifests(&root.join("manifests"))?,
        ..Removed::default()
    };
    let tmp = root.join("tmp");
    if tmp.is_dir() {
        for entry in fs::read_dir(&tmp)
            .map_err(io_err("listing", &tmp))?
            .flatten()
        {
            removed.add(remove_all(&entry.path()));
        }
    }
    let blobs = root.join("blobs");
    for entry in fs::read_dir(&blobs)
        .map_err(io_err("listing", &blobs))?
        .flatten()
    {
        if entry.file_name().to_string_lossy().starts_with(".tmp") {
            removed.add(remove_all(&entry.path()));
        }
    }
    removed.add(remove_temp_files(&root.join("manifests")));
    let old_enough = |path: &Path| {
        fs::symlink_metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age >= writer.orphan_grace)
    };
    let orphans: Vec<String> = fs::read_dir(&blobs)
        .map_err(io_err("listing", &blobs))?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let digest = name.strip_prefix("sha256-")?;
            old_enough(&e.path()).then(|| format!("sha256:{digest}"))
        })
        .collect();
    removed.add(writer.collect(orphans)?);
    // Views of manifests no model has any more (each is a folder of links, named by digest).
    let live: std::collections::HashSet<String> = writer
        .list()?
        .iter()
        .map(|e| e.manifest.digest().replace(':', "-"))
        .collect();
    let views = root.join("views");
    for entry in fs::read_dir(&views)
        .map_err(io_err("listing", &views))?
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !live.contains(&name) && old_enough(&entry.path()) {
            removed.add(remove_all(&entry.path()));
        }
    }
    Ok(removed)
}

/// Removes `path` (a file or a folder), returning what it held; what cannot be removed stays
/// (and is tried again next start).
fn remove_all(path: &Path) -> (usize, u64) {
    let bytes = size_of(path);
    let gone = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match gone {
        Ok(()) => (1, bytes),
        Err(e) => {
            tracing::warn!("could not remove a leftover of the store: {e}");
            (0, 0)
        }
    }
}

fn size_of(path: &Path) -> u64 {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::read_dir(path)
            .map(|d| d.flatten().map(|e| size_of(&e.path())).sum())
            .unwrap_or(0),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

/// Removes the `.tmp*` files of interrupted manifest writes anywhere under `manifests`.
fn remove_temp_files(manifests: &Path) -> (usize, u64) {
    let mut removed = (0, 0);
    let mut folders = vec![manifests.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in fs::read_dir(&folder).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                folders.push(path);
            } else if entry.file_name().to_string_lossy().starts_with(".tmp") {
                let (n, b) = remove_all(&path);
                removed = (removed.0 + n, removed.1 + b);
            }
        }
    }
    removed
}

/// Moves manifests of the nested layout (`manifests/<part>/…/<part>/<tag>`, which older
/// versions wrote for names with `/`) to their folders (`manifests/<part>%2F…/<tag>`); returns
/// how many moved. One that cannot be named, or whose new place is taken, stays (its blobs
/// stay counted: collection reads every file under `manifests/`).
fn move_nested_manifests(manifests: &Path) -> Result<usize> {
    let mut moved = 0;
    let tops: Vec<_> = fs::read_dir(manifests)
        .map_err(io_err("listing", manifests))?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    for top in tops {
        let mut nested = Vec::new();
        for entry in fs::read_dir(&top).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_files(&entry.path(), &mut nested);
            }
        }
        for file in nested {
            let Ok(relative) = file.strip_prefix(manifests) else {
                continue;
            };
            let parts: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let Some((tag, name_parts)) = parts.split_last() else {
                continue;
            };
            let Ok(name) = ModelName::parse(&format!("{}:{tag}", name_parts.join("/"))) else {
                continue;
            };
            let target = manifests.join(name.folder()).join(&name.tag);
            if target.exists() {
                continue;
            }
            let folder = manifests.join(name.folder());
            durable::create_dir(&folder).map_err(io_err("creating", &folder))?;
            fs::rename(&file, &target).map_err(io_err("moving", &file))?;
            durable::sync_dir(&folder).map_err(io_err("syncing", &folder))?;
            moved += 1;
            // Empty folders of the old layout go, innermost first.
            let mut dir = file.parent();
            while let Some(d) = dir
                && d != manifests
                && fs::remove_dir(d).is_ok()
            {
                dir = d.parent();
            }
        }
    }
    Ok(moved)
}

fn collect_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        match entry.file_type() {
            Ok(t) if t.is_dir() => collect_files(&entry.path(), out),
            Ok(t) if t.is_file() && !entry.file_name().to_string_lossy().starts_with('.') => {
                out.push(entry.path())
            }
            _ => {}
        }
    }
}
