//! Prefill: prompt chunks for the sequences still evaluating their prompts, under a per-step
//! token budget (smaller while others decode, so decoding keeps moving behind a long prompt),
//! shortest prompt first, batched into as few forwards as their widths allow. A chunk never
//! cuts an image (its tokens attend both ways) and ends at the next scheduled capture (a
//! recurrent layer captures only at a forward's end). Images and audio are encoded here, or
//! found among the kept encodings; a sequence whose prompt is done hands back its last logits,
//! which seed its decoding.

use std::time::Instant;

use mlx::Array;
use nn::{Batch, Forward, ImageGrid};

use crate::engine::job::{DoneReason, EncoderInput, PromptMedia};
use crate::engine::loaded_model::LoadedModel;
use crate::engine::memory::LONG_PREFILL;
use crate::engine::sequence::{Outcome, Phase, Sequence, SequenceId};
use crate::engine::step::{
    Result, Step, StepError, caches_of, equal_width_groups, exact_width_groups, last_logits,
    of_sequences,
};

impl LoadedModel {
    /// Gives prefilling sequences their chunks under this step's token budget, batched into as
    /// few forwards as their chunk widths allow; returns the last-position logits `[1, V]` of
    /// each sequence whose prompt is now fully evaluated.
    pub(super) fn prefill(&mut self, step: &mut Step) -> Vec<(SequenceId, Array)> {
        let planned = self.plan_chunks(step);
        // Chunks holding image tokens are never cut to another's width (that could split an
        // image): they share a forward only with chunks of their exact width.
        let (with_images, text): (Vec<_>, Vec<_>) = planned
            .into_iter()
            .partition(|&(i, n)| chunk_has_images(&self.sequences[i], n));
        let mut groups = equal_width_groups(text);
        groups.extend(exact_width_groups(with_images));
        let mut seeds = Vec::new();
        for (width, group) in groups {
            seeds.extend(self.prefill_group(&group, width, step));
        }
        seeds
    }

    /// This step's prompt chunks, `(index, tokens)`: shortest remaining prompt first, under
    /// the step's token budget (smaller while others decode, and capped by the pace), each
    /// ending at its next capture and never inside an image.
    fn plan_chunks(&mut self, step: &Step) -> Vec<(usize, usize)> {
        let decoding = self
            .sequences
            .iter()
            .any(|s| s.phase == Phase::Decoding && !step.ending.contains(s.id));
        let mut budget = self.pace.cap(if decoding {
            self.config.prefill_budget_while_decoding
        } else {
            self.config.prefill_budget_idle
        });
        // Shortest remaining prompt first: a short request is never queued behind a long
        // prompt's chunks.
        let mut order: Vec<usize> = (0..self.sequences.len())
            .filter(|&i| {
                let seq = &self.sequences[i];
                seq.phase == Phase::Prefilling && !step.ending.contains(seq.id)
            })
            .collect();
        order.sort_by_key(|&i| self.sequences[i].prompt_left());
        let mut planned = Vec::new();
        for i in order {
            if budget == 0 {
                break;
            }
            let wanted = self.sequences[i]
                .prompt_left()
                .min(budget)
                .min(self.config.prefill_chunk)
                .max(1);
            let n = self.chunk_of_whole_images(i, self.chunk_until_capture(i, wanted));
            budget = budget.saturating_sub(n);
            planned.push((i, n));
        }
        planned
    }

    /// Evaluates the chunks of `width` tokens of `group` (indices, ascending) in one forward,
    /// timing it for the pace; returns the last logits of each sequence whose prompt is now
    /// evaluated. One that asked for no tokens ends there; a failed forward ends every row.
    fn prefill_group(
        &mut self,
        group: &[usize],
        width: usize,
        step: &mut Step,
    ) -> Vec<(SequenceId, Array)> {
        let ids: Vec<SequenceId> = group.iter().map(|&i| self.sequences[i].id).collect();
        // An image's encoder runs inside its chunk's forward: its time says nothing of the
        // pace of prompt tokens.
        let paced = !group
            .iter()
            .any(|&i| chunk_has_images(&self.sequences[i], width));
        let started = Instant::now();
        let ends = match self.prefill_rows(group, width) {
            Ok(ends) => ends,
            // One forward wrote every row's caches: none of them can be trusted.
            Err(e) => {
                let why = self.why_failed(&e);
                for id in ids {
                    step.ending.add(id, Outcome::Failed(why.clone()));
                }
                return Vec::new();
            }
        };
        if paced {
            self.pace.record(width * group.len(), started.elapsed());
        }
        step.clear_pool |= width * group.len() >= LONG_PREFILL;
        let mut seeds = Vec::new();
        for (id, logits) in ids.into_iter().zip(ends) {
            match logits {
                // Asked for no tokens (or no room left): done once the prompt is evaluated.
                Some(_)
                    if self
                        .index_of(id)
                        .is_some_and(|i| self.sequences[i].budget == 0) =>
                {
                    step.ending.add(id, Outcome::Done(DoneReason::Length));
                }
                Some(logits) => seeds.push((id, logits)),
                None => {}
            }
        }
        seeds
    }

    /// `n`, or less so that the chunk of sequence `index` ends at its next scheduled capture: a
    /// recurrent layer captures only at a forward's end.
    fn chunk_until_capture(&self, index: usize, n: usize) -> usize {
        let seq = &self.sequences[index];
        let from = seq.tokens.len();
        seq.caches
            .iter()
            .flatten()
            .filter_map(|c| c.next_capture_within(from, n))
            .filter(|&at| at > from)
            .map(|at| at - from)
            .min()
            .unwrap_or(n)
            .min(seq.prompt_left())
            .max(1)
    }

    /// `n`, or another length so that the chunk of sequence `index` does not end inside an
    /// image: shorter, to stop before it, or, when the chunk starts with it, just long enough
    /// to take it whole (an image's tokens attend to each other both ways).
    fn chunk_of_whole_images(&self, index: usize, n: usize) -> usize {
        let seq = &self.sequences[index];
        let from = seq.tokens.len();
        let to = from + n;
        match seq.job.image_at(to) {
            Some(image) if image.tokens.start < to => {
                if image.tokens.start > from {
                    image.tokens.start - from
                } else {
                    image.tokens.end - from
                }
            }
            _ => n,
        }
    }

    /// Evaluates the next `width` prompt tokens of each sequence in `group` (indices into
    /// `self.sequences`, ascending) in one forward. A row whose chunk ends its prompt gets its
    /// last logits (its last token's hidden state seeds decoding: a short prompt is one
    /// forward).
    fn prefill_rows(&mut self, group: &[usize], width: usize) -> Result<Vec<Option<Array>>> {
        let mut rows = Vec::with_capacity(group.len());
        for &i in group {
            let seq = &self.sequences[i];
            let from = seq.tokens.len();
            let to = from + width;
            if to > seq.job.prompt.len() {
                return Err(StepError::Internal(
                    "a prefill chunk overruns its prompt".into(),
                ));
            }
            rows.push((&seq.job.prompt[from..to], from));
        }
        let batch = of_sequences(Batch::rows(&rows)?, &self.sequences, group)?;
        // What each row's chunk moves its rope delta by (its images', whole in the chunk).
        let moved = group
            .iter()
            .map(|&i| self.chunk_rope_delta(i, width))
            .collect::<Result<Vec<i64>>>()?;
        let out = self.forward_chunks(group, width, &batch)?;
        let mut ends = Vec::with_capacity(group.len());
        let mut unfinished = Vec::new();
        for (row, &i) in group.iter().enumerate() {
            let seq = &mut self.sequences[i];
            let from = seq.tokens.len();
            if seq.wants_head_states() {
                let states = out
                    .conditioning()
                    .slice_axis(0, row as i32, row as i32 + 1)?;
                seq.keep_head_states(from, states)?;
            }
            seq.tokens
                .extend_from_slice(&seq.job.prompt[from..from + width]);
            seq.rope_delta += moved[row];
            if seq.tokens.len() == seq.job.prompt.len() {
                seq.phase = Phase::Decoding;
                let hidden = out.hidden.slice_axis(0, row as i32, row as i32 + 1)?;
                ends.push(Some(last_logits(self.model.as_ref(), &hidden)?));
            } else {
                unfinished.push(i);
                ends.push(None);
            }
        }
        if !unfinished.is_empty() {
            // Sliding-window caches attend a gathered copy while prefilling, so their ring
            // writes are not inputs of `hidden`: evaluate the cache state explicitly.
            let mut arrays = vec![out.hidden];
            for i in unfinished {
                arrays.extend(
                    self.sequences[i]
                        .caches
                        .iter()
                        .flatten()
                        .flat_map(|c| c.state_arrays()),
                );
            }
            mlx::eval(&arrays)?;
        }
        Ok(ends)
    }

    /// The forward over `batch`, the next `width` prompt tokens of each sequence in `group`:
    /// through the model's audio or vision path, with the encoded features of the media wholly
    /// in the chunks, when there are any.
    fn forward_chunks(&mut self, group: &[usize], width: usize, batch: &Batch) -> Result<Forward> {
        let images = self.chunk_images(group, width)?;
        let out = match images {
            None => {
                let mut caches = caches_of(&mut self.sequences, group)?;
                self.model.forward_rows(batch, &mut caches)?
            }
            Some((features, _)) if self.model.audio().is_some() => {
                let audio = self
                    .model
                    .audio()
                    .ok_or_else(|| StepError::Request("this model does not read audio".into()))?;
                let mut caches = caches_of(&mut self.sequences, group)?;
                audio.forward_rows_with_audio(batch, Some(&features), &mut caches)?
            }
            Some((features, grids)) => {
                let vision = self
                    .model
                    .vision()
                    .ok_or_else(|| StepError::Request("this model does not read images".into()))?;
                let mut caches = caches_of(&mut self.sequences, group)?;
                vision.forward_rows_with_image_grids(batch, Some(&features), &grids, &mut caches)?
            }
        };
        Ok(out)
    }

    /// How far the next `width` prompt tokens of sequence `index` move its rope delta: by what
    /// the images wholly among them add (planning never cuts one).
    fn chunk_rope_delta(&self, index: usize, width: usize) -> Result<i64> {
        let Some(vision) = self.model.vision() else {
            return Ok(0);
        };
        let seq = &self.sequences[index];
        let (from, to) = (seq.tokens.len(), seq.tokens.len() + width);
        let chunk = seq
            .job
            .prompt
            .get(from..to)
            .ok_or_else(|| StepError::Internal("a prefill chunk overruns its prompt".into()))?;
        let grids: Vec<ImageGrid> = seq
            .job
            .images
            .iter()
            .filter(|image| from <= image.tokens.start && image.tokens.end <= to)
            .filter_map(PromptMedia::grid)
            .collect();
        Ok(vision.rope_delta(chunk, &grids)?)
    }

    /// The features of the images in the next `width` prompt tokens of each sequence in
    /// `group`, in row order, and their grids (empty for fixed-size images), or `None` when
    /// there are none: `[images, tokens_per_image, hidden]`, or `[tokens, hidden]` for a
    /// dynamic-resolution model. An image the chunk holds only in part is an error (planning
    /// never cuts one).
    fn chunk_images(
        &mut self,
        group: &[usize],
        width: usize,
    ) -> Result<Option<(Array, Vec<ImageGrid>)>> {
        let mut wanted: Vec<(usize, PromptMedia)> = Vec::new();
        for &i in group {
            let seq = &self.sequences[i];
            let (from, to) = (seq.tokens.len(), seq.tokens.len() + width);
            for image in &seq.job.images {
                let range = &image.tokens;
                if range.end <= from || to <= range.start {
                    continue;
                }
                if range.start < from || to < range.end {
                    return Err(StepError::Internal(format!(
                        "a prefill chunk of tokens {from}..{to} splits the image at {range:?}"
                    )));
                }
                wanted.push((i, image.clone()));
            }
        }
        if wanted.is_empty() {
            return Ok(None);
        }
        let mut features = Vec::with_capacity(wanted.len());
        let mut grids = Vec::new();
        for (i, image) in wanted {
            let mut encoded = 0;
            features.push(self.features_of(&image, &mut encoded)?);
            grids.extend(image.grid());
            let stats = &mut self.sequences[i].stats;
            if image.is_audio() {
                stats.audio_encoded += encoded;
            } else {
                stats.images_encoded += encoded;
            }
        }
        Ok(Some((mlx::concatenate(&features, 0)?, grids)))
    }

    /// The features of `image` (or audio segment): kept from an earlier encode, or encoded now
    /// (counted in `encoded`).
    fn features_of(&mut self, image: &PromptMedia, encoded: &mut usize) -> Result<Array> {
        if let Some(features) = self.encoded.get(&image.id) {
            return Ok(features);
        }
        // Its features were kept when the request was prepared, and dropped since.
        let decoded;
        let input = match &image.input {
            EncoderInput::Undecoded(undecoded) => {
                decoded = undecoded
                    .decode()
                    .map_err(|e| StepError::Request(format!("invalid image: {e}")))?;
                &decoded
            }
            input => input,
        };
        if let EncoderInput::Audio(mel) = input {
            let audio = self
                .model
                .audio()
                .ok_or_else(|| StepError::Request("this model does not read audio".into()))?;
            let shape = [
                1,
                i32::try_from(mel.feature_size).unwrap_or(i32::MAX),
                i32::try_from(mel.frames).unwrap_or(i32::MAX),
            ];
            let features =
                audio.encode_audio(&Array::from_slice(&mel.features, &shape)?, mel.valid_frames)?;
            mlx::eval([&features])?;
            *encoded += 1;
            self.encoded.insert(image.id, features.clone());
            return Ok(features);
        }
        let Some(vision) = self.model.vision() else {
            return Err(StepError::Request("this model does not read images".into()));
        };
        let features = match (input, image.grid()) {
            (EncoderInput::Patches(patches), Some(grid)) => {
                let rows = i32::try_from(grid.patches()).unwrap_or(i32::MAX);
                let len = i32::try_from(patches.patch_len).unwrap_or(i32::MAX);
                let array = Array::from_slice(&patches.data, &[rows, len])?;
                vision.encode_image_patches(&array, &[grid])?
            }
            (EncoderInput::Pixels(pixels), _) => {
                let shape = [
                    media::PixelValues::CHANNELS as i32,
                    i32::try_from(pixels.height).unwrap_or(i32::MAX),
                    i32::try_from(pixels.width).unwrap_or(i32::MAX),
                ];
                let array = Array::from_slice(&pixels.data, &[1, shape[0], shape[1], shape[2]])?;
                vision.encode_images(&array)?
            }
            (EncoderInput::Patches(_), None) => {
                return Err(StepError::Internal("image patches without a grid".into()));
            }
            (EncoderInput::Audio(_), _) => {
                return Err(StepError::Internal("audio where an image was due".into()));
            }
            (EncoderInput::Undecoded(_), _) => {
                return Err(StepError::Internal(
                    "an image decoded to another undecoded".into(),
                ));
            }
        };
        mlx::eval([&features])?;
        *encoded += 1;
        self.encoded.insert(image.id, features.clone());
        Ok(features)
    }
}

/// Whether `seq`'s next `n` prompt tokens hold any of an image's tokens.
fn chunk_has_images(seq: &Sequence, n: usize) -> bool {
    let from = seq.tokens.len();
    seq.job
        .images
        .iter()
        .any(|image| image.tokens.start < from + n && from < image.tokens.end)
}
