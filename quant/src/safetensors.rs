//! Safetensors files: the header is parsed and every entry validated against the file before
//! any tensor byte is touched; tensors are then copied out of the memory map on demand.
//!
//! A file is `u64 header_len` (little-endian), `header_len` bytes of JSON mapping each tensor
//! name to `{dtype, shape, data_offsets: [start, end]}` (offsets relative to the data section
//! that follows the header), and an optional `__metadata__` map of strings.

use std::collections::BTreeMap;
use std::path::Path;

use mlx::{Array, Dtype};
use serde_json::{Map, Value};

use crate::mapped_file::MappedFile;
use crate::{Error, Result};

/// Headers larger than this are refused before being read: real ones are a few hundred kB.
const MAX_HEADER_BYTES: u64 = 100 << 20;

/// Where one tensor lives inside a safetensors file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetensorsEntry {
    /// Element type (`U8` for FP8 bytes, see `e4m3`).
    pub dtype: Dtype,
    /// Whether the bytes are `F8_E4M3` values, which MLX has no dtype for: they load as `U8`
    /// and are decoded with their scales (see `fp8`).
    pub e4m3: bool,
    /// Dimensions, outermost first.
    pub shape: Vec<i32>,
    /// Byte range within the file (already offset past the header).
    pub start: u64,
    /// End of the byte range (exclusive).
    pub end: u64,
}

/// One validated safetensors file.
#[derive(Debug)]
pub struct SafetensorsFile {
    file: MappedFile,
    entries: BTreeMap<String, SafetensorsEntry>,
    metadata: BTreeMap<String, String>,
}

impl SafetensorsFile {
    /// Maps `path` and validates its header: the header length against the file size, each
    /// entry's dtype, shape and offsets, and that no two tensors overlap.
    pub fn open(path: &Path) -> Result<SafetensorsFile> {
        let file = MappedFile::open(path)?;
        let (entries, metadata) =
            parse_header(file.bytes()).map_err(|what| Error::malformed(path, what))?;
        Ok(SafetensorsFile {
            file,
            entries,
            metadata,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Every tensor, by name.
    pub fn entries(&self) -> &BTreeMap<String, SafetensorsEntry> {
        &self.entries
    }

    /// The free-form `__metadata__` strings.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Copies tensor `name` into a new MLX array.
    pub fn load(&self, name: &str) -> Result<Array> {
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| Error::MissingTensor(name.to_string()))?;
        self.file.read(
            entry.start..entry.end,
            &format!("tensor {name:?}"),
            |bytes| Ok(Array::from_bytes(bytes, &entry.shape, entry.dtype)?),
        )
    }
}

type Header = (BTreeMap<String, SafetensorsEntry>, BTreeMap<String, String>);

/// Parses and validates a whole file's header; errors are messages naming the tensor at fault.
pub(crate) fn parse_header(bytes: &[u8]) -> std::result::Result<Header, String> {
    let file_len = bytes.len() as u64;
    let len_bytes: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| format!("file of {file_len} bytes is too short for a safetensors header"))?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_BYTES {
        return Err(format!(
            "header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit"
        ));
    }
    let data_start = 8 + header_len;
    if data_start > file_len {
        return Err(format!(
            "header length {header_len} runs past the end of the file ({file_len} bytes)"
        ));
    }
    let header = &bytes[8..data_start as usize];
    let json: Map<String, Value> =
        serde_json::from_slice(header).map_err(|e| format!("header is not a JSON object: {e}"))?;
    let data_len = file_len - data_start;

    let mut entries = BTreeMap::new();
    let mut metadata = BTreeMap::new();
    for (name, value) in json {
        if name == "__metadata__" {
            metadata = parse_metadata(&value)?;
            continue;
        }
        let entry = parse_entry(&name, &value, data_start, data_len)?;
        entries.insert(name, entry);
    }
    check_no_overlap(&entries)?;
    Ok((entries, metadata))
}

fn parse_metadata(value: &Value) -> std::result::Result<BTreeMap<String, String>, String> {
    // MLX's `save_safetensors` writes `null` when it is given no metadata.
    if value.is_null() {
        return Ok(BTreeMap::new());
    }
    let object = value.as_object().ok_or("__metadata__ is not an object")?;
    object
        .iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            _ => Err(format!("__metadata__ value {k:?} is not a string")),
        })
        .collect()
}

fn parse_entry(
    name: &str,
    value: &Value,
    data_start: u64,
    data_len: u64,
) -> std::result::Result<SafetensorsEntry, String> {
    let bad = |what: &str| format!("tensor {name:?}: {what}");
    let object = value
        .as_object()
        .ok_or_else(|| bad("entry is not an object"))?;
    let dtype_name = object
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing dtype"))?;
    let e4m3 = dtype_name == "F8_E4M3";
    let dtype = if e4m3 {
        Dtype::U8
    } else {
        dtype_from_name(dtype_name)
            .ok_or_else(|| bad(&format!("unsupported dtype {dtype_name:?}")))?
    };
    let shape_json = object
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("missing shape"))?;
    let mut shape = Vec::with_capacity(shape_json.len().min(16));
    let mut elements: u64 = 1;
    for dim in shape_json {
        let d = dim
            .as_u64()
            .ok_or_else(|| bad(&format!("shape entry {dim} is not a non-negative integer")))?;
        let d32 = i32::try_from(d).map_err(|_| bad(&format!("dimension {d} is too large")))?;
        elements = elements
            .checked_mul(d)
            .ok_or_else(|| bad("element count overflows"))?;
        shape.push(d32);
    }
    let offsets = object
        .get("data_offsets")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("missing data_offsets"))?;
    let [start, end] = offsets.as_slice() else {
        return Err(bad("data_offsets must hold exactly two offsets"));
    };
    let (Some(start), Some(end)) = (start.as_u64(), end.as_u64()) else {
        return Err(bad("data_offsets are not non-negative integers"));
    };
    if start > end {
        return Err(bad(&format!(
            "data_offsets [{start}, {end}] end before they start"
        )));
    }
    if end > data_len {
        return Err(bad(&format!(
            "data_offsets [{start}, {end}] run past the end of the data ({data_len} bytes)"
        )));
    }
    let expected = elements
        .checked_mul(dtype.size_of() as u64)
        .ok_or_else(|| bad("byte size overflows"))?;
    if end - start != expected {
        return Err(bad(&format!(
            "data_offsets [{start}, {end}] span {} bytes, but {dtype_name} {shape:?} needs {expected}",
            end - start
        )));
    }
    Ok(SafetensorsEntry {
        dtype,
        e4m3,
        shape,
        start: data_start + start,
        end: data_start + end,
    })
}

fn check_no_overlap(
    entries: &BTreeMap<String, SafetensorsEntry>,
) -> std::result::Result<(), String> {
    let mut spans: Vec<(&str, u64, u64)> = entries
        .iter()
        .filter(|(_, e)| e.end > e.start)
        .map(|(n, e)| (n.as_str(), e.start, e.end))
        .collect();
    spans.sort_by_key(|&(_, start, end)| (start, end));
    for pair in spans.windows(2) {
        let (a, _, a_end) = pair[0];
        let (b, b_start, _) = pair[1];
        if b_start < a_end {
            return Err(format!("tensors {a:?} and {b:?} overlap"));
        }
    }
    Ok(())
}

/// The MLX dtype of a safetensors dtype name.
pub(crate) fn dtype_from_name(name: &str) -> Option<Dtype> {
    Some(match name {
        "BOOL" => Dtype::Bool,
        "U8" => Dtype::U8,
        "I8" => Dtype::I8,
        "U16" => Dtype::U16,
        "I16" => Dtype::I16,
        "U32" => Dtype::U32,
        "I32" => Dtype::I32,
        "U64" => Dtype::U64,
        "I64" => Dtype::I64,
        "F16" => Dtype::F16,
        "BF16" => Dtype::Bf16,
        "F32" => Dtype::F32,
        "F64" => Dtype::F64,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn parses_a_valid_header() {
        let bytes = file(
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}}"#,
            &[0; 8],
        );
        let (entries, metadata) = parse_header(&bytes).unwrap();
        assert_eq!(entries["a"].shape, vec![2]);
        assert_eq!(metadata["format"], "pt");
    }

    /// What MLX's `save_safetensors` writes without metadata: a `null` in its place.
    #[test]
    fn reads_null_metadata_as_none() {
        let bytes = file(
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":null}"#,
            &[0; 8],
        );
        let (entries, metadata) = parse_header(&bytes).unwrap();
        assert_eq!(entries["a"].shape, vec![2]);
        assert!(metadata.is_empty());
        let bytes = file(r#"{"__metadata__":[1]}"#, &[]);
        assert!(parse_header(&bytes).unwrap_err().contains("not an object"));
    }

    #[test]
    fn refuses_a_size_that_disagrees_with_the_shape() {
        let bytes = file(
            r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            &[0; 8],
        );
        let err = parse_header(&bytes).unwrap_err();
        assert!(err.contains("\"a\"") && err.contains("needs 12"), "{err}");
    }

    #[test]
    fn refuses_negative_dimensions() {
        let bytes = file(
            r#"{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#,
            &[0; 8],
        );
        let err = parse_header(&bytes).unwrap_err();
        assert!(err.contains("\"a\"") && err.contains("-2"), "{err}");
    }
}
