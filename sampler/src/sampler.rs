//! `Sampler`: the registered slots and the calls that sample for them.

use std::collections::{HashMap, HashSet};

use mlx::{Array, Dtype, random};

use crate::logprobs::Logprobs;
use crate::options::Options;
use crate::pipeline::{adjust, draw, probabilities};
use crate::ring::{Ring, to_i32};
use crate::{Error, Result, mask};

/// Names one sequence being decoded.
pub type SlotId = usize;

/// What [`Sampler::sample`] returns: device arrays, not yet computed, so the caller can
/// dispatch the next step before reading them.
#[derive(Debug, Clone)]
pub struct Sampled {
    /// `[B]` u32: one token per row.
    pub tokens: Array,
    /// Present when any row's slot asked for logprobs; then computed for every row, with the
    /// largest `N` asked for (callers keep what their slot wanted).
    pub logprobs: Option<Logprobs>,
}

/// Probability rows for speculative verification.
#[derive(Debug, Clone)]
pub struct Distribution {
    /// `[R, V]` f32: row `i` is the distribution `sample` would draw from.
    pub probs: Array,
}

#[derive(Debug)]
struct Slot {
    options: Options,
    ring: Ring,
    /// Split every sampled step: one half draws, the other is kept.
    key: Array,
    /// Fixed by the first call that sees logits for the slot.
    vocab: Option<usize>,
    /// The largest token id ever put into the ring from the host.
    largest_token: Option<u32>,
}

/// Turns logits into tokens for any number of registered slots.
#[derive(Debug, Default)]
pub struct Sampler {
    slots: HashMap<SlotId, Slot>,
}

impl Sampler {
    /// A sampler with no slots.
    pub fn new() -> Sampler {
        Sampler::default()
    }

    /// Registers `slot` with its options; the penalty window starts with the last tokens of
    /// `prompt_history`.
    pub fn add(&mut self, slot: SlotId, options: Options, prompt_history: &[u32]) -> Result<()> {
        if self.slots.contains_key(&slot) {
            return Err(Error::SlotInUse(slot));
        }
        options.validate()?;
        let ring = Ring::new(options.window(), prompt_history)?;
        let seed = options.seed.unwrap_or_else(rand::random);
        let key = random::key(seed)?;
        let largest_token = prompt_history.iter().copied().max();
        self.slots.insert(
            slot,
            Slot {
                options,
                ring,
                key,
                vocab: None,
                largest_token,
            },
        );
        Ok(())
    }

    /// Forgets `slot`.
    pub fn remove(&mut self, slot: SlotId) -> Result<()> {
        self.slots
            .remove(&slot)
            .map(drop)
            .ok_or(Error::UnknownSlot(slot))
    }

    /// Whether `slot` is registered.
    pub fn contains(&self, slot: SlotId) -> bool {
        self.slots.contains_key(&slot)
    }

    /// The options `slot` was added with.
    pub fn options(&self, slot: SlotId) -> Result<&Options> {
        Ok(&self.slot(slot)?.options)
    }

    /// Samples one token per row of `logits` (`[slots.len(), V]`, any float dtype), row `b`
    /// for `slots[b]`, and appends each token to its slot's window on the device. Slots whose
    /// options agree up to seed and logprobs ([`Options::same_distribution`]) run as one
    /// batched pass; otherwise every row runs alone. A seeded slot draws the same token
    /// whichever other slots share the call.
    pub fn sample(&mut self, slots: &[SlotId], logits: &Array) -> Result<Sampled> {
        self.sample_masked(slots, logits, &[])
    }

    /// Like [`Sampler::sample`], with a grammar token mask per row (`None`: unconstrained;
    /// an empty `masks`: no row constrained). Masked tokens are never sampled, and penalties and
    /// logprobs see only what the mask allows.
    pub fn sample_masked(
        &mut self,
        slots: &[SlotId],
        logits: &Array,
        masks: &[Option<&[u32]>],
    ) -> Result<Sampled> {
        let vocab = self.check_call(slots, logits, slots.len())?;
        let mut logits = as_f32(logits)?;
        if !masks.is_empty() {
            if masks.len() != slots.len() {
                return Err(Error::MaskCount {
                    masks: masks.len(),
                    rows: slots.len(),
                });
            }
            if masks.iter().any(Option::is_some) {
                let allowed = mask::expand(masks, vocab)?;
                logits = allowed.select(&logits, f32::NEG_INFINITY)?;
            }
        }

        let first = &self.slot(slots[0])?.options;
        let shared = slots.iter().all(|&s| {
            self.slots
                .get(&s)
                .is_some_and(|slot| slot.options.same_distribution(first))
        });
        let tokens = if shared {
            let options = first.clone();
            let windows = match options.window() {
                0 => None,
                _ => Some(mlx::stack(&self.windows(slots), 0)?),
            };
            let keys = self.next_keys(slots, &options)?;
            let adjusted = adjust(&logits, &options, windows.as_ref())?;
            draw(&adjusted, &options, &keys)?
        } else {
            let mut tokens = Vec::with_capacity(slots.len());
            for (row, &slot) in slots.iter().enumerate() {
                let options = self.slot(slot)?.options.clone();
                let windows = match self.slot(slot)?.ring.tokens() {
                    None => None,
                    Some(ring) => Some(ring.expand_dims(&[0])?),
                };
                let keys = self.next_keys(&[slot], &options)?;
                let row_logits = logits.slice_axis(0, to_i32(row)?, to_i32(row + 1)?)?;
                let adjusted = adjust(&row_logits, &options, windows.as_ref())?;
                tokens.push(draw(&adjusted, &options, &keys)?);
            }
            mlx::concatenate(&tokens, 0)?
        };

        let top = slots
            .iter()
            .filter_map(|s| self.slots.get(s).and_then(|slot| slot.options.logprobs))
            .max();
        let logprobs = match top {
            Some(top) => Some(Logprobs::compute(&logits, &tokens, top)?),
            None => None,
        };

        for (row, &slot) in slots.iter().enumerate() {
            let token = tokens.slice_axis(0, to_i32(row)?, to_i32(row + 1)?)?;
            let slot = self.slot_mut(slot)?;
            slot.ring.append_device(&token)?;
            slot.vocab = Some(vocab);
        }
        Ok(Sampled { tokens, logprobs })
    }

    /// The distributions speculative verification compares drafts against, without changing
    /// any state. `logits` is `[R, V]`; `draft_chain` (`[N]` or `[1, N]` integer token ids on the
    /// device) aligns with the end of the rows: row `i` sees the slot's history extended by the
    /// first `N - R + 1 + i` drafts, so `R = N + 1` verifies every draft plus the bonus token
    /// and `R = 1` proposes the next draft after the whole chain. `R` may not exceed `N + 1`.
    ///
    /// No grammar mask applies here ([`Sampler::distribution_masked`] takes them). Draft ids are
    /// not read back to the host (that would cost a sync), so ids outside the vocabulary are
    /// clamped into it on the device.
    pub fn distribution(
        &self,
        slot: SlotId,
        logits: &Array,
        draft_chain: Option<&Array>,
    ) -> Result<Distribution> {
        self.distribution_masked(slot, logits, draft_chain, &[])
    }

    /// Like [`Sampler::distribution`], with a grammar token mask per row (`None`:
    /// unconstrained; an empty `masks`: no row constrained): row `i` sees the grammar after the
    /// first `N - R + 1 + i` drafts, as it sees the penalty window.
    pub fn distribution_masked(
        &self,
        slot: SlotId,
        logits: &Array,
        draft_chain: Option<&Array>,
        masks: &[Option<&[u32]>],
    ) -> Result<Distribution> {
        let rows = logits.shape().first().map_or(0, |&r| r.max(0) as usize);
        let vocab = self.check_call(&[slot], logits, rows)?;
        let mut logits = as_f32(logits)?;
        if !masks.is_empty() {
            if masks.len() != rows {
                return Err(Error::MaskCount {
                    masks: masks.len(),
                    rows,
                });
            }
            if masks.iter().any(Option::is_some) {
                let allowed = mask::expand(masks, vocab)?;
                logits = allowed.select(&logits, f32::NEG_INFINITY)?;
            }
        }
        let chain = match draft_chain {
            None => None,
            Some(chain) => Some(chain_tokens(chain, vocab)?),
        };
        let drafts = chain.as_ref().map_or(0, |c| c.size());
        if rows == 0 || rows > drafts + 1 {
            return Err(Error::TooManyRows { rows, drafts });
        }
        let state = self.slot(slot)?;
        let windows = state
            .ring
            .windows_with_chain(chain.as_ref(), drafts, rows)?;
        let adjusted = adjust(&logits, &state.options, windows.as_ref())?;
        Ok(Distribution {
            probs: probabilities(&adjusted, &state.options)?,
        })
    }

    /// Appends tokens chosen elsewhere (the accepted run of a speculative round) to `slot`'s
    /// window: at most two slice updates.
    pub fn commit(&mut self, slot: SlotId, tokens: &[u32]) -> Result<()> {
        let state = self.slot_mut(slot)?;
        if let Some(vocab) = state.vocab
            && let Some(&token) = tokens.iter().find(|&&t| t as usize >= vocab)
        {
            return Err(Error::TokenOutOfVocab { token, vocab });
        }
        state.ring.append_host(tokens)?;
        state.largest_token = state.largest_token.max(tokens.iter().copied().max());
        Ok(())
    }

    /// The tokens in `slot`'s penalty window, oldest first (reads the device; for tests and
    /// diagnostics).
    pub fn history(&self, slot: SlotId) -> Result<Vec<u32>> {
        self.slot(slot)?.ring.read()
    }

    fn slot(&self, slot: SlotId) -> Result<&Slot> {
        self.slots.get(&slot).ok_or(Error::UnknownSlot(slot))
    }

    fn slot_mut(&mut self, slot: SlotId) -> Result<&mut Slot> {
        self.slots.get_mut(&slot).ok_or(Error::UnknownSlot(slot))
    }

    /// Checks the slots and the `[rows, V]` logits of a call; returns the vocabulary size.
    fn check_call(&self, slots: &[SlotId], logits: &Array, rows: usize) -> Result<usize> {
        if slots.is_empty() {
            return Err(Error::NoSlots);
        }
        let mut seen = HashSet::with_capacity(slots.len());
        for &slot in slots {
            if !seen.insert(slot) {
                return Err(Error::DuplicateSlot(slot));
            }
            self.slot(slot)?;
        }
        let shape = logits.shape();
        if shape.len() != 2 || shape[0] as usize != rows || rows == 0 || shape[1] <= 0 {
            return Err(Error::LogitsShape { shape, rows });
        }
        if !logits.dtype().is_float() {
            return Err(Error::LogitsDtype(logits.dtype()));
        }
        let vocab = shape[1] as usize;
        for &slot in slots {
            let state = self.slot(slot)?;
            if let Some(expected) = state.vocab
                && expected != vocab
            {
                return Err(Error::VocabChanged {
                    slot,
                    expected,
                    found: vocab,
                });
            }
            let largest_bias = state.options.logit_bias.keys().next_back().copied();
            if let Some(token) = state.largest_token.max(largest_bias)
                && token as usize >= vocab
            {
                return Err(Error::TokenOutOfVocab { token, vocab });
            }
        }
        Ok(vocab)
    }

    /// The rings of `slots`, each `[W]` (slots without a ring have none).
    fn windows(&self, slots: &[SlotId]) -> Vec<Array> {
        slots
            .iter()
            .filter_map(|s| self.slots.get(s)?.ring.tokens().cloned())
            .collect()
    }

    /// One fresh key per slot for this step (none needed when greedy).
    fn next_keys(&mut self, slots: &[SlotId], options: &Options) -> Result<Vec<Array>> {
        if options.is_greedy() {
            return Ok(Vec::new());
        }
        slots
            .iter()
            .map(|&s| {
                let slot = self.slot_mut(s)?;
                let mut halves = random::split(&slot.key, 2)?;
                let now = halves.pop();
                let next = halves.pop();
                match (next, now) {
                    (Some(next), Some(now)) => {
                        slot.key = next;
                        Ok(now)
                    }
                    _ => Err(Error::Mlx(mlx::Error::Mlx(
                        "split returned too few keys".into(),
                    ))),
                }
            })
            .collect()
    }
}

fn as_f32(logits: &Array) -> Result<Array> {
    Ok(if logits.dtype() == Dtype::F32 {
        logits.clone()
    } else {
        logits.astype(Dtype::F32)?
    })
}

/// A draft chain as `[N]` i32 ids clamped into the vocabulary.
fn chain_tokens(chain: &Array, vocab: usize) -> Result<Array> {
    let shape = chain.shape();
    let dtype = chain.dtype();
    let flat = match shape.as_slice() {
        [_] => chain.clone(),
        [1, n] => chain.reshape(&[*n])?,
        _ => return Err(Error::ChainShape { shape, dtype }),
    };
    if dtype.is_float() || dtype == Dtype::Bool {
        return Err(Error::ChainShape { shape, dtype });
    }
    Ok(flat.astype(Dtype::I32)?.clip(0, to_i32(vocab - 1)?)?)
}
