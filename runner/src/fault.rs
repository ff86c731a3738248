//! Fault injection for crash-consistency tests: `MLXKIT_FAULT=<point>:<n>[:pause-<ms>]` makes
//! the `n`th (1-based) pass through the named write point abort the process at once (as a
//! crash or `kill -9` would), or pause there for `ms` milliseconds (to widen a race window).
//!
//! Read only in debug builds (tests build the binary so); a release build compiles every point
//! to nothing, so the setting cannot hurt a deployed server.

/// A named place in a write sequence where a crash must leave the store consistent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// A blob's temporary file is half written.
    BlobWrite,
    /// A blob is in place, no manifest names it yet.
    BlobPersisted,
    /// A manifest's temporary file is written and synced, not yet renamed into place.
    ManifestWrite,
    /// A manifest is renamed into place, its folder not yet synced.
    ManifestRenamed,
    /// A manifest was removed, its unused blobs not yet.
    Collect,
    /// Everything of a create is checked and held under the writer lock, nothing committed.
    CreateCommit,
    /// A converted checkpoint is in its scratch folder, not yet imported.
    Scratch,
}

impl Point {
    /// The name `MLXKIT_FAULT` uses.
    pub fn name(self) -> &'static str {
        match self {
            Point::BlobWrite => "blob-write",
            Point::BlobPersisted => "blob-persisted",
            Point::ManifestWrite => "manifest-write",
            Point::ManifestRenamed => "manifest-renamed",
            Point::Collect => "collect",
            Point::CreateCommit => "create-commit",
            Point::Scratch => "scratch",
        }
    }

    /// Every point, for tests that pick one.
    pub const ALL: [Point; 7] = [
        Point::BlobWrite,
        Point::BlobPersisted,
        Point::ManifestWrite,
        Point::ManifestRenamed,
        Point::Collect,
        Point::CreateCommit,
        Point::Scratch,
    ];
}

/// Passes the write point `point`: aborts or pauses here when `MLXKIT_FAULT` asks for it.
#[cfg(debug_assertions)]
pub fn reached(point: Point) {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The parsed setting: the point's name, the pass that faults, and the pause (none: abort).
    static FAULT: OnceLock<Option<(String, u64, Option<u64>)>> = OnceLock::new();
    static PASSES: [AtomicU64; Point::ALL.len()] = [const { AtomicU64::new(0) }; Point::ALL.len()];

    let Some((name, n, pause)) = FAULT.get_or_init(parse) else {
        return;
    };
    if name != point.name() {
        return;
    }
    let index = Point::ALL.iter().position(|p| *p == point).unwrap_or(0);
    if PASSES[index].fetch_add(1, Ordering::SeqCst) + 1 != *n {
        return;
    }
    match pause {
        Some(ms) => std::thread::sleep(std::time::Duration::from_millis(*ms)),
        None => {
            eprintln!("MLXKIT_FAULT: aborting at {name} (pass {n})");
            std::process::abort();
        }
    }
}

/// Release builds have no fault points.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn reached(_point: Point) {}

#[cfg(debug_assertions)]
fn parse() -> Option<(String, u64, Option<u64>)> {
    let text = std::env::var("MLXKIT_FAULT").ok()?;
    let mut parts = text.split(':');
    let name = parts.next()?.to_string();
    let n = parts.next().and_then(|n| n.parse().ok()).unwrap_or(1);
    let pause = parts
        .next()
        .and_then(|p| p.strip_prefix("pause-"))
        .and_then(|ms| ms.parse().ok());
    Some((name, n, pause))
}
