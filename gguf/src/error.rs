//! The crate's one error type: a file that could not be read, or what is wrong with it and where.

use std::fmt;
use std::path::PathBuf;

use crate::ggml_type::GgmlType;

/// Why a GGUF file could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file system refused to open or read the file.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The bytes are not a well-formed GGUF file.
    #[error("invalid GGUF file at byte {offset}: {context}: {problem}")]
    Malformed {
        /// Where the problem was found, counted from the start of the file.
        offset: u64,
        /// The part of the file being read: `header`, `metadata "key"`, `tensor "name"`, ….
        context: String,
        /// What is wrong.
        problem: Problem,
    },
}

/// What is wrong with a malformed file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file (it starts with {})", Hex(magic))]
    NotGguf {
        /// The bytes found instead.
        magic: [u8; 4],
    },
    /// A version other than 2 or 3.
    #[error("GGUF version {0} is not supported (only 2 and 3)")]
    UnsupportedVersion(u32),
    /// The file ends inside a fixed-size field.
    #[error("the file ends here: needs {needed} more bytes, only {remaining} remain")]
    Truncated {
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the file.
        remaining: u64,
    },
    /// A count or length claims more than the rest of the file could hold.
    #[error(
        "{} {count} is impossible: the {} claims {count} {} but only {remaining} bytes remain",
        counted.field(), counted.table(), counted.unit()
    )]
    CountTooLarge {
        /// What the count counts.
        counted: Counted,
        /// The count the file states.
        count: u64,
        /// Bytes left in the file.
        remaining: u64,
    },
    /// A string is not UTF-8.
    #[error("a string is not valid UTF-8")]
    NotUtf8,
    /// A value type id GGUF does not define.
    #[error("unknown value type {0}")]
    UnknownValueType(u32),
    /// A boolean byte other than 0 or 1.
    #[error("boolean byte is {0}, not 0 or 1")]
    BadBool(u8),
    /// Arrays of arrays nested past [`MAX_ARRAY_DEPTH`](crate::MAX_ARRAY_DEPTH).
    #[error("arrays nested deeper than {}", crate::MAX_ARRAY_DEPTH)]
    NestedTooDeep,
    /// A metadata key that appears twice.
    #[error("metadata key {0:?} appears twice")]
    DuplicateKey(String),
    /// A tensor name that appears twice.
    #[error("tensor {0:?} appears twice")]
    DuplicateTensor(String),
    /// `general.alignment` is not a positive power of two.
    #[error("general.alignment {0} is not a power of two")]
    BadAlignment(String),
    /// A tensor with no dimensions or more than [`MAX_DIMS`](crate::MAX_DIMS).
    #[error("{0} dimensions (1 to {max} allowed)", max = crate::MAX_DIMS)]
    BadDimensionCount(u32),
    /// A dimension past [`MAX_DIMENSION`](crate::MAX_DIMENSION).
    #[error("dimension {0} is too large (at most {max})", max = crate::MAX_DIMENSION)]
    DimensionTooLarge(u64),
    /// The product of the dimensions does not fit in 64 bits.
    #[error("element count overflows")]
    ElementCountOverflows,
    /// A tensor type whose block size this crate does not know.
    #[error("unsupported type {0}")]
    UnsupportedType(GgmlType),
    /// A row that does not fill a whole number of the type's blocks.
    #[error("rows of {row} elements are not a whole number of {ggml_type} blocks of {block}")]
    PartialBlock {
        /// Elements in one row (the innermost dimension).
        row: u64,
        /// The tensor's type.
        ggml_type: GgmlType,
        /// Elements in one block of that type.
        block: u64,
    },
    /// The tensor's byte size does not fit in 64 bits.
    #[error("byte size overflows")]
    ByteSizeOverflows,
    /// A tensor offset that is not a multiple of the file's alignment.
    #[error("offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned {
        /// The offset, relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor's data runs past the end of the file.
    #[error("data {start}..{end} runs past the end of the data section ({data_len} bytes)")]
    OutOfBounds {
        /// First byte, relative to the data section.
        start: u64,
        /// One past the last byte, relative to the data section (saturated at `u64::MAX`).
        end: u64,
        /// Bytes in the data section.
        data_len: u64,
    },
    /// The tensor directory ends past the end of the file once aligned.
    #[error(
        "the data section would start at byte {data_start}, past the end of the file ({file_len} bytes)"
    )]
    DataStartPastEnd {
        /// Where the data section would start.
        data_start: u64,
        /// Bytes in the file.
        file_len: u64,
    },
    /// The tensor's bytes overlap those of the tensor named here (the error's context names
    /// the other).
    #[error("its data overlaps tensor {0:?}")]
    Overlap(String),
}

/// What a count or length in the file counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Counted {
    /// A string's length in bytes.
    StringBytes,
    /// An array's elements.
    ArrayElements,
    /// The metadata pairs.
    MetadataPairs,
    /// The tensor directory's entries.
    TensorEntries,
}

impl Counted {
    /// The field that states the count.
    pub fn field(self) -> &'static str {
        match self {
            Counted::StringBytes => "string length",
            Counted::ArrayElements => "array length",
            Counted::MetadataPairs => "metadata count",
            Counted::TensorEntries => "tensor count",
        }
    }

    /// What the counted entries make up.
    pub fn table(self) -> &'static str {
        match self {
            Counted::StringBytes => "string",
            Counted::ArrayElements => "array",
            Counted::MetadataPairs => "metadata table",
            Counted::TensorEntries => "tensor table",
        }
    }

    /// What one entry is.
    pub fn unit(self) -> &'static str {
        match self {
            Counted::StringBytes => "bytes",
            _ => "entries",
        }
    }
}

/// Bytes as hex pairs, `47 47 55 46`: a magic is bytes, not text or a Rust array.
struct Hex<'a>(&'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, byte) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
