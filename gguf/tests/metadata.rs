//! The metadata reader alone, as a tokenizer uses it: every value type, lying lengths, bad
//! magic, versions, types and booleans, duplicate keys, and files named in I/O errors. Moved
//! here from `tokenizer`'s `gguf_meta.rs` unit tests, which tested its copy of this reader.

use gguf::{Error, MetaValue, Writer, parse_metadata, read_metadata};

fn sample() -> Vec<u8> {
    Writer::default()
        .meta("general.architecture", MetaValue::String("llama".into()))
        .meta("llama.context_length", MetaValue::U32(2048))
        .meta("tokenizer.ggml.add_bos_token", MetaValue::Bool(true))
        .meta("tokenizer.ggml.tokens", strings(&["a", "b", "ab"]))
        .meta(
            "tokenizer.ggml.scores",
            MetaValue::Array([0.0, -1.0, -2.5].map(MetaValue::F32).to_vec()),
        )
        .meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array([1, 1, 3].map(MetaValue::I32).to_vec()),
        )
        .build()
}

fn strings(items: &[&str]) -> MetaValue {
    MetaValue::Array(
        items
            .iter()
            .map(|s| MetaValue::String(s.to_string()))
            .collect(),
    )
}

/// A file of metadata pairs alone, as the tokenizer's tests wrote them.
fn pairs(pairs: &[(&str, MetaValue)]) -> Vec<u8> {
    let mut writer = Writer::default();
    for (key, value) in pairs {
        writer = writer.meta(key, value.clone());
    }
    writer.build()
}

#[test]
fn reads_every_kind_of_pair() {
    let meta = parse_metadata(&sample()).unwrap();
    assert_eq!(meta["general.architecture"].as_str(), Some("llama"));
    assert_eq!(meta["llama.context_length"].as_u64(), Some(2048));
    assert_eq!(meta["tokenizer.ggml.add_bos_token"].as_bool(), Some(true));
    let tokens: Vec<_> = meta["tokenizer.ggml.tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(tokens, ["a", "b", "ab"]);
    assert_eq!(
        meta["tokenizer.ggml.scores"].as_array().unwrap()[2].as_f64(),
        Some(-2.5)
    );
    assert_eq!(
        meta["tokenizer.ggml.token_type"].as_array().unwrap()[2].as_i64(),
        Some(3)
    );
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample();
    for cut in 0..bytes.len() {
        let err = parse_metadata(&bytes[..cut]).unwrap_err();
        assert!(
            matches!(err, Error::Malformed { .. }),
            "cut at {cut}: {err}"
        );
    }
}

#[test]
fn lying_lengths_are_errors_not_allocations() {
    // A string length of 2^62 right after the header.
    let mut bytes = pairs(&[("k", MetaValue::String("v".into()))]);
    bytes[24..32].copy_from_slice(&(1u64 << 62).to_le_bytes());
    let err = parse_metadata(&bytes).unwrap_err().to_string();
    assert!(err.contains("string claims"), "{err}");

    // An array claiming 2^40 strings.
    let mut bytes = pairs(&[("k", strings(&["x"]))]);
    let count_at = 24 + 8 + 1 + 4 + 4;
    bytes[count_at..count_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let err = parse_metadata(&bytes).unwrap_err().to_string();
    assert!(err.contains("array claims"), "{err}");

    // A metadata table claiming more pairs than bytes.
    let mut bytes = pairs(&[]);
    bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    let err = parse_metadata(&bytes).unwrap_err().to_string();
    assert!(err.contains("metadata table claims"), "{err}");
}

#[test]
fn rejects_wrong_magic_version_and_types() {
    let mut bytes = sample();
    bytes[0] = b'X';
    assert!(
        parse_metadata(&bytes)
            .unwrap_err()
            .to_string()
            .contains("not a GGUF")
    );

    let mut bytes = sample();
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(
        parse_metadata(&bytes)
            .unwrap_err()
            .to_string()
            .contains("version 1")
    );

    let mut bytes = pairs(&[("k", MetaValue::U32(1))]);
    bytes[24 + 8 + 1..24 + 8 + 1 + 4].copy_from_slice(&99u32.to_le_bytes());
    assert!(
        parse_metadata(&bytes)
            .unwrap_err()
            .to_string()
            .contains("type 99")
    );

    let mut bytes = pairs(&[("k", MetaValue::Bool(true))]);
    let last = bytes.len() - 1;
    bytes[last] = 7;
    assert!(
        parse_metadata(&bytes)
            .unwrap_err()
            .to_string()
            .contains("boolean")
    );
}

#[test]
fn duplicate_keys_are_rejected() {
    let bytes = pairs(&[("k", MetaValue::U32(1)), ("k", MetaValue::U32(2))]);
    assert!(
        parse_metadata(&bytes)
            .unwrap_err()
            .to_string()
            .contains("twice")
    );
}

#[test]
fn arrays_nest_only_so_deep() {
    let mut value = MetaValue::U8(1);
    for _ in 0..gguf::MAX_ARRAY_DEPTH {
        value = MetaValue::Array(vec![value]);
    }
    assert!(parse_metadata(&pairs(&[("k", value.clone())])).is_ok());
    let deeper = MetaValue::Array(vec![value]);
    let err = parse_metadata(&pairs(&[("k", deeper)])).unwrap_err();
    assert!(err.to_string().contains("nested deeper"), "{err}");
}

#[test]
fn reads_from_a_file_and_names_it_on_failure() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, sample()).unwrap();
    assert_eq!(read_metadata(&path).unwrap().len(), 6);
    let missing = dir.path().join("absent.gguf");
    assert!(
        read_metadata(&missing)
            .unwrap_err()
            .to_string()
            .contains("absent.gguf")
    );
}

#[test]
fn the_magic_is_checked_in_one_place() {
    assert!(gguf::is_gguf(&sample()));
    assert!(!gguf::is_gguf(b"GGU"));
    assert!(!gguf::is_gguf(b"{\"safetensors\""));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.bin");
    std::fs::write(&path, sample()).unwrap();
    assert!(gguf::is_gguf_file(&path));
    std::fs::write(&path, b"GG").unwrap();
    assert!(!gguf::is_gguf_file(&path));
    assert!(!gguf::is_gguf_file(dir.path()));
    assert!(!gguf::is_gguf_file(&dir.path().join("absent")));
}
