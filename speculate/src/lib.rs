//! Speculative decoding.
//!
//! This crate will own the speculation engine (one fused verification forward, rejection
//! sampling, one host sync per round), the `Drafter` trait and its drafters (n-gram, draft model,
//! multi-token-prediction head, block drafter) and the controller that picks the draft depth.
