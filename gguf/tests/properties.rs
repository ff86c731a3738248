//! Properties over arbitrary input: no byte string, truncation or corruption of a valid file
//! makes the reader panic, or allocate at once more than the file's own bytes could back.

mod support;

use gguf::{Gguf, parse_metadata};
use proptest::prelude::*;
use support::{LargestAllocation, allocation_bound, largest_allocation, rich_file};

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

/// Parses `bytes` both ways, checks the allocation bound, and returns whether the whole-file
/// parse succeeded.
fn parse_within_bound(bytes: &[u8]) -> Result<bool, TestCaseError> {
    let (whole, largest) = largest_allocation(|| Gguf::parse(bytes).map(|f| f.tensors().len()));
    prop_assert!(
        largest <= allocation_bound(bytes.len()),
        "parsing {} bytes allocated {largest} at once: {whole:?}",
        bytes.len()
    );
    let (meta, largest) = largest_allocation(|| parse_metadata(bytes).map(|m| m.len()));
    prop_assert!(
        largest <= allocation_bound(bytes.len()),
        "reading the metadata of {} bytes allocated {largest} at once: {meta:?}",
        bytes.len()
    );
    Ok(whole.is_ok())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        parse_within_bound(&bytes)?;
    }

    /// Past a valid magic and version, where every byte is read as a count, length or type.
    #[test]
    fn arbitrary_bytes_after_a_header_never_panic(
        version in 2u32..=3,
        rest in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let mut bytes = gguf::MAGIC.to_vec();
        bytes.extend(version.to_le_bytes());
        bytes.extend(rest);
        parse_within_bound(&bytes)?;
    }

    /// Every proper prefix of a valid file is refused by the whole-file parse.
    #[test]
    fn truncations_of_a_valid_file_are_refused(cut in 0usize..10_000) {
        let bytes = rich_file().build();
        let cut = cut % bytes.len();
        prop_assert!(!parse_within_bound(&bytes[..cut])?, "a file cut at {cut} bytes parsed");
    }

    #[test]
    fn corruptions_of_a_valid_file_never_panic(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
    ) {
        let mut bytes = rich_file().build();
        let len = bytes.len();
        for (at, value) in edits {
            bytes[at % len] = value;
        }
        parse_within_bound(&bytes[..=cut % len])?;
    }
}

#[test]
fn the_rich_file_reads_back() {
    let bytes = rich_file().build();
    let file = Gguf::parse(&bytes).unwrap();
    assert_eq!(file.metadata().len(), 14);
    assert_eq!(file.get("i64").and_then(|v| v.as_i64()), Some(-(1 << 40)));
    assert_eq!(
        file.get("u64").and_then(|v| v.as_f64()),
        Some((1u64 << 40) as f64)
    );
    let nested = file.get("nested").and_then(|v| v.as_array()).unwrap();
    assert_eq!(nested[0].as_array().unwrap()[1].as_i64(), Some(2));
    let shapes: Vec<_> = file.tensors().iter().map(|t| t.shape.clone()).collect();
    assert_eq!(shapes, [vec![2, 32], vec![8], vec![2, 2, 4]]);
    let sizes: Vec<_> = file.tensors().iter().map(|t| t.size).collect();
    assert_eq!(sizes, [68, 32, 32]);
    // Each tensor's data lies where the directory says, aligned.
    for tensor in file.tensors() {
        assert_eq!(tensor.offset % file.alignment(), 0);
        assert!(tensor.offset >= file.data_start());
        assert!(tensor.offset + tensor.size <= bytes.len() as u64);
    }
    assert_eq!(bytes[file.tensor("f32").unwrap().offset as usize], 2);
}

/// The bound is tight where it says it is: a real one-byte-per-element array reserves one
/// `MetaValue` per byte, once, and never grows past it.
#[test]
fn a_byte_array_reserves_once() {
    let items = vec![gguf::MetaValue::U8(1); 4096];
    let bytes = gguf::Writer::default()
        .meta("bytes", gguf::MetaValue::Array(items))
        .build();
    let (meta, largest) = largest_allocation(|| parse_metadata(&bytes));
    assert_eq!(
        meta.unwrap()["bytes"].as_array().map(<[_]>::len),
        Some(4096)
    );
    assert_eq!(largest, 4096 * std::mem::size_of::<gguf::MetaValue>());
}
