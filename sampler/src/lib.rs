//! Slot-based on-device sampling.
//!
//! This crate will own turning logits into tokens on the device: temperature, top-k, top-p,
//! min-p, penalties over a ring of recent tokens, seeds, logprobs, grammar masks and the
//! distribution rows that speculative verification needs.
