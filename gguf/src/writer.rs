//! A GGUF writer for small files built in memory: test fixtures, examples, and the hostile
//! files readers are tested against (any offset can be overridden with a lie).

use crate::directory::DEFAULT_ALIGNMENT;
use crate::magic::MAGIC;
use crate::value::MetaValue;

/// One tensor to write.
#[derive(Debug, Clone)]
pub struct WriterTensor {
    /// The tensor's name.
    pub name: String,
    /// Dimensions in GGUF's order: innermost first.
    pub dims: Vec<u64>,
    /// The GGML type id, written as given (unknown ids included).
    pub type_id: u32,
    /// The data, written as given.
    pub data: Vec<u8>,
}

/// A GGUF file to be written: metadata pairs and tensors, in order, nothing checked.
#[derive(Debug, Clone)]
pub struct Writer {
    /// The version field (3 unless set).
    pub version: u32,
    /// The data section's alignment; written files do not state it in the metadata unless a
    /// `general.alignment` pair is added.
    pub alignment: u64,
    /// Key → value pairs, in the order they are written (duplicates included).
    pub metadata: Vec<(String, MetaValue)>,
    /// Tensors, in the order they are written.
    pub tensors: Vec<WriterTensor>,
}

impl Default for Writer {
    fn default() -> Self {
        Writer {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

impl Writer {
    /// Adds a metadata pair.
    pub fn meta(mut self, key: &str, value: MetaValue) -> Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor: `dims` innermost first, `type_id` a GGML type id.
    pub fn tensor(mut self, name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> Self {
        self.tensors.push(WriterTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            type_id,
            data,
        });
        self
    }

    /// The offset each tensor gets in the data section: packed in order, each aligned.
    pub fn offsets(&self) -> Vec<u64> {
        let mut offset = 0u64;
        self.tensors
            .iter()
            .map(|t| {
                let at = offset;
                offset = (offset + t.data.len() as u64).div_ceil(self.alignment) * self.alignment;
                at
            })
            .collect()
    }

    /// The file; the data section, aligned, follows the directory when there are tensors.
    pub fn build(&self) -> Vec<u8> {
        self.build_with_offsets(&self.offsets())
    }

    /// The file, with `offsets` written in the directory instead of the real ones (the data is
    /// still placed at the real offsets): for files that lie about where their tensors are.
    pub fn build_with_offsets(&self, offsets: &[u64]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            string(&mut out, key);
            out.extend(value.type_id().to_le_bytes());
            encode(&mut out, value);
        }
        for (tensor, offset) in self.tensors.iter().zip(offsets) {
            string(&mut out, &tensor.name);
            out.extend((tensor.dims.len() as u32).to_le_bytes());
            for d in &tensor.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(tensor.type_id.to_le_bytes());
            out.extend(offset.to_le_bytes());
        }
        // A file without tensors has no data section, so nothing to pad to.
        if self.tensors.is_empty() {
            return out;
        }
        let data_start = (out.len() as u64).div_ceil(self.alignment) * self.alignment;
        out.resize(data_start as usize, 0);
        for (tensor, offset) in self.tensors.iter().zip(self.offsets()) {
            out.resize((data_start + offset) as usize, 0);
            out.extend(&tensor.data);
        }
        out
    }
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn encode(out: &mut Vec<u8>, value: &MetaValue) {
    match value {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.extend(x.to_le_bytes()),
        MetaValue::U16(x) => out.extend(x.to_le_bytes()),
        MetaValue::I16(x) => out.extend(x.to_le_bytes()),
        MetaValue::U32(x) => out.extend(x.to_le_bytes()),
        MetaValue::I32(x) => out.extend(x.to_le_bytes()),
        MetaValue::F32(x) => out.extend(x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::String(s) => string(out, s),
        MetaValue::Array(items) => {
            // An empty array's element type is not recoverable; u8 is as good as any.
            let element_type = items.first().map_or(0, MetaValue::type_id);
            out.extend(element_type.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for item in items {
                encode(out, item);
            }
        }
        MetaValue::U64(x) => out.extend(x.to_le_bytes()),
        MetaValue::I64(x) => out.extend(x.to_le_bytes()),
        MetaValue::F64(x) => out.extend(x.to_le_bytes()),
    }
}
