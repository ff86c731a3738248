//! Qwen3-MoE: Qwen3 attention with routed experts (softmax router, top-k, optional
//! renormalization) in the layers `decoder_sparse_step` and `mlp_only_layers` select.

use crate::arch::decoder::{Decoder, DecoderOptions, build_decoder};
use crate::config::TextConfig;
use crate::weights::Weights;
use crate::{Error, Result};

/// Builds a Qwen3-MoE decoder.
pub fn build(config: TextConfig, weights: &mut Weights) -> Result<Decoder> {
    if config.moe.is_none() {
        return Err(Error::Config("qwen3_moe config has no experts".into()));
    }
    build_decoder(config, weights, DecoderOptions::default())
}
