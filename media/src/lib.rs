//! Image and audio intake.
//!
//! This crate will own turning untrusted image and audio bytes into model-ready host data:
//! detection by content, decoding with limits checked before allocation, resizing and
//! normalization, resampling, splitting audio at pauses, and a content identity for the prefix
//! cache.
