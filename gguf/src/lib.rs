//! A bounds-checked reader for GGUF files (versions 2 and 3), the format llama.cpp and Ollama
//! store models in.
//!
//! A GGUF file is the magic `GGUF`, a `u32` version, a `u64` tensor count and a `u64` metadata
//! count; the metadata key/value pairs; the tensor directory (name, dimensions innermost first,
//! GGML type, offset); then the data section, at the next multiple of `general.alignment`
//! (default 32). This crate reads everything but the data, and says where each tensor's bytes
//! lie. Every count and length the file states is checked against the bytes that remain before
//! anything is allocated for it, arrays nest at most [`MAX_ARRAY_DEPTH`] deep, and every
//! tensor's extent is checked to lie inside the file, aligned, and apart from the others: a
//! truncated or lying file is an [`Error`] naming the byte, the key or tensor, and the
//! [`Problem`], never a panic or an allocation the file's own bytes do not back.
//!
//! Files and what they own:
//! - `magic`: [`MAGIC`], [`is_gguf`] and [`is_gguf_file`], the one place that answers "is this
//!   GGUF?".
//! - `value`: [`MetaValue`], the thirteen value types, and [`Metadata`].
//! - `metadata`: the header and the metadata pairs.
//! - `directory`: [`TensorInfo`], the tensor directory and its bounds checks.
//! - `ggml_type`: [`GgmlType`], the tensor types and their block sizes.
//! - `file`: [`Gguf`] (header, metadata and directory, from memory or a path), and
//!   [`read_metadata`] / [`parse_metadata`] for readers that need only the metadata.
//! - `cursor`: the reader that knows how many bytes remain.
//! - `writer`: [`Writer`], small files built in memory (fixtures, examples, hostile files).
//! - `error`: [`Error`], [`Problem`] and [`Result`].
//!
//! ```
//! use gguf::{Gguf, GgmlType, MetaValue, Writer};
//!
//! let bytes = Writer::default()
//!     .meta("general.architecture", MetaValue::String("llama".into()))
//!     .meta("llama.block_count", MetaValue::U32(2))
//!     // Two rows of 32 f32s; dimensions are written innermost first.
//!     .tensor("token_embd.weight", &[32, 2], GgmlType::F32.id(), vec![0; 2 * 32 * 4])
//!     .build();
//! assert!(gguf::is_gguf(&bytes));
//!
//! let file = Gguf::parse(&bytes)?;
//! assert_eq!(file.architecture(), Some("llama"));
//! assert_eq!(file.get("llama.block_count").and_then(MetaValue::as_u64), Some(2));
//! let embedding = file.tensor("token_embd.weight").expect("written above");
//! assert_eq!((embedding.shape.as_slice(), embedding.size), (&[2, 32][..], 256));
//! let data = &bytes[embedding.offset as usize..][..embedding.size as usize];
//! assert_eq!(data.len(), 256);
//!
//! // A file cut short is an error that says where, never a panic.
//! let err = Gguf::parse(&bytes[..bytes.len() - 1]).unwrap_err();
//! assert!(err.to_string().contains("\"token_embd.weight\""), "{err}");
//! # Ok::<(), gguf::Error>(())
//! ```

#![deny(missing_docs)]

mod cursor;
mod directory;
mod error;
mod file;
mod ggml_type;
mod magic;
mod metadata;
mod value;
mod writer;

pub use directory::{DEFAULT_ALIGNMENT, MAX_DIMENSION, MAX_DIMS, TensorInfo};
pub use error::{Counted, Error, Problem, Result};
pub use file::{Gguf, parse_metadata, read_metadata};
pub use ggml_type::GgmlType;
pub use magic::{MAGIC, is_gguf, is_gguf_file};
pub use metadata::MAX_ARRAY_DEPTH;
pub use value::{MetaValue, Metadata};
pub use writer::{Writer, WriterTensor};
