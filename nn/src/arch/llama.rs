//! Llama 2/3, SmolLM2 and Mistral-style decoders: RMSNorm, SwiGLU, grouped-query attention.

use crate::Result;
use crate::arch::decoder::{Decoder, DecoderOptions, build_decoder};
use crate::config::TextConfig;
use crate::weights::Weights;

/// Builds a llama-family decoder.
pub fn build(config: TextConfig, weights: &mut Weights) -> Result<Decoder> {
    build_decoder(config, weights, DecoderOptions::default())
}
