//! A bounds-checked reader for the key/value metadata at the head of a GGUF file.
//!
//! Only the header and the metadata pairs are read; the tensor table and tensor data that follow
//! are never touched, so reading a multi-gigabyte model costs only its vocabulary. Every length
//! the file states (string lengths, array counts, the number of pairs) is checked against the
//! bytes that remain before anything is allocated, so a truncated or lying file is an
//! [`Error::Gguf`] naming the offset, never a panic or a huge allocation.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::error::{Error, Result};

/// Metadata of one GGUF file: key → value, in key order.
pub type GgufMetadata = BTreeMap<String, MetaValue>;

/// One GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7.
    Bool(bool),
    /// Type 8.
    String(String),
    /// Type 9: every element has the same type.
    Array(Vec<MetaValue>),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

impl MetaValue {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float, if it is any number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            // Scores are sometimes written as integers; precision loss past 2^53 is irrelevant.
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The value as a boolean, if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value as text, if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements, if the value is an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(items) => Some(items),
            _ => None,
        }
    }
}

const MAGIC: &[u8; 4] = b"GGUF";
/// Arrays of arrays are legal but no vocabulary uses them deeply; the cap keeps a hostile file
/// from recursing without bound.
const MAX_ARRAY_DEPTH: usize = 4;

/// Reads the metadata of the GGUF file at `path`, stopping before the tensor table.
pub fn read_gguf_metadata(path: &Path) -> Result<GgufMetadata> {
    let io_err = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    let len = file.metadata().map_err(io_err)?.len();
    let mut reader = MetaReader {
        inner: BufReader::with_capacity(1 << 16, file),
        offset: 0,
        len,
    };
    reader.read_all().map_err(|err| match err {
        ReadError::Io(source) => Error::Io {
            path: path.to_path_buf(),
            source,
        },
        ReadError::Format(err) => err,
    })
}

/// Parses GGUF metadata from the first bytes of a GGUF file held in memory.
///
/// `bytes` may stop anywhere after the metadata; the tensor table is not read.
pub fn parse_gguf_metadata(bytes: &[u8]) -> Result<GgufMetadata> {
    let len = bytes.len() as u64;
    let mut reader = MetaReader {
        inner: bytes,
        offset: 0,
        len,
    };
    reader.read_all().map_err(|err| match err {
        ReadError::Io(source) => Error::Gguf {
            offset: reader.offset,
            reason: source.to_string(),
        },
        ReadError::Format(err) => err,
    })
}

enum ReadError {
    Io(std::io::Error),
    Format(Error),
}

impl From<Error> for ReadError {
    fn from(err: Error) -> Self {
        ReadError::Format(err)
    }
}

struct MetaReader<R> {
    inner: R,
    offset: u64,
    len: u64,
}

impl<R: Read> MetaReader<R> {
    fn fail<T>(&self, reason: impl Into<String>) -> Result<T, ReadError> {
        Err(ReadError::Format(Error::Gguf {
            offset: self.offset,
            reason: reason.into(),
        }))
    }

    fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.offset)
    }

    /// Fails unless `count` items of at least `min_size` bytes each can still fit in the file.
    fn ensure_fits(&self, count: u64, min_size: u64, what: &str) -> Result<(), ReadError> {
        match count.checked_mul(min_size) {
            Some(need) if need <= self.remaining() => Ok(()),
            _ => self.fail(format!(
                "{what} claims {count} entries but only {} bytes remain",
                self.remaining()
            )),
        }
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], ReadError> {
        if (N as u64) > self.remaining() {
            return self.fail(format!("file ends inside a {N}-byte field"));
        }
        let mut buf = [0u8; N];
        self.inner.read_exact(&mut buf).map_err(ReadError::Io)?;
        self.offset += N as u64;
        Ok(buf)
    }

    fn u32(&mut self) -> Result<u32, ReadError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64, ReadError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    fn string(&mut self) -> Result<String, ReadError> {
        let len = self.u64()?;
        if len > self.remaining() {
            return self.fail(format!(
                "string claims {len} bytes but only {} remain",
                self.remaining()
            ));
        }
        let start = self.offset;
        // `len` fits in the remaining file, which fits in memory only if the file does; a
        // `usize` conversion failure therefore means a file too large for this machine.
        let Ok(len_usize) = usize::try_from(len) else {
            return self.fail(format!("string of {len} bytes does not fit in memory"));
        };
        let mut buf = vec![0u8; len_usize];
        self.inner.read_exact(&mut buf).map_err(ReadError::Io)?;
        self.offset += len;
        String::from_utf8(buf).map_err(|_| {
            ReadError::Format(Error::Gguf {
                offset: start,
                reason: "string is not valid UTF-8".to_string(),
            })
        })
    }

    fn read_all(&mut self) -> Result<GgufMetadata, ReadError> {
        let magic: [u8; 4] = self.bytes()?;
        if &magic != MAGIC {
            return self.fail(format!("not a GGUF file (magic {magic:02x?})"));
        }
        let version = self.u32()?;
        if !(2..=3).contains(&version) {
            return self.fail(format!(
                "unsupported GGUF version {version} (supported: 2, 3)"
            ));
        }
        let _tensor_count = self.u64()?;
        let kv_count = self.u64()?;
        // Smallest pair: an empty key (8) + type (4) + a one-byte value.
        self.ensure_fits(kv_count, 13, "metadata table")?;
        let mut map = GgufMetadata::new();
        for _ in 0..kv_count {
            let key = self.string()?;
            let value_type = self.u32()?;
            let value = self.value(value_type, 0)?;
            if map.insert(key.clone(), value).is_some() {
                return self.fail(format!("metadata key `{key}` appears twice"));
            }
        }
        Ok(map)
    }

    fn value(&mut self, value_type: u32, depth: usize) -> Result<MetaValue, ReadError> {
        Ok(match value_type {
            0 => MetaValue::U8(u8::from_le_bytes(self.bytes()?)),
            1 => MetaValue::I8(i8::from_le_bytes(self.bytes()?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.bytes()?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.bytes()?)),
            4 => MetaValue::U32(self.u32()?),
            5 => MetaValue::I32(i32::from_le_bytes(self.bytes()?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.bytes()?)),
            7 => match self.bytes::<1>()?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                other => return self.fail(format!("boolean byte is {other}, not 0 or 1")),
            },
            8 => MetaValue::String(self.string()?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return self.fail(format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"));
                }
                let elem_type = self.u32()?;
                let count = self.u64()?;
                let Some(min_size) = min_encoded_size(elem_type) else {
                    return self.fail(format!("unknown array element type {elem_type}"));
                };
                self.ensure_fits(count, min_size, "array")?;
                // Reserve for what fits in memory easily; larger arrays grow as their elements
                // are actually read, so a count near the file size cannot demand 30x the file.
                let mut items = Vec::with_capacity(count.min(1 << 20) as usize);
                for _ in 0..count {
                    items.push(self.value(elem_type, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(self.u64()?),
            11 => MetaValue::I64(i64::from_le_bytes(self.bytes()?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.bytes()?)),
            other => return self.fail(format!("unknown value type {other}")),
        })
    }
}

/// The fewest bytes one value of `value_type` can occupy, or `None` for an unknown type.
fn min_encoded_size(value_type: u32) -> Option<u64> {
    Some(match value_type {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes GGUF v3 headers and metadata for tests: the inverse of the reader.
    pub(crate) struct GgufWriter {
        pub(crate) bytes: Vec<u8>,
        count: u64,
    }

    impl GgufWriter {
        pub(crate) fn new() -> Self {
            let mut bytes = b"GGUF".to_vec();
            bytes.extend(3u32.to_le_bytes());
            bytes.extend(0u64.to_le_bytes());
            bytes.extend(0u64.to_le_bytes()); // patched in `finish`
            GgufWriter { bytes, count: 0 }
        }

        fn str_raw(&mut self, s: &str) {
            self.bytes.extend((s.len() as u64).to_le_bytes());
            self.bytes.extend(s.as_bytes());
        }

        fn key(&mut self, key: &str, ty: u32) {
            self.count += 1;
            self.str_raw(key);
            self.bytes.extend(ty.to_le_bytes());
        }

        pub(crate) fn string(mut self, key: &str, v: &str) -> Self {
            self.key(key, 8);
            self.str_raw(v);
            self
        }

        pub(crate) fn u32(mut self, key: &str, v: u32) -> Self {
            self.key(key, 4);
            self.bytes.extend(v.to_le_bytes());
            self
        }

        pub(crate) fn bool(mut self, key: &str, v: bool) -> Self {
            self.key(key, 7);
            self.bytes.push(v as u8);
            self
        }

        pub(crate) fn strings(mut self, key: &str, v: &[&str]) -> Self {
            self.key(key, 9);
            self.bytes.extend(8u32.to_le_bytes());
            self.bytes.extend((v.len() as u64).to_le_bytes());
            for s in v {
                self.str_raw(s);
            }
            self
        }

        pub(crate) fn f32s(mut self, key: &str, v: &[f32]) -> Self {
            self.key(key, 9);
            self.bytes.extend(6u32.to_le_bytes());
            self.bytes.extend((v.len() as u64).to_le_bytes());
            for x in v {
                self.bytes.extend(x.to_le_bytes());
            }
            self
        }

        pub(crate) fn i32s(mut self, key: &str, v: &[i32]) -> Self {
            self.key(key, 9);
            self.bytes.extend(5u32.to_le_bytes());
            self.bytes.extend((v.len() as u64).to_le_bytes());
            for x in v {
                self.bytes.extend(x.to_le_bytes());
            }
            self
        }

        pub(crate) fn finish(mut self) -> Vec<u8> {
            self.bytes[16..24].copy_from_slice(&self.count.to_le_bytes());
            self.bytes
        }
    }

    fn sample() -> Vec<u8> {
        GgufWriter::new()
            .string("general.architecture", "llama")
            .u32("llama.context_length", 2048)
            .bool("tokenizer.ggml.add_bos_token", true)
            .strings("tokenizer.ggml.tokens", &["a", "b", "ab"])
            .f32s("tokenizer.ggml.scores", &[0.0, -1.0, -2.5])
            .i32s("tokenizer.ggml.token_type", &[1, 1, 3])
            .finish()
    }

    #[test]
    fn reads_every_kind_of_pair() {
        let meta = parse_gguf_metadata(&sample()).unwrap();
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
            let err = parse_gguf_metadata(&bytes[..cut]).unwrap_err();
            assert!(matches!(err, Error::Gguf { .. }), "cut at {cut}: {err}");
        }
    }

    #[test]
    fn lying_lengths_are_errors_not_allocations() {
        // A string length of 2^62 right after the header.
        let mut bytes = GgufWriter::new().string("k", "v").finish();
        bytes[24..32].copy_from_slice(&(1u64 << 62).to_le_bytes());
        let err = parse_gguf_metadata(&bytes).unwrap_err().to_string();
        assert!(err.contains("string claims"), "{err}");

        // An array claiming 2^40 strings.
        let mut bytes = GgufWriter::new().strings("k", &["x"]).finish();
        let count_at = 24 + 8 + 1 + 4 + 4;
        bytes[count_at..count_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let err = parse_gguf_metadata(&bytes).unwrap_err().to_string();
        assert!(err.contains("array claims"), "{err}");

        // A metadata table claiming more pairs than bytes.
        let mut bytes = GgufWriter::new().finish();
        bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        let err = parse_gguf_metadata(&bytes).unwrap_err().to_string();
        assert!(err.contains("metadata table claims"), "{err}");
    }

    #[test]
    fn rejects_wrong_magic_version_and_types() {
        let mut bytes = sample();
        bytes[0] = b'X';
        assert!(
            parse_gguf_metadata(&bytes)
                .unwrap_err()
                .to_string()
                .contains("not a GGUF")
        );

        let mut bytes = sample();
        bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert!(
            parse_gguf_metadata(&bytes)
                .unwrap_err()
                .to_string()
                .contains("version 1")
        );

        let mut bytes = GgufWriter::new().u32("k", 1).finish();
        bytes[24 + 8 + 1..24 + 8 + 1 + 4].copy_from_slice(&99u32.to_le_bytes());
        assert!(
            parse_gguf_metadata(&bytes)
                .unwrap_err()
                .to_string()
                .contains("type 99")
        );

        let mut bytes = GgufWriter::new().bool("k", true).finish();
        let last = bytes.len() - 1;
        bytes[last] = 7;
        assert!(
            parse_gguf_metadata(&bytes)
                .unwrap_err()
                .to_string()
                .contains("boolean")
        );
    }

    proptest::proptest! {
        /// Arbitrary corruption of a valid file is an error or a parse, never a panic or an
        /// allocation the file cannot back.
        #[test]
        fn corrupted_files_never_panic(
            edits in proptest::collection::vec((0usize..400, proptest::num::u8::ANY), 1..8),
        ) {
            let mut bytes = sample();
            for (at, value) in edits {
                let len = bytes.len();
                bytes[at % len] = value;
            }
            let _ = parse_gguf_metadata(&bytes);
        }
    }

    #[test]
    fn duplicate_keys_are_rejected() {
        let bytes = GgufWriter::new().u32("k", 1).u32("k", 2).finish();
        assert!(
            parse_gguf_metadata(&bytes)
                .unwrap_err()
                .to_string()
                .contains("twice")
        );
    }

    #[test]
    fn reads_from_a_file_and_names_it_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, sample()).unwrap();
        assert_eq!(read_gguf_metadata(&path).unwrap().len(), 6);
        let missing = dir.path().join("absent.gguf");
        assert!(
            read_gguf_metadata(&missing)
                .unwrap_err()
                .to_string()
                .contains("absent.gguf")
        );
    }
}
