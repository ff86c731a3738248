//! What a checkpoint's tensors are.
//!
//! This crate will own reading checkpoints (HF-style safetensors directories and GGUF files),
//! the quantization modes MLX understands (affine 2–8 bit, mxfp4, mxfp8, nvfp4), per-tensor
//! quantization metadata, and the import pipeline that turns a foreign checkpoint into one MLX
//! can load: read, classify, plan, write, manifest.
