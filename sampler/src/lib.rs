//! Slot-based on-device sampling on MLX.
//!
//! A [`Sampler`] holds one *slot* per sequence being decoded: its [`Options`], a device ring
//! of its most recent tokens (for penalties) and its own PRNG key. [`Sampler::sample`] turns a
//! `[B, V]` block of logits into `B` tokens without a host sync: it returns device arrays and
//! appends each token to its slot's ring on the device, so the caller can dispatch step `n + 1`
//! before reading token `n`. When every slot of a call shares its options the whole batch
//! runs as one pass; otherwise each row runs its own.
//!
//! # Filter order
//!
//! logit bias → grammar mask → penalties → temperature → top-k → top-p → min-p → draw.
//!
//! Ollama's MLX runner orders penalties → top-k → temperature → top-p → min-p, with no logit
//! bias, and its grammar branch masks the logits just before sampling. The differences change no
//! distribution: bias has to come first to be a bias on the model's logits; the mask is `-inf`,
//! which every later step keeps `-inf`; and temperature commutes with top-k because scaling by
//! a positive number keeps the order (the code runs top-k first, so that only the `k`
//! survivors are scaled). Top-p reads the probabilities renormalised over the
//! top-k survivors, and min-p compares with the most likely survivor.
//!
//! Logprobs (on request only) come from the full-vocabulary log-softmax of the raw logits, as
//! OpenAI defines them, after the grammar mask alone (as Ollama's grammar branch does): so they
//! describe the distribution the grammar allows.
//!
//! # Files
//!
//! - `sampler`: [`Sampler`] (slots, `sample`, `distribution`, `commit`), [`Sampled`],
//!   [`Distribution`], [`SlotId`].
//! - `options`: [`Options`], defaults (repeat penalty 1.0) and validation.
//! - `ring`: the fixed-capacity device ring of a slot's last tokens; windows extended by a
//!   draft chain.
//! - `mask`: llguidance-style token bitmasks expanded on the device ([`mask_words`]).
//! - `penalty`: repeat, presence and frequency penalties over the windows.
//! - `filter`: temperature, top-k, top-p and min-p into the candidates a token is drawn from.
//! - `pipeline`: bias and penalties, then the draw (Gumbel-max with per-slot keys) or the
//!   probabilities it draws from.
//! - `logprobs`: [`Logprobs`] of the chosen tokens and the top alternatives.
//! - `error`: [`Error`] and [`Result`].
//!
//! # Example
//!
//! ```
//! use mlx::Array;
//! use sampler::{Options, Sampler};
//!
//! let mut sampler = Sampler::new();
//! let options = Options { seed: Some(7), logprobs: Some(2), ..Options::default() };
//! sampler.add(0, options, &[1, 2, 3])?;
//! let logits = Array::from_slice(&[0.1f32, 2.0, -1.0, 0.5], &[1, 4])?;
//! let sampled = sampler.sample(&[0], &logits)?;
//! let token = sampled.tokens.to_vec::<u32>()?[0];
//! assert!(token < 4);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

mod error;
mod filter;
mod logprobs;
mod mask;
mod options;
mod penalty;
mod pipeline;
mod ring;
mod sampler;

pub use error::{Error, Result};
pub use logprobs::Logprobs;
pub use mask::mask_words;
pub use options::{MAX_REPEAT_LAST_N, Options};
pub use sampler::{Distribution, Sampled, Sampler, SlotId};
