//! Layers, the model contract and architectures.
//!
//! This crate will own the layers built from checkpoint tensors (linear, embedding, norms,
//! convolution, rotary embeddings, attention, mixture of experts, gated delta), the model
//! contract (`Model`, drafter heads, the architecture registry) and one file per architecture
//! under `arch/`.
