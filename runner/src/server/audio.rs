//! Audio in a prompt, for a model that reads it: a clip sent as OpenAI `input_audio` is
//! decoded under [`media::AudioLimits`], resampled to the extractor's rate, cut at pauses into
//! segments no longer than the encoder's window ([`media::split`]), and each segment becomes
//! log-mel features and its own run of audio tokens between the family's markers
//! ([`crate::engine::prompt_media::AudioPrompt`]).

use std::sync::Arc;

use crate::engine::prompt_media::AudioPrompt;
use crate::server::request_error::RequestError;

/// The most audio clips one request may carry: each is decoded and turned into features
/// before the engine sees it.
pub const MAX_CLIPS: usize = 8;

/// One segment of a clip, ready for the encoder.
#[derive(Debug, Clone)]
pub struct Segment {
    /// Its identity: the clip's bytes, the rate and which of how many segments it is.
    pub id: media::MediaId,
    /// Its log-mel features, filling the encoder's window.
    pub features: Arc<media::LogMel>,
    /// The audio tokens it takes.
    pub tokens: usize,
}

/// The segments of the clip `bytes` under `prompt`, in order. Fails with a 400 naming the
/// problem for audio `media` refuses (truncated, lying headers, too long, not finite), for
/// a segment too short to make one audio token, and for a clip whose audio tokens alone pass
/// `context` (counted from the segments' lengths, before any features are computed).
pub fn segments(
    prompt: &AudioPrompt,
    bytes: &[u8],
    context: usize,
) -> Result<Vec<Segment>, RequestError> {
    let invalid = |e: media::Error| RequestError::invalid(format!("invalid audio: {e}"));
    let limits = media::AudioLimits::default();
    let rate = prompt.features.sampling_rate;
    let clip = media::prepare_audio(bytes, &limits, rate).map_err(invalid)?;
    let window = prompt.window_seconds();
    let pieces = if clip.clip.duration_seconds() > window {
        media::split(&clip.clip, window).map_err(invalid)?
    } else {
        vec![clip.clip]
    };
    let mut tokens = Vec::with_capacity(pieces.len());
    for (k, piece) in pieces.iter().enumerate() {
        let frames = prompt.features.valid_frames(piece.samples.len());
        let n = prompt.tokens_for_frames.get(frames).copied().unwrap_or(0);
        if n == 0 {
            return Err(RequestError::invalid(format!(
                "invalid audio: segment {k} of {:.3} s is too short to encode",
                piece.duration_seconds()
            )));
        }
        tokens.push(n);
    }
    let total: usize = tokens.iter().sum();
    if total > context {
        return Err(RequestError::invalid(format!(
            "invalid audio: its {} segments take {total} audio tokens, more than the model's \
             context of {context}",
            pieces.len()
        )));
    }
    let count = pieces.len() as u64;
    pieces
        .iter()
        .zip(tokens)
        .enumerate()
        .map(|(k, (piece, tokens))| {
            let mel = media::log_mel(piece, &prompt.features, &limits).map_err(invalid)?;
            // Segment k of n of these bytes at this rate: the same clip sent again gets the
            // same ids, so its features and its cached prefix are found.
            let id = media::MediaId::new(
                media::Modality::Audio,
                bytes,
                &[u64::from(rate), k as u64, count],
            );
            Ok(Segment {
                id,
                features: Arc::new(mel),
                tokens,
            })
        })
        .collect()
}

/// The text a clip of `segments` becomes in the prompt: per segment, the start marker, its
/// audio tokens and the end marker.
pub fn layout(prompt: &AudioPrompt, segments: &[Segment]) -> String {
    let mut text = String::new();
    for segment in segments {
        text.push_str(&prompt.start);
        for _ in 0..segment.tokens {
            text.push_str(&prompt.audio);
        }
        text.push_str(&prompt.end);
    }
    text
}
