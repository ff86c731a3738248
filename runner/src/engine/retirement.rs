//! Retirement: a sequence that finished, was cancelled or failed leaves the step loop. A
//! finished or cancelled one hands every snapshot its prefill crossed to the prefix trie and
//! closes its session there, so a retry or the next turn resumes where it stopped; a failed
//! one's caches are not trusted and are dropped. Its sampler slot and drafter state go with it,
//! and its client hears how it ended.

use crate::engine::job::{DoneReason, Event};
use crate::engine::loaded_model::LoadedModel;
use crate::engine::sequence::{Outcome, Sequence, SequenceId};
use crate::engine::speculating::Speculating;

impl LoadedModel {
    pub(super) fn retire_cancelled(&mut self) {
        let cancelled: Vec<SequenceId> = self
            .sequences
            .iter()
            .filter(|s| s.cancelled())
            .map(|s| s.id)
            .collect();
        for id in cancelled {
            self.retire(id, Outcome::Done(DoneReason::Cancelled));
        }
    }

    /// Ends sequence `id`: records what its caches hold in the prefix trie (finished or
    /// cancelled; a failed one's caches are not trusted), releases its slot and reports.
    pub(super) fn retire(&mut self, id: SequenceId, outcome: Outcome) {
        let Some(index) = self.index_of(id) else {
            return;
        };
        let mut seq = self.sequences.remove(index);
        let _ = self.sampler.remove(seq.id);
        tracing::debug!(
            sequence = id,
            cached = seq.tokens.len(),
            generated = seq.stats.generated_tokens,
            outcome = match &outcome {
                Outcome::Done(reason) => reason.as_str(),
                Outcome::Failed(_) => "failed",
            },
            "retired"
        );
        match &outcome {
            Outcome::Done(_) => {
                if let Err(e) = self.prefix.close(&mut seq) {
                    tracing::warn!("prefix cache: recording a request failed: {e}");
                }
            }
            Outcome::Failed(_) => self.prefix.abandon(&mut seq),
        }
        self.end_drafting(&seq, matches!(outcome, Outcome::Done(_)));
        self.release_rows(&seq);
        // Dropping the caches copies out the lazy snapshots the trie took of them.
        seq.caches.clear();
        if let Err(e) = self.prefix.evict() {
            tracing::warn!("prefix cache: eviction failed: {e}");
        }
        let event = match outcome {
            Outcome::Done(reason) => {
                let mut stats = seq.stats;
                stats.speculation = seq.speculating.as_ref().map(Speculating::stats);
                match seq.first_token {
                    Some(first) => stats.eval = first.elapsed(),
                    None => stats.prompt_eval = seq.admitted.elapsed(),
                }
                stats.peak_memory = mlx::memory::peak_memory().unwrap_or(0);
                Event::Done { reason, stats }
            }
            Outcome::Failed(message) => Event::Failed(message),
        };
        let _ = seq.job.events.send(event);
    }

    /// Ends every running sequence with `message` (after a failure or panic in a step).
    pub fn fail_all(&mut self, message: &str) {
        self.pending = None;
        for mut seq in std::mem::take(&mut self.sequences) {
            self.prefix.abandon(&mut seq);
            let _ = self.sampler.remove(seq.id);
            self.end_drafting(&seq, false);
            self.release_rows(&seq);
            let _ = seq.job.events.send(Event::Failed(message.to_string()));
        }
    }

    /// Tells the model a retiring sequence's caches run no forward again (a model split across
    /// processes frees the other ranks' copies).
    fn release_rows(&self, seq: &Sequence) {
        if let Err(e) = self.model.release_rows(&[seq.id as u64]) {
            tracing::warn!("releasing a sequence's caches: {e}");
        }
    }

    /// Tells a retiring sequence's drafter it ended (`intact`: not after a failure, so what
    /// the drafter holds of it may be kept).
    fn end_drafting(&mut self, seq: &Sequence, intact: bool) {
        let kind = seq.speculating.as_ref().map(Speculating::kind);
        if let Some(drafter) = kind.and_then(|kind| self.drafters.get(kind)) {
            drafter.end(seq.id, &seq.tokens, intact);
        }
    }
}
