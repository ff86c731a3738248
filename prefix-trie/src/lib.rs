//! A compressed trie of cached model states.
//!
//! This crate will own the prefix cache's bookkeeping, generic over a `Snapshot` trait: keys
//! (tokens, token pairs, media hashes), longest match and restore points, attaching captured
//! snapshots, splitting and merging nodes, and least-recently-used eviction under a byte budget.
