//! The order of one step of the loop over a loaded model's sequences ([`LoadedModel::step`]):
//!
//! 1. `admission`: cancelled jobs leave the queue, cancelled sequences retire (so a retry
//!    finds what they evaluated in the trie), and waiting jobs are admitted while their KV
//!    fits the budget, each restored to its longest cached prefix;
//! 2. `prefill`: prompt chunks under a per-step token budget (smaller while others decode, so
//!    decoding keeps moving behind a long prompt);
//! 3. `decode`: **one batched forward** over every decoding sequence, fed with the tokens
//!    sampled the step before, which the host has not read yet (the device never waits for
//!    the host);
//! 4. one sampler call over every row that needs a next token — decode rows and sequences
//!    whose prefill just ended (unconstrained: dispatched before the host reads; under a
//!    grammar: after the host has advanced the matchers);
//! 5. the previous step's tokens are read, streamed and judged (stop tokens, budgets,
//!    cancellation); speculating sequences run their rounds (`speculation`);
//! 6. `retirement`: finished and cancelled sequences go into the prefix trie, so a retry or
//!    the next turn resumes where they stopped.
//!
//! What the phases share lives below them, in `step`; none of them calls back up into this
//! file.

use std::time::Instant;

use crate::engine::job::DoneReason;
use crate::engine::loaded_model::LoadedModel;
use crate::engine::sequence::Outcome;
use crate::engine::speculation;
use crate::engine::step::{Pending, Result, Step};

impl LoadedModel {
    /// Runs one step (see the module docs), as the only model resident. Failures end the
    /// sequences they concern with an error event; the loop itself always goes on.
    pub fn step(&mut self) {
        self.step_beside(0);
    }

    /// Like [`LoadedModel::step`], admitting within the KV budget beside
    /// `reserved_elsewhere`, the bytes the other resident models' sequences reserve.
    pub fn step_beside(&mut self, reserved_elsewhere: usize) {
        self.drop_cancelled_queued();
        // Cancelled sequences retire before anything is admitted, so a retry finds what they
        // evaluated in the trie.
        self.retire_cancelled();
        self.admit(reserved_elsewhere);
        if let Err(e) = self.advance() {
            // A failed batched forward may leave any running cache half-written.
            let why = self.why_failed(&e);
            self.fail_all(&why);
        }
    }

    /// What a failed forward tells its requests: why the model cannot run, when it says (a
    /// group that lost a rank names it), else the error.
    pub(super) fn why_failed(&self, error: &dyn std::fmt::Display) -> String {
        self.model
            .unavailable()
            .unwrap_or_else(|| error.to_string())
    }

    /// Steps 2–6 of the module docs.
    fn advance(&mut self) -> Result<()> {
        let mut step = Step::default();
        self.controllers.begin_step();
        for seq in &self.sequences {
            if seq.cancelled() {
                step.ending
                    .add(seq.id, Outcome::Done(DoneReason::Cancelled));
            }
        }
        let seeds = self.prefill(&mut step);

        // Speculating sequences whose drafting does not pay join the plain forward below.
        speculation::decide_depths(&mut self.controllers, &mut self.sequences, &step.ending);

        let sampled = self.decode(seeds, &mut step)?;
        speculation::Rounds {
            model: self.model.as_ref(),
            drafters: &mut self.drafters,
            sampler: &mut self.sampler,
            controllers: &mut self.controllers,
            sequences: &mut self.sequences,
            step: &mut step,
        }
        .run()?;
        self.pending = sampled.map(|(sampled, rows)| Pending {
            sampled,
            rows,
            dispatched: Instant::now(),
        });

        for (id, outcome) in step.ending.outcomes {
            self.retire(id, outcome);
        }
        if step.clear_pool {
            crate::engine::memory::release_pool()?;
        }
        Ok(())
    }
}
