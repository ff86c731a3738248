//! Structured output as per-step token masks.
//!
//! This crate will own compiling `json`, JSON Schema, regular expressions, Lark grammars,
//! structural tags and tool-call schemas with llguidance, and stepping them token by token:
//! allowed-token bitmasks, consumption, rollback for speculation and accepting-state queries.
