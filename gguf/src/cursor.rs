//! A reader that knows how many bytes the file has left, and refuses anything that would not fit.
//!
//! Every read names its context (which key, which tensor) lazily, so the success path formats
//! nothing, and every failure says where it happened.

use std::fmt;
use std::io::Read;

use crate::error::{Counted, Error, Problem};

/// The part of the file being read, for error messages.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Context<'a> {
    /// Magic, version and the two counts.
    Header,
    /// The key of the `index`th metadata pair.
    Key(u64),
    /// The value of the metadata pair `key`.
    Value(&'a str),
    /// The name of the `index`th tensor.
    TensorName(u64),
    /// The rest of the tensor `name`'s entry.
    Tensor(&'a str),
    /// The tensor directory as a whole.
    Directory,
}

impl fmt::Display for Context<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Context::Header => f.write_str("header"),
            Context::Key(index) => write!(f, "metadata key #{index}"),
            Context::Value(key) => write!(f, "metadata {key:?}"),
            Context::TensorName(index) => write!(f, "tensor #{index} name"),
            Context::Tensor(name) => write!(f, "tensor {name:?}"),
            Context::Directory => f.write_str("tensor directory"),
        }
    }
}

/// Why a read stopped: the file is malformed, or the reader beneath failed (a file that shrank
/// while it was read); the caller knows the path to name in the second case.
pub(crate) enum Stop {
    Malformed(Error),
    Io(std::io::Error),
}

impl From<Error> for Stop {
    fn from(err: Error) -> Self {
        Stop::Malformed(err)
    }
}

pub(crate) type Parsed<T> = std::result::Result<T, Stop>;

/// A position in a file of known length, read through `R`.
pub(crate) struct Cursor<R> {
    inner: R,
    offset: u64,
    len: u64,
}

impl<R: Read> Cursor<R> {
    /// A cursor at the start of a file of `len` bytes read through `inner`.
    pub(crate) fn new(inner: R, len: u64) -> Self {
        Cursor {
            inner,
            offset: 0,
            len,
        }
    }

    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.offset)
    }

    /// The error for `problem` at the current offset.
    pub(crate) fn malformed(&self, context: Context<'_>, problem: Problem) -> Stop {
        self.malformed_at(self.offset, context, problem)
    }

    pub(crate) fn malformed_at(&self, offset: u64, context: Context<'_>, problem: Problem) -> Stop {
        Stop::Malformed(Error::Malformed {
            offset,
            context: context.to_string(),
            problem,
        })
    }

    pub(crate) fn bytes<const N: usize>(&mut self, context: Context<'_>) -> Parsed<[u8; N]> {
        if N as u64 > self.remaining() {
            return Err(self.malformed(
                context,
                Problem::Truncated {
                    needed: N as u64,
                    remaining: self.remaining(),
                },
            ));
        }
        let mut buf = [0u8; N];
        self.inner.read_exact(&mut buf).map_err(Stop::Io)?;
        self.offset += N as u64;
        Ok(buf)
    }

    pub(crate) fn u32(&mut self, context: Context<'_>) -> Parsed<u32> {
        Ok(u32::from_le_bytes(self.bytes(context)?))
    }

    pub(crate) fn u64(&mut self, context: Context<'_>) -> Parsed<u64> {
        Ok(u64::from_le_bytes(self.bytes(context)?))
    }

    /// Fails unless `count` items of at least `min_size` bytes each fit in what remains: the
    /// check every count passes before anything is allocated for it.
    pub(crate) fn ensure_fits(
        &self,
        count: u64,
        min_size: u64,
        context: Context<'_>,
        counted: Counted,
    ) -> Parsed<()> {
        match count.checked_mul(min_size) {
            Some(need) if need <= self.remaining() => Ok(()),
            _ => Err(self.malformed(
                context,
                Problem::CountTooLarge {
                    counted,
                    count,
                    remaining: self.remaining(),
                },
            )),
        }
    }

    /// A length-prefixed UTF-8 string.
    pub(crate) fn string(&mut self, context: Context<'_>) -> Parsed<String> {
        let len = self.u64(context)?;
        self.ensure_fits(len, 1, context, Counted::StringBytes)?;
        let start = self.offset;
        // `len` fits in what remains of the file; a file that size fits in this address space
        // only if it fits in `usize`, so failing here means a file too large for the machine.
        let Ok(len_usize) = usize::try_from(len) else {
            return Err(self.malformed(
                context,
                Problem::CountTooLarge {
                    counted: Counted::StringBytes,
                    count: len,
                    remaining: self.remaining(),
                },
            ));
        };
        let mut buf = vec![0u8; len_usize];
        self.inner.read_exact(&mut buf).map_err(Stop::Io)?;
        self.offset += len;
        String::from_utf8(buf).map_err(|_| self.malformed_at(start, context, Problem::NotUtf8))
    }
}
