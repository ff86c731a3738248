//! Gemma 3 (text): sliding-window and global layers with their own rope bases, embeddings
//! scaled by √hidden, sandwich norms, q/k norms, GeGLU, and norms stored as `w − 1`.

use crate::Result;
use crate::arch::decoder::{Decoder, DecoderOptions, build_decoder};
use crate::config::TextConfig;
use crate::registry::Source;
use crate::weights::Weights;

/// Builds a Gemma 3 text decoder. llama.cpp's converter adds the +1 to norm weights when it
/// writes a GGUF, so only transformers checkpoints need the offset here.
pub fn build(config: TextConfig, weights: &mut Weights, source: Source) -> Result<Decoder> {
    build_decoder(
        config,
        weights,
        DecoderOptions {
            norm_unit_offset: source == Source::Transformers,
            sandwich_norms: true,
            scale_embeddings: true,
            traditional_rope: false,
        },
    )
}
