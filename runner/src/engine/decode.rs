//! Decode: one batched forward over every decoding sequence, fed with the tokens the step
//! before sampled (still unread: the device never waits for the host) or, for a speculating
//! sequence starting a plain stretch, with a token the host knows; one sampler call over its
//! rows and the rows whose prefill just ended (unconstrained: dispatched before the host
//! reads; under a grammar: after the host has advanced the matchers); then the previous step's
//! tokens are read, streamed and judged (stop tokens, budgets, grammar, the client).

use std::collections::HashMap;
use std::time::Instant;

use mlx::Array;
use nn::Batch;
use sampler::Sampled;

use crate::engine::job::{DoneReason, TokenLogprobs};
use crate::engine::loaded_model::LoadedModel;
use crate::engine::sequence::{Outcome, Sequence, SequenceId};
use crate::engine::speculating::Speculating;
use crate::engine::speculation;
use crate::engine::step::{Ending, Pending, Result, Step, caches_of, last_logits, of_sequences};

/// What a decoding row of the batched forward is fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Feed {
    /// The token the previous step sampled in this row of its `Pending`, not yet read.
    Row(usize),
    /// A token the host knows: the first of a speculating sequence's plain stretch.
    Token(u32),
}

impl LoadedModel {
    /// Runs the batched decode forward, fed with last step's unread tokens (and the first
    /// token of each plain stretch that starts now), dispatches one sampler call for its rows
    /// and the `seeds` (the last logits of prompts evaluated this step), and reads, streams and
    /// judges last step's tokens meanwhile. Returns what was sampled and whose rows they are,
    /// not yet read.
    pub(super) fn decode(
        &mut self,
        seeds: Vec<(SequenceId, Array)>,
        step: &mut Step,
    ) -> Result<Option<(Sampled, Vec<SequenceId>)>> {
        let previous = self.pending.take();
        let rows: HashMap<SequenceId, usize> = previous
            .iter()
            .flat_map(|prev| prev.rows.iter().enumerate().map(|(r, &id)| (id, r)))
            .collect();
        let mut fed: Vec<(SequenceId, Feed)> = Vec::new();
        for seq in &mut self.sequences {
            if step.ending.contains(seq.id) || !seq.may_continue() {
                continue;
            }
            match seq.speculating.as_mut() {
                Some(spec) if !spec.decodes_plainly() => {}
                Some(spec) => match (rows.get(&seq.id), spec.take_next()) {
                    (_, Some(token)) => fed.push((seq.id, Feed::Token(token))),
                    (Some(&row), None) => fed.push((seq.id, Feed::Row(row))),
                    (None, None) => {}
                },
                None => {
                    if let Some(&row) = rows.get(&seq.id) {
                        fed.push((seq.id, Feed::Row(row)));
                    }
                }
            }
        }
        let decode_logits = match fed.is_empty() {
            false => Some(self.decode_forward(previous.as_ref(), &fed)?),
            true => None,
        };

        // One sampler call for every row that needs a next token.
        let mut sample_ids: Vec<SequenceId> = fed.iter().map(|&(id, _)| id).collect();
        let mut parts: Vec<Array> = decode_logits.into_iter().collect();
        for (id, logits) in seeds {
            sample_ids.push(id);
            parts.push(logits);
        }
        let logits = match parts.len() {
            0 => None,
            1 => parts.pop(),
            _ => Some(mlx::concatenate(&parts, 0)?),
        };
        let constrained = sample_ids.iter().any(|&id| self.has_grammar(id));
        let mut sampled = None;
        if let Some(logits) = &logits {
            if constrained {
                // The masks need the tokens read below; the forward runs meanwhile.
                mlx::async_eval([logits])?;
            } else {
                let s = self.sampler.sample(&sample_ids, logits)?;
                mlx::async_eval([&s.tokens])?;
                sampled = Some(s);
            }
        }

        // Read, stream and judge last step's tokens.
        if let Some(prev) = &previous {
            self.read_tokens(prev, &fed, step)?;
        }

        if let (Some(logits), true) = (&logits, constrained) {
            let masks = self.grammar_masks(&sample_ids, logits, &mut step.ending)?;
            let borrowed: Vec<Option<&[u32]>> = masks.iter().map(|m| m.as_deref()).collect();
            let s = self.sampler.sample_masked(&sample_ids, logits, &borrowed)?;
            mlx::async_eval([&s.tokens])?;
            sampled = Some(s);
        }
        Ok(sampled.map(|sampled| (sampled, sample_ids)))
    }

    /// One forward over the decoding rows `fed`, each fed the token `prev` sampled in its row
    /// or the token the host gives it; returns their logits `[rows, V]`. A host token joins
    /// its sequence's cached tokens here; a sampled one when it is read.
    fn decode_forward(
        &mut self,
        prev: Option<&Pending>,
        fed: &[(SequenceId, Feed)],
    ) -> Result<Array> {
        let sampled_rows = prev.map_or(0, |p| p.rows.len());
        let all_in_order = fed.len() == sampled_rows
            && fed
                .iter()
                .enumerate()
                .all(|(i, &(_, feed))| feed == Feed::Row(i));
        let tokens = match prev {
            Some(prev) if all_in_order => prev.sampled.tokens.clone(),
            _ => {
                // Host tokens go after the sampled ones; each row picks its own.
                let mut host: Vec<i32> = Vec::new();
                let mut picks: Vec<i32> = Vec::with_capacity(fed.len());
                for &(_, feed) in fed {
                    match feed {
                        Feed::Row(row) => picks.push(row as i32),
                        Feed::Token(token) => {
                            picks.push((sampled_rows + host.len()) as i32);
                            host.push(i32::try_from(token).unwrap_or(i32::MAX));
                        }
                    }
                }
                let host = Array::from_slice(&host, &[host.len() as i32])?;
                let all = match prev {
                    Some(prev) => {
                        let sampled = &prev.sampled.tokens;
                        mlx::concatenate(&[sampled.clone(), host.astype(sampled.dtype())?], 0)?
                    }
                    None => host,
                };
                all.take(&Array::from_slice(&picks, &[picks.len() as i32])?, 0)?
            }
        };
        let tokens = tokens.reshape(&[fed.len() as i32, 1])?;
        // `fed` follows the order of `self.sequences`, so its caches can be borrowed in order.
        let indices: Vec<usize> = fed
            .iter()
            .filter_map(|&(id, _)| self.index_of(id))
            .collect();
        let positions: Vec<usize> = indices
            .iter()
            .map(|&i| self.sequences[i].tokens.len())
            .collect();
        for (&i, &(_, feed)) in indices.iter().zip(fed) {
            if let Feed::Token(token) = feed {
                self.sequences[i].tokens.push(token);
            }
        }
        let batch = Batch::from_device(&tokens, positions)?;
        let batch = of_sequences(batch, &self.sequences, &indices)?;
        let mut caches = caches_of(&mut self.sequences, &indices)?;
        let out = self.model.forward_rows(&batch, &mut caches)?;
        drop(caches);
        for (row, (&i, &position)) in indices.iter().zip(&batch.positions).enumerate() {
            if self.sequences[i].wants_head_states() {
                let state = out
                    .conditioning()
                    .slice_axis(0, row as i32, row as i32 + 1)?;
                self.sequences[i].keep_head_states(position, state)?;
            }
        }
        last_logits(self.model.as_ref(), &out.hidden)
    }

    /// Reads the tokens `prev` sampled and hands each to its sequence: a token whose forward
    /// was dispatched (`fed`) joins the sequence's cached tokens; stop tokens, budgets, the
    /// grammar and the client decide whether it goes on.
    fn read_tokens(
        &mut self,
        prev: &Pending,
        fed: &[(SequenceId, Feed)],
        step: &mut Step,
    ) -> Result<()> {
        let tokens = prev.sampled.tokens.to_vec::<u32>()?;
        let logprobs = host_logprobs(&prev.sampled)?;
        let now = Instant::now();
        // What a plain step cost, for the controllers of sequences decoding plainly.
        let step_cost = now.saturating_duration_since(prev.dispatched);
        for (row, &id) in prev.rows.iter().enumerate() {
            let Some(index) = self.index_of(id) else {
                continue;
            };
            if step.ending.contains(id) {
                continue; // Cancelled before its token was read: the token never happened.
            }
            let seq = &mut self.sequences[index];
            let Some(&token) = tokens.get(row) else {
                step.ending.add(
                    id,
                    Outcome::Failed("the sampler returned too few rows".into()),
                );
                continue;
            };
            let was_fed = fed.iter().any(|&(f, _)| f == id);
            if was_fed {
                seq.tokens.push(token);
            }
            if seq
                .speculating
                .as_ref()
                .is_some_and(Speculating::rounds_started)
            {
                let batch = prev.rows.len();
                let cost = was_fed.then_some(step_cost);
                speculation::plain_step(
                    &mut self.drafters,
                    &mut self.controllers,
                    seq,
                    token,
                    batch,
                    cost,
                )?;
            }
            let entry = match (&logprobs, seq.job.sampling.logprobs) {
                (Some((chosen, ids, values)), Some(top)) => {
                    Some(logprobs_of_row(chosen, ids, values, row, top))
                }
                _ => None,
            };
            if let Some(outcome) = step.deliver(seq, token, entry, now) {
                step.ending.add(id, outcome);
            } else if !was_fed {
                after_unfed(seq, token, &mut step.ending);
            }
        }
        Ok(())
    }

    /// The grammar mask of each row to sample (`None`: unconstrained, or the sequence ends).
    fn grammar_masks(
        &mut self,
        ids: &[SequenceId],
        logits: &Array,
        ending: &mut Ending,
    ) -> Result<Vec<Option<Vec<u32>>>> {
        let width = usize::try_from(logits.dim(1)?).unwrap_or(0);
        let mut masks = Vec::with_capacity(ids.len());
        for &id in ids {
            let index = self.index_of(id).filter(|_| !ending.contains(id));
            let grammar = index.and_then(|i| self.sequences[i].job.grammar.as_mut());
            let mask = match grammar.map(|g| g.mask()) {
                Some(Ok(mut mask)) => {
                    // The model may have more output rows than the tokenizer has tokens
                    // (padding); the grammar never allows those.
                    if mask.len() < sampler::mask_words(width) {
                        mask.resize(sampler::mask_words(width), 0);
                    }
                    Some(mask)
                }
                Some(Err(e)) => {
                    ending.add(id, Outcome::Failed(format!("structured output: {e}")));
                    None
                }
                None => None,
            };
            masks.push(mask);
        }
        Ok(masks)
    }
}

/// The host's copy of a sampler call's logprobs, when its requests asked for them: each row's
/// chosen token's, then the top alternatives' ids and values, row after row.
type HostLogprobs = (Vec<f32>, Vec<u32>, Vec<f32>);

/// Reads `sampled`'s logprobs to the host, when it has them.
fn host_logprobs(sampled: &Sampled) -> Result<Option<HostLogprobs>> {
    let Some(lp) = &sampled.logprobs else {
        return Ok(None);
    };
    Ok(Some((
        lp.chosen.to_vec::<f32>()?,
        lp.top_ids.to_vec::<u32>()?,
        lp.top_logprobs.to_vec::<f32>()?,
    )))
}

/// `seq` took `token` and goes on, but no forward was dispatched with it (the first token
/// after prefill, or a plain stretch's last): a speculating sequence with budget left starts
/// its next round from it; any other ends here, its budget spent or its client gone.
fn after_unfed(seq: &mut Sequence, token: u32, ending: &mut Ending) {
    if let Some(spec) = seq.speculating.as_mut()
        && seq.stats.generated_tokens < seq.budget
        && !seq.job.cancelled()
    {
        // Its next round starts from this token.
        spec.resume_from(token);
        return;
    }
    let reason = if seq.cancelled() {
        DoneReason::Cancelled
    } else {
        DoneReason::Length
    };
    ending.add(seq.id, Outcome::Done(reason));
}

/// Row `row` of a call's logprobs, keeping the `top` alternatives its request asked for.
fn logprobs_of_row(
    chosen: &[f32],
    ids: &[u32],
    values: &[f32],
    row: usize,
    top: usize,
) -> TokenLogprobs {
    let per_row = ids.len().checked_div(chosen.len()).unwrap_or(0);
    let start = row * per_row;
    let ids = ids.get(start..start + per_row).unwrap_or(&[]);
    let values = values.get(start..start + per_row).unwrap_or(&[]);
    TokenLogprobs {
        logprob: chosen.get(row).copied().unwrap_or(f32::NEG_INFINITY),
        top: ids
            .iter()
            .copied()
            .zip(values.iter().copied())
            .take(top)
            .collect(),
    }
}
