//! What attention and recurrent layers remember between forwards.
//!
//! This crate will own the KV cache, the rotating (sliding-window) cache and the recurrent-state
//! cache; their lazy snapshots, restore, rewind, merge and split; and the `KvHistory` and
//! `MaskApplier` that attention receives from a cache update.
