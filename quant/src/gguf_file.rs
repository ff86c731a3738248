//! A GGUF file mapped into memory: the `gguf` crate's header, metadata and tensor directory
//! over the mapping, and each tensor's bytes handed out from it.

use std::path::Path;

use gguf::{Gguf, MetaValue, Metadata, TensorInfo};

use crate::mapped_file::MappedFile;
use crate::{Error, Result};

/// A parsed and validated GGUF file.
#[derive(Debug)]
pub struct GgufFile {
    file: MappedFile,
    directory: Gguf,
}

impl GgufFile {
    /// Maps `path` and parses its header; every tensor's extent is checked against the file.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = MappedFile::open(path)?;
        let directory = Gguf::parse(file.bytes()).map_err(|source| Error::Gguf {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(GgufFile { file, directory })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.directory.version()
    }

    /// Every metadata key and value.
    pub fn metadata(&self) -> &Metadata {
        self.directory.metadata()
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.directory.get(key)
    }

    /// `general.architecture`, if present.
    pub fn architecture(&self) -> Option<&str> {
        self.directory.architecture()
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        self.directory.tensors()
    }

    /// The tensor named `name` (llama.cpp name).
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.directory.tensor(name)
    }

    /// The raw bytes of a tensor's data.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> Result<&[u8]> {
        self.file.slice(
            info.offset..info.offset + info.size,
            &format!("tensor {:?}", info.name),
        )
    }

    /// Calls `f` with a tensor's raw bytes, then lets the file's pages go from resident
    /// memory: for a copy made once, such as a load's.
    pub fn read_tensor<T>(
        &self,
        info: &TensorInfo,
        f: impl FnOnce(&[u8]) -> Result<T>,
    ) -> Result<T> {
        self.file.read(
            info.offset..info.offset + info.size,
            &format!("tensor {:?}", info.name),
            f,
        )
    }
}
