//! Greedy decoding of one 30 s window with Whisper, as transformers' `generate` does it for a
//! short-form input: a forced prompt (`<|startoftranscript|>`, the language, the task, and
//! `<|notimestamps|>` unless timestamps are wanted), then at every step the logits are ruled
//! (the generation config's `suppress_tokens` always, its `begin_suppress_tokens` at the first
//! step, and with timestamps the timestamp rules) and the most likely token is taken, until
//! `<|endoftext|>` or the length limit.
//!
//! The special tokens' ids come from the checkpoint's `generation_config.json`
//! ([`SpecialTokens`]); timestamp tokens are the ids after `<|notimestamps|>`, one per 0.02 s.
//!
//! References: transformers 5.24, `models/whisper/generation_whisper.py` (prompt and
//! processors), `generation/logits_process.py` (`SuppressTokensLogitsProcessor`,
//! `SuppressTokensAtBeginLogitsProcessor`, `WhisperTimeStampLogitsProcessor`); OpenAI's
//! `whisper/decoding.py` (`ApplyTimestampRules`, where the rules come from).

use std::collections::BTreeMap;

use mlx::{Array, Dtype};
use serde_json::Value;

use crate::audio::whisper_decoder::CrossAttentionStates;
use crate::audio::whisper_model::Whisper;
use crate::{Error, Result};

/// Seconds one timestamp token stands for.
pub const SECONDS_PER_TIMESTAMP: f32 = 0.02;

/// What the decoder is asked to do with the audio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// Write down what is said, in its language (`<|transcribe|>`).
    Transcribe,
    /// Write it down in English (`<|translate|>`).
    Translate,
}

impl Task {
    /// The name transformers and OpenAI use: `transcribe` or `translate`.
    pub fn name(self) -> &'static str {
        match self {
            Task::Transcribe => "transcribe",
            Task::Translate => "translate",
        }
    }
}

/// The ids of Whisper's special tokens and the generation config's rules, from a checkpoint's
/// `generation_config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecialTokens {
    /// `decoder_start_token_id`: `<|startoftranscript|>`.
    pub start_of_transcript: u32,
    /// `eos_token_id`: `<|endoftext|>`.
    pub end_of_text: u32,
    /// `no_timestamps_token_id`: `<|notimestamps|>`; the timestamp tokens follow it.
    pub no_timestamps: u32,
    /// `lang_to_id`, keyed by language code (`en` for `<|en|>`).
    pub languages: BTreeMap<String, u32>,
    /// `task_to_id`: `transcribe` and `translate`.
    pub tasks: BTreeMap<String, u32>,
    /// `suppress_tokens`: never generated.
    pub suppress_tokens: Vec<u32>,
    /// `begin_suppress_tokens`: not generated first.
    pub begin_suppress_tokens: Vec<u32>,
    /// `max_initial_timestamp_index`: the latest timestamp a timestamped transcript may open
    /// with, in timestamp steps.
    pub max_initial_timestamp_index: Option<u32>,
}

impl SpecialTokens {
    /// Reads the ids from `generation` (a `generation_config.json`); each must be below
    /// `vocab_size`. A config without the ids Whisper decoding needs is an error naming them.
    pub fn from_generation_config(generation: &Value, vocab_size: usize) -> Result<SpecialTokens> {
        let id = |value: &Value, what: &str| -> Result<u32> {
            value
                .as_u64()
                .filter(|&n| n < vocab_size as u64)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    Error::Config(format!(
                        "generation config: `{what}` = {value} is not a token id below {vocab_size}"
                    ))
                })
        };
        let required = |key: &str| -> Result<u32> {
            match generation.get(key) {
                // transformers allows a list of end ids; Whisper's is one.
                Some(Value::Array(ids)) if ids.len() == 1 => id(&ids[0], key),
                Some(v) => id(v, key),
                None => Err(Error::Config(format!(
                    "generation config: `{key}` is missing"
                ))),
            }
        };
        let ids = |key: &str| -> Result<Vec<u32>> {
            match generation.get(key) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(Value::Array(list)) => list.iter().map(|v| id(v, key)).collect(),
                Some(v) => Err(Error::Config(format!(
                    "generation config: `{key}` must be a list of ids, got {v}"
                ))),
            }
        };
        let map = |key: &str| -> Result<BTreeMap<String, u32>> {
            match generation.get(key) {
                None | Some(Value::Null) => Ok(BTreeMap::new()),
                Some(Value::Object(entries)) => entries
                    .iter()
                    .map(|(name, v)| {
                        let name = name.trim_start_matches("<|").trim_end_matches("|>");
                        Ok((name.to_string(), id(v, key)?))
                    })
                    .collect(),
                Some(v) => Err(Error::Config(format!(
                    "generation config: `{key}` must map names to ids, got {v}"
                ))),
            }
        };
        let no_timestamps = required("no_timestamps_token_id")?;
        if no_timestamps as usize + 1 >= vocab_size {
            return Err(Error::Config(
                "generation config: no timestamp tokens follow `no_timestamps_token_id`".into(),
            ));
        }
        let max_initial_timestamp_index =
            match generation.get("max_initial_timestamp_index") {
                None | Some(Value::Null) => None,
                Some(v) => Some(v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(
                    || {
                        Error::Config(format!(
                            "generation config: `max_initial_timestamp_index` = {v}"
                        ))
                    },
                )?),
            };
        Ok(SpecialTokens {
            start_of_transcript: required("decoder_start_token_id")?,
            end_of_text: required("eos_token_id")?,
            no_timestamps,
            languages: map("lang_to_id")?,
            tasks: map("task_to_id")?,
            suppress_tokens: ids("suppress_tokens")?,
            begin_suppress_tokens: ids("begin_suppress_tokens")?,
            max_initial_timestamp_index,
        })
    }

    /// The first timestamp token, `<|0.00|>`.
    pub fn timestamp_begin(&self) -> u32 {
        self.no_timestamps + 1
    }

    /// Whether `token` is a timestamp.
    pub fn is_timestamp(&self, token: u32) -> bool {
        token >= self.timestamp_begin()
    }

    /// The forced prompt: `<|startoftranscript|>`, then the language's token when `language`
    /// is given (a code such as `en`, which the checkpoint must know), the task's token when
    /// the checkpoint has task tokens, and `<|notimestamps|>` unless `timestamps`.
    pub fn prompt(&self, language: Option<&str>, task: Task, timestamps: bool) -> Result<Vec<u32>> {
        let mut prompt = vec![self.start_of_transcript];
        if let Some(language) = language {
            let id = self.languages.get(language).ok_or_else(|| {
                Error::InvalidInput(format!("language `{language}` is not one this model knows"))
            })?;
            prompt.push(*id);
        }
        if !self.tasks.is_empty() {
            let id = self.tasks.get(task.name()).ok_or_else(|| {
                Error::InvalidInput(format!("this model does not {}", task.name()))
            })?;
            prompt.push(*id);
        }
        if !timestamps {
            prompt.push(self.no_timestamps);
        }
        Ok(prompt)
    }
}

/// The tokens of one decoded window after its prompt, without the final `<|endoftext|>`.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The generated tokens.
    pub tokens: Vec<u32>,
    /// Each token's log-probability under the ruled distribution it was taken from.
    pub logprobs: Vec<f32>,
    /// Whether decoding ended at `<|endoftext|>` (else at the length limit).
    pub finished: bool,
}

/// The most likely language of a window, among the checkpoint's language tokens: the first
/// step's logits after `<|startoftranscript|>` (what transformers' `detect_language` reads).
/// `None` when the checkpoint has no language tokens.
pub fn detect_language(
    model: &Whisper,
    cross: &CrossAttentionStates,
    special: &SpecialTokens,
) -> Result<Option<String>> {
    if special.languages.is_empty() {
        return Ok(None);
    }
    let mut cache = model.decoder().new_cache();
    let tokens = Array::from_slice(&[special.start_of_transcript as i32], &[1, 1])?;
    let logits = last_logits(&model.decoder().forward(&tokens, cross, &mut cache)?)?;
    let best = special
        .languages
        .iter()
        .filter_map(|(name, &id)| logits.get(id as usize).map(|&l| (name, l)))
        .fold(None::<(&String, f32)>, |best, (name, l)| match best {
            Some((_, b)) if b >= l => best,
            _ => Some((name, l)),
        });
    Ok(best.map(|(name, _)| name.clone()))
}

/// Greedy decoding of the window in `cross` after `prompt`, for at most `max_new_tokens`
/// tokens (and never past the decoder's `max_target_positions`), with the timestamp rules
/// when `timestamps`.
pub fn greedy(
    model: &Whisper,
    cross: &CrossAttentionStates,
    special: &SpecialTokens,
    prompt: &[u32],
    timestamps: bool,
    max_new_tokens: usize,
) -> Result<Decoded> {
    let decoder = model.decoder();
    let limit = decoder.config().max_target_positions;
    if prompt.is_empty() || prompt.len() >= limit {
        return Err(Error::InvalidInput(format!(
            "a decoder prompt of {} tokens (the decoder reads at most {limit})",
            prompt.len()
        )));
    }
    let budget = max_new_tokens.min(limit - prompt.len());
    let mut cache = decoder.new_cache();
    let mut out = Decoded {
        tokens: Vec::new(),
        logprobs: Vec::new(),
        finished: false,
    };
    let mut step_input: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    while out.tokens.len() < budget {
        let tokens = Array::from_slice(&step_input, &[1, step_input.len() as i32])?;
        let mut logits = last_logits(&decoder.forward(&tokens, cross, &mut cache)?)?;
        rule(&mut logits, special, &out.tokens, timestamps);
        let (token, logprob) = most_likely(&logits)?;
        if token == special.end_of_text {
            out.finished = true;
            break;
        }
        out.tokens.push(token);
        out.logprobs.push(logprob);
        step_input = vec![token as i32];
    }
    Ok(out)
}

/// The last position's logits of `[1, tokens, vocab]`, on the host.
fn last_logits(logits: &Array) -> Result<Vec<f32>> {
    let tokens = logits.dim(1)?;
    Ok(logits
        .slice_axis(1, tokens - 1, tokens)?
        .astype(Dtype::F32)?
        .to_vec::<f32>()?)
}

/// Sets to `-inf` what may not come next, given the tokens generated after the prompt, in
/// transformers' order: tokens suppressed at the start, tokens always suppressed, then the
/// timestamp rules (which read the logits the others left).
fn rule(logits: &mut [f32], special: &SpecialTokens, generated: &[u32], timestamps: bool) {
    let mut forbid = |id: u32| {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = f32::NEG_INFINITY;
        }
    };
    if generated.is_empty() {
        special
            .begin_suppress_tokens
            .iter()
            .for_each(|&t| forbid(t));
    }
    special.suppress_tokens.iter().for_each(|&t| forbid(t));
    if timestamps {
        timestamp_rules(logits, special, generated);
    }
}

/// Whisper's timestamp rules: `<|notimestamps|>` never; timestamps come in pairs (after a
/// lone timestamp, another or the end; after a pair, text); they never go back; the first
/// token is a timestamp no later than `max_initial_timestamp_index`; and when the timestamps
/// together are likelier than any one text token, a timestamp it is.
fn timestamp_rules(logits: &mut [f32], special: &SpecialTokens, generated: &[u32]) {
    let begin = special.timestamp_begin() as usize;
    let eos = special.end_of_text as usize;
    let vocab = logits.len();
    let begin = begin.min(vocab);
    if let Some(l) = logits.get_mut(special.no_timestamps as usize) {
        *l = f32::NEG_INFINITY;
    }
    let is_ts = |t: &u32| special.is_timestamp(*t);
    let last_was_timestamp = generated.last().is_some_and(is_ts);
    let penultimate_was_timestamp = generated.len() < 2 || is_ts(&generated[generated.len() - 2]);
    if last_was_timestamp {
        if penultimate_was_timestamp {
            logits[begin..].fill(f32::NEG_INFINITY);
        } else {
            logits[..eos.min(vocab)].fill(f32::NEG_INFINITY);
        }
    }
    // No timestamp earlier than the last one (nor equal, but to close a pair).
    let last_timestamp = generated.iter().rev().find(|t| is_ts(t)).copied();
    let earliest = match last_timestamp {
        None => begin,
        Some(t) if last_was_timestamp && !penultimate_was_timestamp => t as usize,
        Some(t) => t as usize + 1,
    };
    logits[begin..earliest.clamp(begin, vocab)].fill(f32::NEG_INFINITY);
    if generated.is_empty() {
        logits[..begin].fill(f32::NEG_INFINITY);
        if let Some(index) = special.max_initial_timestamp_index {
            let last_allowed = begin + index as usize;
            if last_allowed + 1 < vocab {
                logits[last_allowed + 1..].fill(f32::NEG_INFINITY);
            }
        }
    }
    let logprobs = log_softmax(logits);
    let timestamp_logprob = log_sum_exp(&logprobs[begin..]);
    let max_text = logprobs[..begin]
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    if timestamp_logprob > max_text {
        logits[..begin].fill(f32::NEG_INFINITY);
    }
}

/// The first most likely token and its log-probability. Fails when every token was ruled out
/// or the logits hold a NaN.
fn most_likely(logits: &[f32]) -> Result<(u32, f32)> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            return Err(Error::InvalidInput(
                "the decoder's logits hold a NaN".into(),
            ));
        }
        if best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    match best {
        Some((i, l)) if l > f32::NEG_INFINITY => {
            let logprob = l - log_sum_exp(logits);
            Ok((i as u32, logprob))
        }
        _ => Err(Error::InvalidInput(
            "the decoding rules ruled out every token".into(),
        )),
    }
}

fn log_sum_exp(xs: &[f32]) -> f32 {
    let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return max;
    }
    max + xs.iter().map(|x| (x - max).exp()).sum::<f32>().ln()
}

fn log_softmax(xs: &[f32]) -> Vec<f32> {
    let total = log_sum_exp(xs);
    xs.iter().map(|x| x - total).collect()
}

/// A stretch of a timestamped transcript: its tokens between two timestamps.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// Start, in seconds from the window's start.
    pub start: f32,
    /// End, in seconds from the window's start.
    pub end: f32,
    /// Its text tokens (no timestamps).
    pub tokens: Vec<u32>,
    /// The log-probabilities of its text tokens.
    pub logprobs: Vec<f32>,
}

/// The segments of a window decoded with timestamps: each pair of timestamps closes one (a
/// lone timestamp closes the one before and opens the next); text after the last timestamp
/// runs to `window_seconds`, and a transcript with no timestamps at all is one segment over
/// the whole window.
pub fn segments(decoded: &Decoded, special: &SpecialTokens, window_seconds: f32) -> Vec<Segment> {
    let seconds = |t: u32| (t - special.timestamp_begin()) as f32 * SECONDS_PER_TIMESTAMP;
    let mut out = Vec::new();
    let mut start: Option<f32> = None;
    let mut current = Segment {
        start: 0.0,
        end: 0.0,
        tokens: Vec::new(),
        logprobs: Vec::new(),
    };
    for (&token, &logprob) in decoded.tokens.iter().zip(&decoded.logprobs) {
        if special.is_timestamp(token) {
            let at = seconds(token).min(window_seconds);
            match start {
                Some(s) if !current.tokens.is_empty() => {
                    current.start = s;
                    current.end = at;
                    out.push(std::mem::replace(
                        &mut current,
                        Segment {
                            start: 0.0,
                            end: 0.0,
                            tokens: Vec::new(),
                            logprobs: Vec::new(),
                        },
                    ));
                    start = None;
                }
                _ => start = Some(at),
            }
        } else {
            if start.is_none() {
                start = Some(out.last().map_or(0.0, |s: &Segment| s.end));
            }
            current.tokens.push(token);
            current.logprobs.push(logprob);
        }
    }
    if !current.tokens.is_empty() {
        current.start = start.unwrap_or(0.0);
        current.end = window_seconds;
        out.push(current);
    }
    out
}
