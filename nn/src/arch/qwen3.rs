//! Qwen3: the Qwen2 layout without projection biases, with per-head RMS norms of queries and
//! keys before rotation (`q_norm`, `k_norm`, found in the checkpoint).

use crate::arch::decoder::{Decoder, DecoderOptions, build_decoder};
use crate::config::TextConfig;
use crate::weights::Weights;
use crate::{Error, Result};

/// Builds a Qwen3 decoder.
pub fn build(config: TextConfig, weights: &mut Weights) -> Result<Decoder> {
    if !weights.contains("model.layers.0.self_attn.q_norm.weight") {
        return Err(Error::Weights(
            "qwen3 checkpoint has no q_norm weights".into(),
        ));
    }
    build_decoder(config, weights, DecoderOptions::default())
}
