//! Truncated, lying and absurd files: each is an error naming the problem, never a panic and
//! never an allocation sized by what the file claims. Moved here from `quant`'s
//! `hostile_files.rs`, which tested this reader through `GgufFile::open`; the files are read
//! from disk, as `quant` reads them, and the same bytes are parsed from memory too.

mod support;

use std::path::Path;

use gguf::{Gguf, MetaValue, Writer};
use support::{LargestAllocation, Rng, largest_allocation};

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Reads a GGUF that must be refused, from a file and from memory; checks both messages mention
/// `expect`, and that neither read allocated more than a few times the file's size (plus slack
/// for the error message).
fn refuse_gguf(bytes: &[u8], expect: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "bad.gguf", bytes);
    let from_file = largest_allocation(|| Gguf::read(&path));
    let from_memory = largest_allocation(|| Gguf::parse(bytes));
    for (how, (result, largest)) in [("file", from_file), ("memory", from_memory)] {
        let err = result.expect_err("hostile GGUF was accepted");
        let message = err.to_string();
        assert!(
            message.contains(expect),
            "from {how}: expected {expect:?} in: {message}"
        );
        // Reading from a file adds its 64 KiB buffer.
        let buffer = if how == "file" { 1 << 16 } else { 0 };
        assert!(
            largest <= 4 * bytes.len() + 4096 + buffer,
            "parsing {} bytes from {how} allocated {largest} at once ({message})",
            bytes.len()
        );
    }
}

fn valid_gguf() -> Writer {
    Writer::default()
        .meta("general.architecture", MetaValue::String("llama".into()))
        .meta(
            "tokens",
            MetaValue::Array(vec![
                MetaValue::String("a".into()),
                MetaValue::String("b".into()),
            ]),
        )
        .tensor("first", &[32, 2], 8, (0..68).collect())
        .tensor("second", &[32, 2], 0, vec![0; 256])
}

/// Offset of the first tensor info's name length: after the magic, version, the two counts
/// and the metadata.
fn header_end_of_metadata(writer: &Writer) -> usize {
    24 + writer
        .metadata
        .iter()
        .map(|(key, value)| 8 + key.len() + 4 + encoded_len(value))
        .sum::<usize>()
}

fn encoded_len(value: &MetaValue) -> usize {
    match value {
        MetaValue::String(s) => 8 + s.len(),
        MetaValue::Array(items) => 12 + items.iter().map(encoded_len).sum::<usize>(),
        MetaValue::U8(_) | MetaValue::I8(_) | MetaValue::Bool(_) => 1,
        MetaValue::U16(_) | MetaValue::I16(_) => 2,
        MetaValue::U32(_) | MetaValue::I32(_) | MetaValue::F32(_) => 4,
        MetaValue::U64(_) | MetaValue::I64(_) | MetaValue::F64(_) => 8,
    }
}

#[test]
fn a_valid_file_opens() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = valid_gguf().build();
    let path = write(dir.path(), "ok.gguf", &bytes);
    let file = Gguf::read(&path).unwrap();
    assert_eq!(file.tensors().len(), 2);
    let parsed = Gguf::parse(&bytes).unwrap();
    assert_eq!(parsed.tensors(), file.tensors());
    assert_eq!(parsed.metadata(), file.metadata());
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = valid_gguf().build();
    let dir = tempfile::tempdir().unwrap();
    for len in 0..bytes.len() {
        let path = write(dir.path(), "cut.gguf", &bytes[..len]);
        assert!(
            Gguf::read(&path).is_err(),
            "a file cut at {len} bytes opened"
        );
        assert!(
            Gguf::parse(&bytes[..len]).is_err(),
            "a slice cut at {len} bytes parsed"
        );
    }
}

#[test]
fn truncated_tensor_data_names_the_tensor() {
    let bytes = valid_gguf().build();
    refuse_gguf(&bytes[..bytes.len() - 1], "\"second\"");
}

#[test]
fn bad_magic_and_versions_are_refused() {
    let mut bytes = valid_gguf().build();
    bytes[0] = b'X';
    refuse_gguf(&bytes, "not a GGUF file");
    for version in [1u32, 4, u32::MAX] {
        let mut bytes = valid_gguf().build();
        bytes[4..8].copy_from_slice(&version.to_le_bytes());
        refuse_gguf(&bytes, &format!("version {version}"));
    }
}

#[test]
fn absurd_counts_are_refused_without_allocating() {
    let mut bytes = valid_gguf().build();
    bytes[8..16].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    refuse_gguf(&bytes, "tensor count");
    let mut bytes = valid_gguf().build();
    bytes[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    refuse_gguf(&bytes, "metadata count");
}

#[test]
fn absurd_string_and_array_lengths_are_refused_without_allocating() {
    // The first key's length.
    let mut bytes = valid_gguf().build();
    bytes[24..32].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
    refuse_gguf(&bytes, "string length");
    // The array's length: after key 1 (8 + 20 + 4 + 8 + 5), key 2 (8 + 6), type, item type.
    let writer = valid_gguf();
    let at = 24 + (8 + 20 + 4 + 8 + 5) + (8 + 6) + 4 + 4;
    let mut bytes = writer.build();
    assert_eq!(u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()), 2);
    bytes[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    refuse_gguf(&bytes, "array length");
    // The first tensor name's length.
    let at = header_end_of_metadata(&writer);
    let mut bytes = writer.build();
    assert_eq!(u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()), 5);
    bytes[at..at + 8].copy_from_slice(&(1u64 << 50).to_le_bytes());
    refuse_gguf(&bytes, "tensor #0 name");
}

#[test]
fn offsets_past_the_end_are_refused() {
    let writer = valid_gguf();
    let bytes = writer.build_with_offsets(&[0, 1 << 40]);
    refuse_gguf(&bytes, "\"second\"");
    let bytes = writer.build_with_offsets(&[u64::MAX - 31, 96]);
    refuse_gguf(&bytes, "\"first\"");
}

#[test]
fn overlapping_and_misaligned_tensors_are_refused() {
    let writer = valid_gguf();
    refuse_gguf(&writer.build_with_offsets(&[0, 32]), "overlap");
    refuse_gguf(&writer.build_with_offsets(&[0, 81]), "alignment");
}

#[test]
fn duplicate_tensor_names_are_refused() {
    let bytes = Writer::default()
        .tensor("t", &[8], 0, vec![0; 32])
        .tensor("t", &[8], 0, vec![0; 32])
        .build();
    refuse_gguf(&bytes, "\"t\" appears twice");
}

#[test]
fn bad_shapes_and_types_are_refused() {
    let base = Writer::default;
    refuse_gguf(&base().tensor("t", &[], 0, vec![]).build(), "0 dimensions");
    refuse_gguf(
        &base().tensor("t", &[1, 1, 1, 1, 1], 0, vec![0; 4]).build(),
        "5 dimensions",
    );
    refuse_gguf(
        &base().tensor("t", &[1 << 33, 1], 0, vec![]).build(),
        "too large",
    );
    refuse_gguf(
        &base()
            .tensor(
                "t",
                &[i32::MAX as u64, i32::MAX as u64, i32::MAX as u64, 8],
                0,
                vec![],
            )
            .build(),
        "overflows",
    );
    refuse_gguf(
        &base().tensor("t", &[16], 8, vec![0; 34]).build(),
        "whole number",
    );
    refuse_gguf(
        &base().tensor("t", &[32], 99, vec![0; 34]).build(),
        "GGML type 99",
    );
    refuse_gguf(
        &base()
            .meta("general.alignment", MetaValue::U32(24))
            .tensor("t", &[8], 0, vec![0; 32])
            .build(),
        "power of two",
    );
}

#[test]
fn random_corruption_never_panics() {
    let bytes = valid_gguf().build();
    let mut rng = Rng::new(42);
    for _ in 0..500 {
        let mut corrupt = bytes.clone();
        for _ in 0..1 + rng.byte() % 4 {
            let at = (rng.next_u64() % corrupt.len() as u64) as usize;
            corrupt[at] = rng.byte();
        }
        let (result, largest) =
            largest_allocation(|| Gguf::parse(&corrupt).map(|f| f.tensors().len()));
        assert!(
            largest <= 4 * corrupt.len() + 4096,
            "allocated {largest}: {result:?}"
        );
    }
}
