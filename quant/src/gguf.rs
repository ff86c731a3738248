//! GGUF files (versions 2 and 3): metadata, tensor infos and data alignment.
//!
//! Layout: magic `GGUF`, `u32` version, `u64` tensor count, `u64` metadata count, the metadata
//! key/value pairs, the tensor infos (name, dimensions innermost first, GGML type, offset), then
//! the data section starting at the next multiple of `general.alignment` (default 32).
//!
//! Every count and length is checked against the bytes that remain before anything is
//! allocated for it, so a lying header is an error, never a huge allocation.

use std::collections::BTreeMap;
use std::path::Path;

use crate::ggml_type::GgmlType;
use crate::mapped_file::MappedFile;
use crate::{Error, Result};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// GGML tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `float32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// UTF-8 string.
    String(String),
    /// Array of values (all of one type).
    Array(Vec<MetaValue>),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float64`.
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

    /// The value as a float, if it is numeric.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The value as a string slice.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
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

/// Where one tensor lives in a GGUF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    /// The llama.cpp tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions as MLX orders them: outermost first (GGUF stores them innermost first).
    pub shape: Vec<i32>,
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub size: u64,
}

/// A parsed and validated GGUF file.
#[derive(Debug)]
pub struct GgufFile {
    file: MappedFile,
    version: u32,
    metadata: BTreeMap<String, MetaValue>,
    tensors: Vec<GgufTensorInfo>,
    by_name: BTreeMap<String, usize>,
}

impl GgufFile {
    /// Maps `path` and parses its header; every tensor's extent is checked against the file.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = MappedFile::open(path)?;
        let header = parse(file.bytes()).map_err(|what| Error::malformed(path, what))?;
        let mut by_name = BTreeMap::new();
        for (index, info) in header.tensors.iter().enumerate() {
            if by_name.insert(info.name.clone(), index).is_some() {
                return Err(Error::malformed(
                    path,
                    format!("tensor {:?} appears twice", info.name),
                ));
            }
        }
        Ok(GgufFile {
            file,
            version: header.version,
            metadata: header.metadata,
            tensors: header.tensors,
            by_name,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Every metadata key and value.
    pub fn metadata(&self) -> &BTreeMap<String, MetaValue> {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// `general.architecture`, if present.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(MetaValue::as_str)
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The tensor named `name` (llama.cpp name).
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor's data.
    pub fn tensor_bytes(&self, info: &GgufTensorInfo) -> Result<&[u8]> {
        self.file.slice(
            info.offset..info.offset + info.size,
            &format!("tensor {:?}", info.name),
        )
    }

    /// Calls `f` with a tensor's raw bytes, then lets the file's pages go from resident
    /// memory: for a copy made once, such as a load's.
    pub fn read_tensor<T>(
        &self,
        info: &GgufTensorInfo,
        f: impl FnOnce(&[u8]) -> Result<T>,
    ) -> Result<T> {
        self.file.read(
            info.offset..info.offset + info.size,
            &format!("tensor {:?}", info.name),
            f,
        )
    }
}

struct Header {
    version: u32,
    metadata: BTreeMap<String, MetaValue>,
    tensors: Vec<GgufTensorInfo>,
}

/// A cursor over the file that refuses to read past its end.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

type Parse<T> = std::result::Result<T, String>;

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Parse<&'a [u8]> {
        if n > self.remaining() {
            return Err(format!(
                "{what}: needs {n} bytes at offset {}, only {} remain",
                self.pos,
                self.remaining()
            ));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Parse<[u8; N]> {
        let bytes = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Parse<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Parse<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items each at least `min_item_bytes` long, refused if the rest of the file
    /// could not hold that many.
    fn count(&mut self, min_item_bytes: usize, what: &str) -> Parse<usize> {
        let n = self.u64(what)?;
        let limit = (self.remaining() / min_item_bytes.max(1)) as u64;
        if n > limit {
            return Err(format!(
                "{what} {n} is impossible: the {} remaining bytes hold at most {limit}",
                self.remaining()
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Parse<String> {
        let len = self.u64(what)?;
        if len > self.remaining() as u64 {
            return Err(format!(
                "{what}: string length {len} at offset {} runs past the end of the file",
                self.pos - 8
            ));
        }
        let bytes = self.take(len as usize, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what}: string is not UTF-8"))
    }

    fn value(&mut self, type_id: u32, what: &str, depth: u32) -> Parse<MetaValue> {
        Ok(match type_id {
            0 => MetaValue::U8(self.array::<1>(what)?[0]),
            1 => MetaValue::I8(i8::from_le_bytes(self.array(what)?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(what)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(what)?)),
            4 => MetaValue::U32(self.u32(what)?),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(what)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                other => return Err(format!("{what}: bool byte {other}")),
            },
            8 => MetaValue::String(self.string(what)?),
            9 => {
                if depth >= 4 {
                    return Err(format!("{what}: arrays nested too deeply"));
                }
                let item_type = self.u32(what)?;
                let min = min_value_bytes(item_type)
                    .ok_or_else(|| format!("{what}: unknown array element type {item_type}"))?;
                let n = self.count(min, &format!("{what}: array length"))?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(item_type, what, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(self.u64(what)?),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(what)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(what)?)),
            other => return Err(format!("{what}: unknown value type {other}")),
        })
    }
}

/// The fewest bytes a value of GGUF type `type_id` can occupy.
fn min_value_bytes(type_id: u32) -> Option<usize> {
    Some(match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => return None,
    })
}

fn parse(bytes: &[u8]) -> Parse<Header> {
    let mut cursor = Cursor { bytes, pos: 0 };
    let magic = cursor.array::<4>("magic")?;
    if &magic != MAGIC {
        return Err(format!("not a GGUF file (magic {magic:02x?})"));
    }
    let version = cursor.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(format!(
            "GGUF version {version} is not supported (only 2 and 3)"
        ));
    }
    // A tensor info is at least: name length, n_dims, one dim, type, offset.
    let tensor_count = cursor.count(8 + 4 + 8 + 4 + 8, "tensor count")?;
    // A metadata pair is at least: key length, value type, one byte of value.
    let kv_count = cursor.count(8 + 4 + 1, "metadata count")?;

    let mut metadata = BTreeMap::new();
    for index in 0..kv_count {
        let key = cursor.string(&format!("metadata key #{index}"))?;
        let type_id = cursor.u32(&format!("metadata {key:?} type"))?;
        let value = cursor.value(type_id, &format!("metadata {key:?}"), 0)?;
        metadata.insert(key, value);
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() => a,
            _ => return Err(format!("general.alignment {v:?} is not a power of two")),
        },
    };

    let mut raw_infos = Vec::with_capacity(tensor_count);
    for index in 0..tensor_count {
        let name = cursor.string(&format!("tensor #{index} name"))?;
        let n_dims = cursor.u32(&format!("tensor {name:?} dimension count"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(format!(
                "tensor {name:?}: {n_dims} dimensions (1 to {MAX_DIMS} allowed)"
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(cursor.u64(&format!("tensor {name:?} dimensions"))?);
        }
        let ggml_type = GgmlType::from_id(cursor.u32(&format!("tensor {name:?} type"))?);
        let offset = cursor.u64(&format!("tensor {name:?} offset"))?;
        raw_infos.push((name, dims, ggml_type, offset));
    }

    let data_start = (cursor.pos as u64).div_ceil(alignment) * alignment;
    let file_len = bytes.len() as u64;
    if data_start > file_len && tensor_count > 0 {
        return Err(format!(
            "data section would start at {data_start}, past the end of the file ({file_len} bytes)"
        ));
    }
    let data_len = file_len.saturating_sub(data_start);

    let mut tensors = Vec::with_capacity(raw_infos.len());
    for (name, dims, ggml_type, offset) in raw_infos {
        tensors.push(tensor_info(
            name, &dims, ggml_type, offset, alignment, data_start, data_len,
        )?);
    }
    check_no_overlap(&tensors)?;
    Ok(Header {
        version,
        metadata,
        tensors,
    })
}

fn tensor_info(
    name: String,
    dims: &[u64],
    ggml_type: GgmlType,
    offset: u64,
    alignment: u64,
    data_start: u64,
    data_len: u64,
) -> Parse<GgufTensorInfo> {
    let (block_elements, block_bytes) = ggml_type
        .block_layout()
        .ok_or_else(|| format!("tensor {name:?}: unsupported type {ggml_type}"))?;
    let mut elements: u64 = 1;
    let mut shape = Vec::with_capacity(dims.len());
    for &d in dims.iter().rev() {
        let d32 =
            i32::try_from(d).map_err(|_| format!("tensor {name:?}: dimension {d} is too large"))?;
        elements = elements
            .checked_mul(d)
            .ok_or_else(|| format!("tensor {name:?}: element count overflows"))?;
        shape.push(d32);
    }
    let row = dims[0];
    if !row.is_multiple_of(block_elements) {
        return Err(format!(
            "tensor {name:?}: rows of {row} elements are not a whole number of {ggml_type} blocks of {block_elements}"
        ));
    }
    let size = (elements / block_elements)
        .checked_mul(block_bytes)
        .ok_or_else(|| format!("tensor {name:?}: byte size overflows"))?;
    if !offset.is_multiple_of(alignment) {
        return Err(format!(
            "tensor {name:?}: offset {offset} is not a multiple of the alignment {alignment}"
        ));
    }
    let end = offset
        .checked_add(size)
        .ok_or_else(|| format!("tensor {name:?}: offset {offset} overflows"))?;
    if end > data_len {
        return Err(format!(
            "tensor {name:?}: data {offset}..{end} runs past the end of the data section ({data_len} bytes)"
        ));
    }
    Ok(GgufTensorInfo {
        name,
        shape,
        ggml_type,
        offset: data_start + offset,
        size,
    })
}

fn check_no_overlap(tensors: &[GgufTensorInfo]) -> Parse<()> {
    let mut spans: Vec<&GgufTensorInfo> = tensors.iter().filter(|t| t.size > 0).collect();
    spans.sort_by_key(|t| (t.offset, t.size));
    for pair in spans.windows(2) {
        if pair[1].offset < pair[0].offset + pair[0].size {
            return Err(format!(
                "tensors {:?} and {:?} overlap",
                pair[0].name, pair[1].name
            ));
        }
    }
    Ok(())
}
