//! One call per item for the common path: bytes in, model-ready host data and cache identity
//! out.

use crate::audio::resample::resample;
use crate::audio::wav::decode_wav;
use crate::audio::{AudioClip, AudioLimits};
use crate::error::{Modality, Result};
use crate::identity::MediaId;
use crate::image::decode::ImageLimits;
use crate::image::decode::decode_image;
use crate::image::patches::{ImagePatches, PatchProcessorConfig, preprocess_patches};
use crate::image::preprocess::{ImageProcessorConfig, PixelValues, preprocess};

/// An image ready for a vision encoder.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedImage {
    /// Normalized channel-first pixels.
    pub pixels: PixelValues,
    /// Identity of the bytes under this preprocessing.
    pub id: MediaId,
    /// Size of the decoded image before resizing, `(width, height)`.
    pub original_size: (u32, u32),
}

/// An image ready for a dynamic-resolution vision encoder: its patches and their grid.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedPatches {
    /// The flattened patches and the grid they tile.
    pub patches: ImagePatches,
    /// Identity of the bytes under this preprocessing (which fixes the grid).
    pub id: MediaId,
    /// Size of the decoded image before resizing, `(width, height)`.
    pub original_size: (u32, u32),
}

/// A clip ready for an audio encoder.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedAudio {
    /// Mono samples at the requested rate.
    pub clip: AudioClip,
    /// Identity of the bytes resampled to this rate.
    pub id: MediaId,
}

/// Decodes under `limits` and preprocesses per `config`.
pub fn prepare_image(
    bytes: &[u8],
    limits: &ImageLimits,
    config: &ImageProcessorConfig,
) -> Result<PreparedImage> {
    let rgb = decode_image(bytes, limits)?;
    let original_size = rgb.dimensions();
    let pixels = preprocess(&rgb, config)?;
    let id = config.media_id(bytes);
    Ok(PreparedImage {
        pixels,
        id,
        original_size,
    })
}

/// Decodes under `limits` and cuts into patches per `config` ([`preprocess_patches`]).
pub fn prepare_image_patches(
    bytes: &[u8],
    limits: &ImageLimits,
    config: &PatchProcessorConfig,
) -> Result<PreparedPatches> {
    let rgb = decode_image(bytes, limits)?;
    let original_size = rgb.dimensions();
    let patches = preprocess_patches(&rgb, config)?;
    let id = config.media_id(bytes);
    Ok(PreparedPatches {
        patches,
        id,
        original_size,
    })
}

/// Decodes a WAV under `limits`, downmixes to mono and resamples to `sample_rate`.
pub fn prepare_audio(
    bytes: &[u8],
    limits: &AudioLimits,
    sample_rate: u32,
) -> Result<PreparedAudio> {
    let decoded = decode_wav(bytes, limits)?;
    let clip = resample(&decoded, sample_rate)?;
    let id = MediaId::new(Modality::Audio, bytes, &[u64::from(sample_rate)]);
    Ok(PreparedAudio { clip, id })
}
