//! The one OS thread that owns all MLX work.
//!
//! This crate will own `Worker`: a dedicated thread that runs closures submitted from anywhere,
//! blocking or awaited, and re-raises a closure's panic in the caller with its original location.
