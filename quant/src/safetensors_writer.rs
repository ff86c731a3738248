//! Writing a safetensors file one tensor at a time, so a model larger than memory can be
//! written: each tensor's bytes go to a side file as they are made, and `finish` writes the
//! header (which names every tensor's byte range, so it can only be known at the end) followed
//! by those bytes.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use mlx::{Array, Dtype};
use serde_json::{Map, Value, json};

use crate::{Error, Result};

/// safetensors' name of a dtype; `None` for dtypes it cannot hold.
pub fn safetensors_dtype_name(dtype: Dtype) -> Option<&'static str> {
    Some(match dtype {
        Dtype::Bool => "BOOL",
        Dtype::U8 => "U8",
        Dtype::U16 => "U16",
        Dtype::U32 => "U32",
        Dtype::U64 => "U64",
        Dtype::I8 => "I8",
        Dtype::I16 => "I16",
        Dtype::I32 => "I32",
        Dtype::I64 => "I64",
        Dtype::F16 => "F16",
        Dtype::F32 => "F32",
        Dtype::F64 => "F64",
        Dtype::Bf16 => "BF16",
        Dtype::Complex64 => return None,
    })
}

/// A safetensors file being written.
#[derive(Debug)]
pub struct SafetensorsWriter {
    path: PathBuf,
    data_path: PathBuf,
    data: BufWriter<File>,
    header: Map<String, Value>,
    offset: u64,
}

impl SafetensorsWriter {
    /// Starts the file at `path` (its data accumulates in `path` + `.data` until
    /// [`SafetensorsWriter::finish`]).
    pub fn create(path: &Path) -> Result<SafetensorsWriter> {
        let mut data_path = path.as_os_str().to_owned();
        data_path.push(".data");
        let data_path = PathBuf::from(data_path);
        let data = File::create(&data_path).map_err(|e| Error::io(&data_path, e))?;
        let mut header = Map::new();
        // transformers refuses files whose format it does not know; MLX ignores it.
        header.insert("__metadata__".into(), json!({"format": "pt"}));
        Ok(SafetensorsWriter {
            path: path.to_path_buf(),
            data_path,
            data: BufWriter::new(data),
            header,
            offset: 0,
        })
    }

    /// Evaluates `array` and appends it as tensor `name`.
    pub fn add(&mut self, name: &str, array: &Array) -> Result<()> {
        let unsupported = |what: String| Error::Unsupported {
            name: name.to_string(),
            what,
        };
        if self.header.contains_key(name) {
            return Err(unsupported("written twice".into()));
        }
        let dtype = safetensors_dtype_name(array.dtype())
            .ok_or_else(|| unsupported(format!("safetensors has no {:?}", array.dtype())))?;
        if cfg!(target_endian = "big") {
            return Err(unsupported(
                "safetensors is little-endian; this host is not".into(),
            ));
        }
        let bytes = array.to_bytes()?;
        self.data
            .write_all(&bytes)
            .map_err(|e| Error::io(&self.data_path, e))?;
        let end = self.offset + bytes.len() as u64;
        self.header.insert(
            name.to_string(),
            json!({"dtype": dtype, "shape": array.shape(), "data_offsets": [self.offset, end]}),
        );
        self.offset = end;
        Ok(())
    }

    /// Tensors added so far.
    pub fn len(&self) -> usize {
        self.header.len() - 1
    }

    /// Whether no tensor was added.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the file; returns its size. The side file is removed.
    pub fn finish(self) -> Result<u64> {
        let SafetensorsWriter {
            path,
            data_path,
            data,
            header,
            offset,
        } = self;
        data.into_inner()
            .map_err(|e| Error::io(&data_path, e.into_error()))?
            .sync_all()
            .map_err(|e| Error::io(&data_path, e))?;
        let mut header_bytes = serde_json::to_vec(&Value::Object(header))
            .map_err(|e| Error::io(&path, std::io::Error::other(e)))?;
        // Readers that map the file expect the data to start 8-byte aligned; spaces are allowed.
        while header_bytes.len() % 8 != 0 {
            header_bytes.push(b' ');
        }
        let file = File::create(&path).map_err(|e| Error::io(&path, e))?;
        let mut out = BufWriter::new(file);
        let mut data = File::open(&data_path).map_err(|e| Error::io(&data_path, e))?;
        out.write_all(&(header_bytes.len() as u64).to_le_bytes())
            .and_then(|()| out.write_all(&header_bytes))
            .and_then(|()| std::io::copy(&mut data, &mut out).map(|_| ()))
            .and_then(|()| out.flush())
            .map_err(|e| Error::io(&path, e))?;
        std::fs::remove_file(&data_path).map_err(|e| Error::io(&data_path, e))?;
        Ok(8 + header_bytes.len() as u64 + offset)
    }
}
