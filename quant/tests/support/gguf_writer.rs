//! Hand-built GGUF test files: the `gguf` crate's writer, under the name these tests use.

pub type GgufWriter = gguf::Writer;
