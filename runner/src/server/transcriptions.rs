//! `POST /v1/audio/transcriptions`, OpenAI's speech-to-text route, for a Whisper checkpoint
//! (issue 21). The multipart form carries `file` (a WAV), `model`, and optionally `language`
//! (a code such as `en`; detected from the first window when absent), `response_format`
//! (`json`, the default, `text`, `verbose_json`, `srt` or `vtt`), `temperature` (only 0:
//! greedy decoding) and `timestamp_granularities[]` (only `segment`).
//!
//! The clip is decoded under [`media::AudioLimits`], resampled to 16 kHz and cut at pauses
//! into windows no longer than the encoder's (30 s for Whisper's checkpoints), each turned into
//! log-mel features off the async runtime; the model then decodes every window on the engine's
//! MLX worker ([`crate::engine::transcription`]). Formats with times (`verbose_json`, `srt`,
//! `vtt`) decode with timestamps and report the segments they mark, offset by where each
//! window starts in the clip.
//!
//! Not done: OpenAI's `prompt` (text that conditions the decoder) is refused rather than
//! ignored, as are word timestamps and sampling at a temperature above 0.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Json;
use axum::extract::multipart::MultipartRejection;
use axum::extract::{DefaultBodyLimit, Multipart, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use nn::audio::whisper_decoding::{self, Task};
use serde_json::{Value, json};

use crate::engine::transcription::{TranscriptionError, TranscriptionJob, TranscriptionResult};
use crate::model_name::ModelName;
use crate::server::AppState;
use crate::server::error::ApiError;
use crate::server::openai::OpenAiError;
use crate::store::{Manifest, Store};

/// The largest form accepted: OpenAI's limit on the uploaded file.
pub const MAX_FORM_BYTES: usize = 25 << 20;

/// The body limit for this route.
pub fn body_limit() -> DefaultBodyLimit {
    DefaultBodyLimit::max(MAX_FORM_BYTES)
}

/// How the transcript is written back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Text,
    VerboseJson,
    Srt,
    Vtt,
}

impl Format {
    fn parse(name: &str) -> Result<Format, ApiError> {
        Ok(match name {
            "json" => Format::Json,
            "text" => Format::Text,
            "verbose_json" => Format::VerboseJson,
            "srt" => Format::Srt,
            "vtt" => Format::Vtt,
            other => {
                return Err(bad(format!(
                    "`response_format` `{other}` is not one of json, text, verbose_json, srt, vtt"
                )));
            }
        })
    }

    fn timestamps(self) -> bool {
        matches!(self, Format::VerboseJson | Format::Srt | Format::Vtt)
    }
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message)
}

/// The form's fields.
struct Form {
    file: Option<Vec<u8>>,
    model: Option<String>,
    language: Option<String>,
    format: Format,
}

async fn read_form(multipart: &mut Multipart) -> Result<Form, ApiError> {
    let malformed = |e: axum::extract::multipart::MultipartError| {
        ApiError::new(
            e.status(),
            format!("malformed multipart form: {}", e.body_text()),
        )
    };
    let mut form = Form {
        file: None,
        model: None,
        language: None,
        format: Format::Json,
    };
    while let Some(field) = multipart.next_field().await.map_err(malformed)? {
        let name = field.name().unwrap_or_default().to_string();
        if name == "file" {
            form.file = Some(field.bytes().await.map_err(malformed)?.to_vec());
            continue;
        }
        let value = field.text().await.map_err(malformed)?;
        match name.as_str() {
            "model" => form.model = Some(value),
            "language" if !value.is_empty() => form.language = Some(value),
            "language" => {}
            "response_format" => form.format = Format::parse(&value)?,
            "temperature" => {
                let t: f32 = value
                    .trim()
                    .parse()
                    .map_err(|_| bad(format!("`temperature` `{value}` is not a number")))?;
                if t != 0.0 {
                    return Err(bad(
                        "only `temperature` 0 (greedy decoding) is supported for transcription",
                    ));
                }
            }
            "timestamp_granularities[]" | "timestamp_granularities" => {
                if value != "segment" {
                    return Err(bad(format!(
                        "timestamp granularity `{value}` is not supported (only `segment`)"
                    )));
                }
            }
            "prompt" if value.is_empty() => {}
            "prompt" => {
                return Err(bad("`prompt` is not supported for transcription yet"));
            }
            // OpenAI's other fields (`stream`, `include[]`, `chunking_strategy`) change nothing
            // a client can check here; unknown fields are refused so a typo is seen.
            "stream" if value == "false" => {}
            other => return Err(bad(format!("unknown form field `{other}`"))),
        }
    }
    Ok(form)
}

/// A clip's windows, ready for the model.
struct Windows {
    features: Vec<Vec<f32>>,
    /// Where each window starts in the clip, seconds.
    offsets: Vec<f64>,
    /// The clip's length, seconds.
    duration: f64,
    /// The encoder's window, seconds.
    window: f64,
}

/// The clip's windows: decoded under the limits, at 16 kHz, cut at pauses to fit the
/// encoder's window, as log-mel features of the checkpoint's size.
fn windows(config: &Value, bytes: &[u8]) -> Result<Windows, ApiError> {
    let invalid = |e: media::Error| bad(format!("invalid audio: {e}"));
    let encoder = nn::audio::whisper::Config::from_json(config)
        .map_err(|e| ApiError::internal(format!("the model's config: {e}")))?;
    let base = media::LogMelConfig::whisper(encoder.num_mel_bins);
    let samples = encoder.input_frames() * base.hop_length;
    let rate = base.sampling_rate as usize;
    if !samples.is_multiple_of(rate) {
        return Err(ApiError::internal(format!(
            "the encoder's window of {samples} samples is not a whole number of seconds"
        )));
    }
    let features = media::LogMelConfig {
        chunk_length: samples / rate,
        ..base
    };
    let window = features.chunk_length as f64;
    let limits = media::AudioLimits::default();
    let clip = media::prepare_audio(bytes, &limits, base.sampling_rate)
        .map_err(invalid)?
        .clip;
    let ranges =
        media::split_ranges(&clip, window, &media::SplitConfig::default()).map_err(invalid)?;
    let mut out = Windows {
        features: Vec::with_capacity(ranges.len()),
        offsets: Vec::with_capacity(ranges.len()),
        duration: clip.duration_seconds(),
        window,
    };
    for range in ranges {
        out.offsets.push(range.start as f64 / rate as f64);
        let piece = media::AudioClip {
            samples: clip.samples[range].to_vec(),
            sample_rate: clip.sample_rate,
        };
        out.features.push(
            media::log_mel(&piece, &features, &limits)
                .map_err(invalid)?
                .features,
        );
    }
    if out.features.is_empty() {
        return Err(bad("invalid audio: the clip holds no samples"));
    }
    Ok(out)
}

/// One segment of the transcript, in the clip's time.
struct Segment {
    start: f64,
    end: f64,
    text: String,
    tokens: Vec<u32>,
    avg_logprob: f64,
    seek: usize,
}

/// What a request needs of a Whisper model's files: where they are, its config and its
/// tokenizer.
pub struct PreparedModel {
    dir: PathBuf,
    config: Value,
    tokenizer: tokenizer::Tokenizer,
}

/// The model transcriptions last used, prepared: materializing a model's folder hashes every
/// blob (seconds for a large Whisper) and reading its tokenizer takes a moment, so requests
/// for the same model (the same manifest) reuse them.
#[derive(Default)]
pub struct PreparedModels(Mutex<Option<(String, Arc<PreparedModel>)>>);

impl PreparedModels {
    fn get_or_prepare(
        &self,
        store: &Store,
        manifest: &Manifest,
    ) -> Result<Arc<PreparedModel>, ApiError> {
        let digest = manifest.digest();
        let mut last = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((kept, model)) = last.as_ref()
            && *kept == digest
        {
            return Ok(model.clone());
        }
        let dir = store.materialize(manifest)?;
        let config: Value = std::fs::read(dir.join("config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| ApiError::internal("the model's config.json is unreadable"))?;
        let tokenizer = tokenizer::Tokenizer::from_hf_dir(&dir)
            .map_err(|e| ApiError::internal(format!("the model's tokenizer: {e}")))?;
        let model = Arc::new(PreparedModel {
            dir,
            config,
            tokenizer,
        });
        *last = Some((digest, model.clone()));
        Ok(model)
    }
}

/// `POST /v1/audio/transcriptions`.
pub async fn create(
    State(state): State<AppState>,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Response, OpenAiError> {
    let mut multipart = multipart.map_err(|e| {
        ApiError::new(
            e.status(),
            format!("expected a multipart form: {}", e.body_text()),
        )
    })?;
    let form = read_form(&mut multipart).await?;
    let model = form.model.ok_or_else(|| bad("the form has no `model`"))?;
    let name = ModelName::parse(&model)?;
    let entry = state.store.get(&name)?;
    if !crate::capabilities::transcribes(&entry.manifest.details.capabilities) {
        return Err(bad(format!("model `{model}` does not transcribe audio")).into());
    }
    let file = form.file.ok_or_else(|| bad("the form has no `file`"))?;
    let store = state.store.clone();
    let manifest = entry.manifest.clone();
    let models = state.transcription_models.clone();
    let prepared = tokio::task::spawn_blocking(move || -> Result<_, ApiError> {
        let model = models.get_or_prepare(&store, &manifest)?;
        let windows = windows(&model.config, &file)?;
        Ok((model, windows))
    })
    .await
    .map_err(|e| ApiError::task_failed("preparing the audio", &e))??;
    let (model, windows) = prepared;

    let job = TranscriptionJob {
        dir: model.dir.clone(),
        windows: windows.features.clone(),
        language: form.language,
        task: Task::Transcribe,
        timestamps: form.format.timestamps(),
    };
    let result = state
        .keeper
        .engine()
        .transcribe(job)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| match e {
            TranscriptionError::Invalid(message) => bad(message),
            other => ApiError::internal(other.to_string()),
        })?;
    Ok(respond(form.format, &model.tokenizer, &windows, &result)?)
}

fn respond(
    format: Format,
    tokenizer: &tokenizer::Tokenizer,
    windows: &Windows,
    result: &TranscriptionResult,
) -> Result<Response, ApiError> {
    let decode = |tokens: &[u32]| {
        tokenizer
            .decode(tokens, true)
            .map_err(|e| ApiError::internal(format!("decoding the transcript: {e}")))
    };
    let special = &result.special;
    let mut text = String::new();
    let mut segments = Vec::new();
    for (k, decoded) in result.windows.iter().enumerate() {
        let words: Vec<u32> = decoded
            .tokens
            .iter()
            .copied()
            .filter(|t| !special.is_timestamp(*t))
            .collect();
        text.push_str(&decode(&words)?);
        if !format.timestamps() {
            continue;
        }
        let offset = windows.offsets.get(k).copied().unwrap_or(0.0);
        let length = windows.window as f32;
        for s in whisper_decoding::segments(decoded, special, length) {
            let avg_logprob = if s.logprobs.is_empty() {
                0.0
            } else {
                s.logprobs.iter().map(|&l| f64::from(l)).sum::<f64>() / s.logprobs.len() as f64
            };
            segments.push(Segment {
                start: offset + f64::from(s.start),
                end: (offset + f64::from(s.end)).min(windows.duration),
                text: decode(&s.tokens)?,
                tokens: s.tokens,
                avg_logprob,
                seek: (offset * 100.0).round() as usize,
            });
        }
    }
    let text = text.trim().to_string();
    let response = match format {
        Format::Json => Json(json!({ "text": text })).into_response(),
        Format::Text => {
            ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
        }
        Format::VerboseJson => {
            let segments: Vec<Value> = segments
                .iter()
                .enumerate()
                .map(|(id, s)| {
                    json!({
                        "id": id,
                        "seek": s.seek,
                        "start": round(s.start),
                        "end": round(s.end),
                        "text": s.text,
                        "tokens": s.tokens,
                        "temperature": 0.0,
                        "avg_logprob": s.avg_logprob,
                    })
                })
                .collect();
            Json(json!({
                "task": Task::Transcribe.name(),
                "language": result.language,
                "duration": round(windows.duration),
                "text": text,
                "segments": segments,
            }))
            .into_response()
        }
        Format::Srt | Format::Vtt => {
            let vtt = format == Format::Vtt;
            let mut out = String::from(if vtt { "WEBVTT\n\n" } else { "" });
            for (id, s) in segments.iter().enumerate() {
                if !vtt {
                    out.push_str(&format!("{}\n", id + 1));
                }
                out.push_str(&format!(
                    "{} --> {}\n{}\n\n",
                    clock(s.start, vtt),
                    clock(s.end, vtt),
                    s.text.trim()
                ));
            }
            ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], out).into_response()
        }
    };
    Ok(response)
}

/// Seconds to the millisecond, so a timestamp of 0.66 reads as 0.66 and not 0.6600000262
/// (f32 multiples of `whisper_decoding::SECONDS_PER_TIMESTAMP`).
fn round(seconds: f64) -> f64 {
    (seconds * 1000.0).round() / 1000.0
}

/// `HH:MM:SS,mmm` (SRT) or `HH:MM:SS.mmm` (VTT).
fn clock(seconds: f64, vtt: bool) -> String {
    let ms = (seconds.max(0.0) * 1000.0).round() as u64;
    let (h, m, s, ms) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    format!("{h:02}:{m:02}:{s:02}{}{ms:03}", if vtt { '.' } else { ',' })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_and_rounding() {
        assert_eq!(clock(3723.456, false), "01:02:03,456");
        assert_eq!(clock(0.66, true), "00:00:00.660");
        assert_eq!(round(0.660_000_026), 0.66);
        assert_eq!(round(1.3114), 1.311);
    }

    #[test]
    fn formats() {
        assert_eq!(Format::parse("verbose_json").unwrap(), Format::VerboseJson);
        assert!(Format::parse("xml").is_err());
        assert!(Format::VerboseJson.timestamps() && !Format::Text.timestamps());
    }
}
