//! Transcription on the MLX worker: a Whisper checkpoint turns the log-mel windows of one clip
//! into tokens, window by window (the encoder and its cross-attention projections once per
//! window, then greedy decoding, `nn::audio::whisper_decoding`).
//!
//! A speech recognizer is no [`crate::engine::LoadedModel`]: it has no prompt cache, no step
//! loop and no batch. Its job runs on the worker between step loops, as an embedding does, and
//! the last Whisper used stays built there (keyed by its files' folder) so the next request
//! does not read the checkpoint again. It sits beside whatever chat model is loaded, and is
//! let go whenever a model loads or unloads ([`release`]).

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use mlx::{Array, Dtype};
use nn::audio::whisper_decoding::{self, Decoded, SpecialTokens, Task};
use nn::audio::whisper_model::Whisper;

thread_local! {
    /// The last Whisper used, with the folder it was built from; on the worker thread.
    static WHISPER: RefCell<Option<(PathBuf, Whisper, SpecialTokens)>> = const { RefCell::new(None) };
}

/// What a transcription asks of the model.
#[derive(Debug, Clone)]
pub struct TranscriptionJob {
    /// The stored model's files.
    pub dir: PathBuf,
    /// Each window's log-mel features, `[num_mel_bins, 2 · max_source_positions]` row-major.
    pub windows: Vec<Vec<f32>>,
    /// The spoken language's code (`en`); detected from the first window when `None`.
    pub language: Option<String>,
    /// Transcribe or translate.
    pub task: Task,
    /// Decode with timestamps (for segments).
    pub timestamps: bool,
}

/// What the model made of each window, in order.
#[derive(Debug, Clone)]
pub struct TranscriptionResult {
    /// The language decoded in (the request's or the detected one; `None` for a model without
    /// language tokens).
    pub language: Option<String>,
    /// Each window's tokens.
    pub windows: Vec<Decoded>,
    /// The special tokens of the model, for reading the tokens.
    pub special: SpecialTokens,
}

/// Why a transcription failed.
#[derive(Debug, thiserror::Error)]
pub enum TranscriptionError {
    /// The checkpoint could not be read or built.
    #[error("loading the Whisper model: {0}")]
    Load(String),
    /// The request does not fit the model (an unknown language, features of the wrong size).
    #[error("{0}")]
    Invalid(String),
    /// The model failed while running.
    #[error("transcribing: {0}")]
    Run(String),
}

/// Drops the Whisper kept on this thread (the MLX worker), if any.
pub fn release() {
    WHISPER.with(|cell| cell.borrow_mut().take());
}

/// Runs `job` on this thread, which must be the MLX worker.
pub fn run(job: &TranscriptionJob) -> Result<TranscriptionResult, TranscriptionError> {
    WHISPER.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(dir, _, _)| dir != &job.dir) {
            *slot = None;
            *slot = Some(load(&job.dir)?);
        }
        let Some((_, model, special)) = slot.as_ref() else {
            return Err(TranscriptionError::Load("no model".into()));
        };
        transcribe(model, special, job)
    })
}

fn load(dir: &Path) -> Result<(PathBuf, Whisper, SpecialTokens), TranscriptionError> {
    let failed = |e: &dyn std::fmt::Display| TranscriptionError::Load(e.to_string());
    let model = Whisper::load(dir, Some(Dtype::F32)).map_err(|e| failed(&e))?;
    let generation = std::fs::read(dir.join("generation_config.json")).map_err(|e| failed(&e))?;
    let generation: serde_json::Value =
        serde_json::from_slice(&generation).map_err(|e| failed(&e))?;
    let special =
        SpecialTokens::from_generation_config(&generation, model.decoder().config().vocab_size)
            .map_err(|e| failed(&e))?;
    Ok((dir.to_path_buf(), model, special))
}

fn transcribe(
    model: &Whisper,
    special: &SpecialTokens,
    job: &TranscriptionJob,
) -> Result<TranscriptionResult, TranscriptionError> {
    let run = |e: nn::Error| match e {
        nn::Error::InvalidInput(message) => TranscriptionError::Invalid(message),
        other => TranscriptionError::Run(other.to_string()),
    };
    let bins = model.encoder().config().num_mel_bins;
    let frames = model.encoder().config().input_frames();
    let decoder_positions = model.decoder().config().max_target_positions;
    let mut language = job.language.clone();
    let mut windows = Vec::with_capacity(job.windows.len());
    for (k, features) in job.windows.iter().enumerate() {
        if features.len() != bins * frames {
            return Err(TranscriptionError::Invalid(format!(
                "window {k} holds {} features, the model reads {bins} x {frames}",
                features.len()
            )));
        }
        let features = Array::from_slice(features, &[1, bins as i32, frames as i32])
            .map_err(|e| TranscriptionError::Run(e.to_string()))?;
        let cross = model.encode(&features).map_err(run)?;
        if language.is_none() {
            language = whisper_decoding::detect_language(model, &cross, special).map_err(run)?;
        }
        let prompt = special
            .prompt(language.as_deref(), job.task, job.timestamps)
            .map_err(run)?;
        // OpenAI's whisper samples at most half the decoder's context per window.
        let max_new = decoder_positions / 2;
        windows.push(
            whisper_decoding::greedy(model, &cross, special, &prompt, job.timestamps, max_new)
                .map_err(run)?,
        );
    }
    Ok(TranscriptionResult {
        language,
        windows,
        special: special.clone(),
    })
}
