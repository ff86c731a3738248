//! Llama 2/3, SmolLM2 and Mistral-style decoders: RMSNorm, SwiGLU, grouped-query attention.

use crate::Result;
use crate::arch::decoder::{Decoder, DecoderOptions, build_decoder};
use crate::config::TextConfig;
use crate::registry::Source;
use crate::weights::Weights;

/// Builds a llama-family decoder. GGUF checkpoints keep llama.cpp's interleaved Q/K row order,
/// which rotating adjacent pairs ("traditional" rope) undoes for free.
pub fn build(config: TextConfig, weights: &mut Weights, source: Source) -> Result<Decoder> {
    build_decoder(
        config,
        weights,
        DecoderOptions {
            traditional_rope: source == Source::Gguf,
            ..DecoderOptions::default()
        },
    )
}
