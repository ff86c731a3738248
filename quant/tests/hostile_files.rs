//! Truncated, lying and absurd files: each is an error naming the problem, never a panic and
//! never an allocation sized by what the file claims. GGUF's own cases live with its reader, in
//! `gguf/tests/hostile.rs`.
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

/// The `gguf` crate's reader and its hostile-file tests (`gguf/tests/hostile.rs`) own the GGUF
/// checks; this is the seam: a refused file surfaces through `GgufFile` and `Checkpoint` as a
/// typed error naming the file and the tensor, within the same allocation bound.
#[test]
fn a_hostile_gguf_is_refused_naming_the_file_and_tensor() {
    let writer = GgufWriter::default()
        .meta("general.architecture", MetaValue::String("llama".into()))
        .tensor("first", &[32, 2], 0, vec![0; 256]);
    let dir = support::scratch();
    let path = write(dir.path(), "ok.gguf", &writer.build());
    assert_eq!(GgufFile::open(&path).unwrap().tensors().len(), 1);

    let bytes = writer.build();
    let path = write(dir.path(), "cut.gguf", &bytes[..bytes.len() - 1]);
    let (result, largest) = largest_allocation(|| GgufFile::open(&path));
    let err = result.expect_err("a truncated GGUF opened");
    assert!(matches!(err, Error::Gguf { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("cut.gguf") && message.contains("\"first\""),
        "{message}"
    );
    assert!(largest <= 4 * bytes.len() + 4096, "allocated {largest}");
    let message = Checkpoint::open(&path).unwrap_err().to_string();
    assert!(message.contains("\"first\""), "{message}");
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
