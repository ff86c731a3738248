//! Qwen2 / Qwen2.5: the llama layout with biased q/k/v projections (read from the checkpoint)
//! and a tied or untied head.

use crate::Result;
use crate::arch::decoder::{Decoder, DecoderOptions, build_decoder};
use crate::config::TextConfig;
use crate::weights::Weights;

/// Builds a Qwen2 decoder.
pub fn build(config: TextConfig, weights: &mut Weights) -> Result<Decoder> {
    build_decoder(config, weights, DecoderOptions::default())
}
