//! Qwen2 / Qwen2.5: the llama layout with biased q/k/v projections (read from the checkpoint)
//! and a tied or untied head.

use crate::Result;
use crate::arch::decoder::{Decoder, DecoderOptions, build_decoder};
use crate::config::TextConfig;
use crate::registry::Source;
use crate::weights::Weights;

/// Builds a Qwen2 decoder. llama.cpp does not permute Qwen's Q/K rows, so GGUF needs nothing.
pub fn build(config: TextConfig, weights: &mut Weights, _source: Source) -> Result<Decoder> {
    build_decoder(config, weights, DecoderOptions::default())
}
