//! A whole file's header, metadata and tensor directory, read from memory or from a path.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::cursor::{Cursor, Stop};
use crate::directory::{TensorInfo, read_directory};
use crate::error::{Error, Problem, Result};
use crate::metadata::read_head;
use crate::value::{MetaValue, Metadata};

/// A GGUF file's header, metadata and tensor directory, every tensor's bytes checked to lie
/// inside the file. The tensor data itself is not read: [`TensorInfo::offset`] and
/// [`TensorInfo::size`] say where it is.
#[derive(Debug, Clone)]
pub struct Gguf {
    version: u32,
    metadata: Metadata,
    alignment: u64,
    data_start: u64,
    tensors: Vec<TensorInfo>,
    by_name: BTreeMap<String, usize>,
}

impl Gguf {
    /// Parses a whole file held in memory (or mapped): the extents are checked against
    /// `file.len()`.
    pub fn parse(file: &[u8]) -> Result<Gguf> {
        let mut cursor = Cursor::new(file, file.len() as u64);
        read_gguf(&mut cursor).map_err(|stop| in_memory(stop, &cursor))
    }

    /// Reads the header, metadata and directory of the file at `path`, without reading the
    /// tensor data; the extents are checked against the file's length.
    pub fn read(path: &Path) -> Result<Gguf> {
        let mut cursor = open(path)?;
        read_gguf(&mut cursor).map_err(|stop| from_file(stop, path))
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Every metadata key and value.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The metadata, kept after the directory is dropped.
    pub fn into_metadata(self) -> Metadata {
        self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// `general.architecture`, if present.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(MetaValue::as_str)
    }

    /// The alignment of the data section and of every tensor's offset in it.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Where the data section starts, in bytes from the start of the file.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name` (llama.cpp's name).
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }
}

/// Reads the metadata of the file at `path`, stopping before the tensor directory: reading a
/// multi-gigabyte model's vocabulary costs only the vocabulary.
pub fn read_metadata(path: &Path) -> Result<Metadata> {
    let mut cursor = open(path)?;
    read_head(&mut cursor)
        .map(|head| head.metadata)
        .map_err(|stop| from_file(stop, path))
}

/// Parses the metadata from the first bytes of a GGUF file held in memory; `prefix` may stop
/// anywhere after the metadata, since the tensor directory is not read.
pub fn parse_metadata(prefix: &[u8]) -> Result<Metadata> {
    let mut cursor = Cursor::new(prefix, prefix.len() as u64);
    read_head(&mut cursor)
        .map(|head| head.metadata)
        .map_err(|stop| in_memory(stop, &cursor))
}

fn read_gguf<R: Read>(cursor: &mut Cursor<R>) -> Result<Gguf, Stop> {
    let head = read_head(cursor)?;
    let directory = read_directory(cursor, head.tensor_count, &head.metadata)?;
    Ok(Gguf {
        version: head.version,
        metadata: head.metadata,
        alignment: directory.alignment,
        data_start: directory.data_start,
        tensors: directory.tensors,
        by_name: directory.by_name,
    })
}

/// A buffered cursor over the file at `path`.
fn open(path: &Path) -> Result<Cursor<BufReader<File>>> {
    let file = File::open(path).map_err(|source| io_error(path, source))?;
    let len = file
        .metadata()
        .map_err(|source| io_error(path, source))?
        .len();
    Ok(Cursor::new(BufReader::with_capacity(1 << 16, file), len))
}

fn io_error(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn from_file(stop: Stop, path: &Path) -> Error {
    match stop {
        Stop::Malformed(err) => err,
        Stop::Io(source) => io_error(path, source),
    }
}

/// Reading a slice fails only where the cursor's bounds checks would have: kept as a malformed
/// file rather than a panic should the two ever disagree.
fn in_memory(stop: Stop, cursor: &Cursor<&[u8]>) -> Error {
    match stop {
        Stop::Malformed(err) => err,
        Stop::Io(_) => Error::Malformed {
            offset: cursor.offset(),
            context: "file".into(),
            problem: Problem::Truncated {
                needed: 1,
                remaining: cursor.remaining(),
            },
        },
    }
}
