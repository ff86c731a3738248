//! Detection by content: the first bytes decide the format, never a file name or a MIME type
//! a client claims.

use crate::error::{Error, Modality, Result};

/// Image containers this crate decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    /// PNG (any bit depth and colour type the `image` crate reads).
    Png,
    /// Baseline or progressive JPEG.
    Jpeg,
    /// WebP, lossy or lossless.
    WebP,
    /// GIF; only the first frame is used.
    Gif,
}

impl ImageFormat {
    /// A short lowercase name for messages.
    pub fn name(self) -> &'static str {
        match self {
            ImageFormat::Png => "png",
            ImageFormat::Jpeg => "jpeg",
            ImageFormat::WebP => "webp",
            ImageFormat::Gif => "gif",
        }
    }
}

/// Audio containers this crate decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AudioFormat {
    /// RIFF/WAVE.
    Wav,
}

/// What the bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MediaFormat {
    /// A still image.
    Image(ImageFormat),
    /// An audio clip.
    Audio(AudioFormat),
}

impl MediaFormat {
    /// Image or audio.
    pub fn modality(self) -> Modality {
        match self {
            MediaFormat::Image(_) => Modality::Image,
            MediaFormat::Audio(_) => Modality::Audio,
        }
    }
}

/// Identifies the format from the leading bytes.
///
/// Fails with [`Error::Empty`] on no bytes and [`Error::UnrecognizedFormat`] when no signature
/// matches. A match only means the signature fits; the decoders still validate everything else.
pub fn detect(bytes: &[u8]) -> Result<MediaFormat> {
    if bytes.is_empty() {
        return Err(Error::Empty);
    }
    let riff_form =
        |form: &[u8; 4]| bytes.len() >= 12 && &bytes[0..4] == b"RIFF" && &bytes[8..12] == form;
    let format = if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        MediaFormat::Image(ImageFormat::Png)
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        MediaFormat::Image(ImageFormat::Jpeg)
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        MediaFormat::Image(ImageFormat::Gif)
    } else if riff_form(b"WEBP") {
        MediaFormat::Image(ImageFormat::WebP)
    } else if riff_form(b"WAVE") {
        MediaFormat::Audio(AudioFormat::Wav)
    } else {
        let magic = bytes.iter().take(12).map(|b| format!("{b:02x}")).collect();
        return Err(Error::UnrecognizedFormat { magic });
    };
    Ok(format)
}
