//! Truncated, lying and absurd files: each is an error naming the problem, never a panic and
//! never an allocation sized by what the file claims.
//!
//! A counting allocator records the largest single allocation each thread makes, so the tests
//! can check that parsing a file that claims 2^60 tensors or a string of 2^63 bytes allocates
//! no more than a small multiple of the file's real size.

#![allow(unsafe_code)]

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

use quant::{Checkpoint, Error, GgufFile, MetaValue, SafetensorsFile};
use support::gguf_writer::GgufWriter;
use support::safetensors_writer::{f32_bytes, safetensors_file, with_header};
use support::{Rng, random_blocks};

struct LargestAllocation;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the bookkeeping only
// reads a size and touches a const-initialized thread-local cell, which never allocates.
unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(layout.size())));
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(new_size)));
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

/// Runs `f` and returns its result with the largest allocation it made on this thread.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    let out = f();
    (out, LARGEST.with(Cell::get))
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Opens a GGUF that must be refused, checks the message mentions `expect`, and that the
/// parse allocated at most a few times the file's size (plus slack for the error message).
fn refuse_gguf(bytes: &[u8], expect: &str) {
    let dir = support::scratch();
    let path = write(dir.path(), "bad.gguf", bytes);
    let (result, largest) = largest_allocation(|| GgufFile::open(&path));
    let err = result.expect_err("hostile GGUF was accepted");
    let message = err.to_string();
    assert!(
        message.contains(expect),
        "expected {expect:?} in: {message}"
    );
    assert!(
        largest <= 4 * bytes.len() + 4096,
        "parsing {} bytes allocated {largest} at once ({message})",
        bytes.len()
    );
}

fn valid_gguf() -> GgufWriter {
    let mut rng = Rng::new(1);
    GgufWriter::default()
        .meta("general.architecture", MetaValue::String("llama".into()))
        .meta(
            "tokens",
            MetaValue::Array(vec![
                MetaValue::String("a".into()),
                MetaValue::String("b".into()),
            ]),
        )
        .tensor("first", &[32, 2], 8, random_blocks("Q8_0", 2, &mut rng))
        .tensor("second", &[32, 2], 0, vec![0; 256])
}

/// Offset of the first tensor info's name length: after the magic, version, the two counts
/// and the metadata.
fn header_end_of_metadata(writer: &GgufWriter) -> usize {
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
    let dir = support::scratch();
    let path = write(dir.path(), "ok.gguf", &valid_gguf().build());
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.tensors().len(), 2);
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = valid_gguf().build();
    for len in 0..bytes.len() {
        let dir = support::scratch();
        let path = write(dir.path(), "cut.gguf", &bytes[..len]);
        assert!(
            GgufFile::open(&path).is_err(),
            "a file cut at {len} bytes opened"
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
fn bad_shapes_and_types_are_refused() {
    let base = || GgufWriter::default();
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
    let dir = support::scratch();
    for _ in 0..500 {
        let mut corrupt = bytes.clone();
        for _ in 0..1 + rng.byte() % 4 {
            let at = (rng.next_u64() % corrupt.len() as u64) as usize;
            corrupt[at] = rng.byte();
        }
        let path = write(dir.path(), "fuzz.gguf", &corrupt);
        let (result, largest) =
            largest_allocation(|| GgufFile::open(&path).map(|f| f.tensors().len()));
        assert!(
            largest <= 4 * corrupt.len() + 4096,
            "allocated {largest}: {result:?}"
        );
    }
}

/// Opens a safetensors file that must be refused; the message must mention `expect`.
fn refuse_safetensors(bytes: &[u8], expect: &str) {
    let dir = support::scratch();
    let path = write(dir.path(), "bad.safetensors", bytes);
    let (result, largest) = largest_allocation(|| SafetensorsFile::open(&path));
    let message = result
        .expect_err("hostile safetensors was accepted")
        .to_string();
    assert!(
        message.contains(expect),
        "expected {expect:?} in: {message}"
    );
    assert!(
        largest <= 8 * bytes.len() + 4096,
        "allocated {largest} ({message})"
    );
}

#[test]
fn hostile_safetensors_are_refused() {
    let entry = |dtype: &str, shape: &str, offsets: &str| {
        format!(r#"{{"w":{{"dtype":"{dtype}","shape":{shape},"data_offsets":{offsets}}}}}"#)
    };
    refuse_safetensors(&[1, 2, 3], "too short");
    let mut lying = with_header(&entry("F32", "[2]", "[0,8]"), &[0; 8]);
    lying[..8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    refuse_safetensors(&lying, "runs past the end of the file");
    lying[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    refuse_safetensors(&lying, "exceeds");
    refuse_safetensors(
        &with_header(&entry("F32", "[4]", "[0,16]"), &[0; 8]),
        "\"w\"",
    );
    refuse_safetensors(
        &with_header(&entry("F32", "[4]", "[0,16]"), &[0; 8]),
        "past the end of the data",
    );
    refuse_safetensors(&with_header(&entry("F32", "[-2]", "[0,8]"), &[0; 8]), "-2");
    refuse_safetensors(
        &with_header(&entry("F32", "[2]", "[-8,0]"), &[0; 8]),
        "non-negative",
    );
    refuse_safetensors(
        &with_header(&entry("F32", "[2]", "[8,0]"), &[0; 8]),
        "end before",
    );
    refuse_safetensors(
        &with_header(&entry("F32", "[3]", "[0,8]"), &[0; 8]),
        "needs 12",
    );
    refuse_safetensors(
        &with_header(&entry("Q9", "[2]", "[0,8]"), &[0; 8]),
        "unsupported dtype",
    );
    refuse_safetensors(
        &with_header(
            &entry("F32", "[4294967296, 4294967296, 4294967296]", "[0,8]"),
            &[0; 8],
        ),
        "too large",
    );
    refuse_safetensors(&with_header("{not json", &[]), "not a JSON object");
    let overlapping = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    refuse_safetensors(&with_header(overlapping, &[0; 12]), "overlap");
}

#[test]
fn every_safetensors_truncation_is_an_error() {
    let bytes = safetensors_file(&[("w", "F32", vec![2, 2], f32_bytes(&[1.0, 2.0, 3.0, 4.0]))]);
    let dir = support::scratch();
    for len in 0..bytes.len() {
        let path = write(dir.path(), "cut.safetensors", &bytes[..len]);
        assert!(SafetensorsFile::open(&path).is_err(), "cut at {len} opened");
    }
    let path = write(dir.path(), "whole.safetensors", &bytes);
    assert!(SafetensorsFile::open(&path).is_ok());
}

#[test]
fn a_lying_shard_index_is_refused() {
    let dir = support::scratch();
    write(dir.path(), "config.json", b"{}");
    write(
        dir.path(),
        "a.safetensors",
        &safetensors_file(&[("x", "F32", vec![1], f32_bytes(&[1.0]))]),
    );
    write(
        dir.path(),
        "model.safetensors.index.json",
        br#"{"weight_map": {"x": "a.safetensors", "y": "a.safetensors"}}"#,
    );
    let err = Checkpoint::open(dir.path()).unwrap_err().to_string();
    assert!(err.contains("\"y\"") && err.contains("lacks"), "{err}");
    write(
        dir.path(),
        "model.safetensors.index.json",
        br#"{"weight_map": {"x": "../a.safetensors"}}"#,
    );
    let err = Checkpoint::open(dir.path()).unwrap_err().to_string();
    assert!(err.contains("not a file in this directory"), "{err}");
    write(
        dir.path(),
        "model.safetensors.index.json",
        br#"{"weight_map": {"x": "b.safetensors"}}"#,
    );
    let err = Checkpoint::open(dir.path()).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
}
