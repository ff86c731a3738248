//! Gemma 3 (text): sliding-window and global layers with their own rope bases, embeddings
//! scaled by √hidden, sandwich norms, q/k norms, GeGLU, and norms stored as `w − 1`.

use crate::Result;
use crate::arch::decoder::{Decoder, DecoderOptions, build_decoder};
use crate::config::TextConfig;
use crate::weights::Weights;

/// Builds a Gemma 3 text decoder.
pub fn build(config: TextConfig, weights: &mut Weights) -> Result<Decoder> {
    build_decoder(
        config,
        weights,
        DecoderOptions {
            norm_unit_offset: true,
            sandwich_norms: true,
            scale_embeddings: true,
        },
    )
}
