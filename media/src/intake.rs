//! The crate side of server intake: Ollama `images` (base64 strings), OpenAI `image_url` (base64
//! `data:` URLs) and `input_audio` (`{data, format}`) turned into checked bytes, and the check
//! that the model accepts the modality at all. HTTP parsing and status codes live in `runner`.

use base64::Engine;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

use crate::detect::{MediaFormat, detect};
use crate::error::{Error, Modality, Result};

/// Largest decoded payload accepted by default: ten minutes of 48 kHz stereo 32-bit float WAV
/// is 230 MB, so 256 MiB admits any clip the audio limits would accept.
pub const DEFAULT_MAX_PAYLOAD_BYTES: u64 = 256 << 20;

const STANDARD: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
const URL_SAFE: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Decodes a base64 payload (standard or URL-safe alphabet, padding optional, line breaks
/// ignored) after checking that the decoded size fits `max_bytes`.
///
/// Fails with [`Error::Empty`], [`Error::PayloadTooLarge`] (checked before decoding) or
/// [`Error::Base64`].
pub fn decode_base64(payload: &str, max_bytes: u64) -> Result<Vec<u8>> {
    let payload = payload.trim();
    if payload.is_empty() {
        return Err(Error::Empty);
    }
    let implied = (payload.len() as u64).div_ceil(4) * 3;
    if implied > max_bytes.saturating_add(3) {
        return Err(Error::PayloadTooLarge {
            len: implied,
            limit: max_bytes,
        });
    }
    let cleaned: std::borrow::Cow<'_, str> = if payload.bytes().any(|b| b.is_ascii_whitespace()) {
        payload
            .chars()
            .filter(|c| !c.is_ascii_whitespace())
            .collect::<String>()
            .into()
    } else {
        payload.into()
    };
    let engine = if cleaned.contains(['-', '_']) {
        &URL_SAFE
    } else {
        &STANDARD
    };
    let bytes = engine
        .decode(cleaned.as_bytes())
        .map_err(|e| Error::Base64(e.to_string()))?;
    if bytes.is_empty() {
        return Err(Error::Empty);
    }
    if bytes.len() as u64 > max_bytes {
        return Err(Error::PayloadTooLarge {
            len: bytes.len() as u64,
            limit: max_bytes,
        });
    }
    Ok(bytes)
}

/// An entry of Ollama's `images` array: base64 bytes that must be an image.
pub fn decode_ollama_image(payload: &str, max_bytes: u64) -> Result<Vec<u8>> {
    let bytes = decode_base64(payload, max_bytes)?;
    expect_modality(&bytes, Modality::Image)?;
    Ok(bytes)
}

/// OpenAI `image_url.url`: a `data:[<type>];base64,<data>` URL whose content is an image.
///
/// The declared media type is not trusted; the bytes are. Remote `http(s)` URLs are refused:
/// the server does not fetch on a client's behalf. Fails with [`Error::UnsupportedUrl`] for
/// anything but a base64 data URL, and as [`decode_base64`] and [`detect`] do.
pub fn decode_image_url(url: &str, max_bytes: u64) -> Result<Vec<u8>> {
    let url = url.trim();
    let Some(rest) = strip_prefix_ignore_case(url, "data:") else {
        let scheme = url.split(':').next().unwrap_or_default();
        return Err(Error::UnsupportedUrl(
            if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") {
                "remote URLs are not fetched; send the image as a base64 data URL".into()
            } else {
                "expected a data: URL".into()
            },
        ));
    };
    let Some((meta, data)) = rest.split_once(',') else {
        return Err(Error::UnsupportedUrl(
            "data URL has no ',' before its payload".into(),
        ));
    };
    let is_base64 = meta
        .rsplit(';')
        .next()
        .is_some_and(|p| p.eq_ignore_ascii_case("base64"));
    if !is_base64 {
        return Err(Error::UnsupportedUrl(
            "data URL is not ;base64 encoded".into(),
        ));
    }
    let bytes = decode_base64(data, max_bytes)?;
    expect_modality(&bytes, Modality::Image)?;
    Ok(bytes)
}

/// OpenAI `input_audio`: base64 `data` in the declared `format`, which must be `"wav"` and must
/// agree with the content.
pub fn decode_input_audio(data: &str, format: &str, max_bytes: u64) -> Result<Vec<u8>> {
    if !format.trim().eq_ignore_ascii_case("wav") {
        return Err(Error::UnsupportedAudioFormat(format.to_string()));
    }
    let bytes = decode_base64(data, max_bytes)?;
    expect_modality(&bytes, Modality::Audio)?;
    Ok(bytes)
}

/// Which inputs a model takes besides text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// Accepts images.
    pub vision: bool,
    /// Accepts audio.
    pub audio: bool,
}

impl Capabilities {
    /// Whether `modality` is accepted.
    pub fn supports(&self, modality: Modality) -> bool {
        match modality {
            Modality::Image => self.vision,
            Modality::Audio => self.audio,
        }
    }

    /// Fails with [`Error::MissingCapability`] naming `model` when `modality` is not accepted.
    pub fn require(&self, model: &str, modality: Modality) -> Result<()> {
        if self.supports(modality) {
            Ok(())
        } else {
            Err(Error::MissingCapability {
                model: model.to_string(),
                modality,
            })
        }
    }
}

fn expect_modality(bytes: &[u8], expected: Modality) -> Result<MediaFormat> {
    let format = detect(bytes)?;
    if format.modality() != expected {
        return Err(Error::WrongModality {
            expected,
            found: format.modality(),
        });
    }
    Ok(format)
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}
