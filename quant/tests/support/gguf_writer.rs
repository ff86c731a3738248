//! A minimal GGUF writer for hand-built test files.

use quant::MetaValue;

pub struct GgufTensor {
    pub name: String,
    /// GGUF order: innermost first.
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
}

pub struct GgufWriter {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<GgufTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter {
            version: 3,
            alignment: 32,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn type_of(value: &MetaValue) -> u32 {
    match value {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
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
            let item_type = items.first().map(type_of).unwrap_or(0);
            out.extend(item_type.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for item in items {
                value(out, item);
            }
        }
        MetaValue::U64(x) => out.extend(x.to_le_bytes()),
        MetaValue::I64(x) => out.extend(x.to_le_bytes()),
        MetaValue::F64(x) => out.extend(x.to_le_bytes()),
    }
}

impl GgufWriter {
    pub fn meta(mut self, key: &str, v: MetaValue) -> Self {
        self.metadata.push((key.to_string(), v));
        self
    }

    pub fn tensor(mut self, name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> Self {
        self.tensors.push(GgufTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            type_id,
            data,
        });
        self
    }

    /// The offsets each tensor gets: packed in order, each aligned.
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

    /// The file, with `offsets` overriding the natural tensor offsets when given.
    pub fn build_with_offsets(&self, offsets: &[u64]) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, v) in &self.metadata {
            string(&mut out, key);
            out.extend(type_of(v).to_le_bytes());
            value(&mut out, v);
        }
        for (t, offset) in self.tensors.iter().zip(offsets) {
            string(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.type_id.to_le_bytes());
            out.extend(offset.to_le_bytes());
        }
        let data_start = (out.len() as u64).div_ceil(self.alignment) * self.alignment;
        out.resize(data_start as usize, 0);
        for (t, offset) in self.tensors.iter().zip(self.offsets()) {
            out.resize((data_start + offset) as usize, 0);
            out.extend(&t.data);
        }
        out
    }

    pub fn build(&self) -> Vec<u8> {
        self.build_with_offsets(&self.offsets())
    }
}
