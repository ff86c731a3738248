//! Image and audio intake: untrusted bytes in, model-ready host data and a cache identity out.
//!
//! # Overview
//!
//! - [`detect`] names the format from the first bytes (PNG, JPEG, WebP, GIF, WAV); names and
//!   declared MIME types are never trusted.
//! - Images: [`decode_image`] reads the header, checks [`ImageLimits`] *before* any pixel buffer
//!   exists, and decodes to RGB (JPEG through libjpeg-turbo as Pillow does, first frame of a GIF,
//!   alpha over white, EXIF orientation applied). [`preprocess`] resizes (bilinear or bicubic,
//!   PIL-style antialiased when shrinking), fits ([`Fit`]: stretch, center-crop, pad), rescales and
//!   normalizes per an [`ImageProcessorConfig`] into channel-first [`PixelValues`]. [`tile_grid`],
//!   [`split_tiles`] and [`smart_resize`] serve tiled and patch-aligned encoders;
//!   [`preprocess_patches`] cuts an image into the flattened patches of a dynamic-resolution
//!   encoder (Qwen2-VL, Qwen2.5-VL: [`PatchProcessorConfig`], [`PatchGrid`]).
//! - Audio: [`decode_wav`] walks the RIFF chunks itself, bounds-checked, accepting PCM 8/16/24/32,
//!   float 32/64 and `WAVE_FORMAT_EXTENSIBLE`, averages any channel count to mono, and refuses a
//!   clip over [`AudioLimits::max_seconds`] from the header alone. [`resample`] is band-limited
//!   (rubato). [`split`] cuts long clips into even chunks at quiet points. [`log_mel`] computes
//!   the log-mel features Whisper-style encoders take ([`LogMelConfig`], as
//!   `WhisperFeatureExtractor` does), under the same limits.
//! - [`MediaId`] hashes bytes plus preprocessing shape for the prefix cache.
//! - [`split_prompt`] turns `[img-N]` tags into [`Segment`]s; [`validate_expansions`] checks the
//!   token ranges a model expands them into.
//! - Server intake: [`decode_ollama_image`], [`decode_image_url`], [`decode_input_audio`] and
//!   [`Capabilities::require`]; the HTTP wiring belongs to `runner`.
//!
//! Every malformed, truncated or lying input is an [`Error`] naming the problem, never a panic.
//!
//! # Example
//!
//! ```
//! use media::{AudioClip, AudioLimits, decode_wav, resample, split};
//!
//! // A 1 s, 48 kHz mono 16-bit WAV of silence, built by hand.
//! let frames = 48_000u32;
//! let mut wav = Vec::new();
//! wav.extend_from_slice(b"RIFF");
//! wav.extend_from_slice(&(36 + frames * 2).to_le_bytes());
//! wav.extend_from_slice(b"WAVEfmt ");
//! wav.extend_from_slice(&16u32.to_le_bytes());
//! wav.extend_from_slice(&1u16.to_le_bytes()); // PCM
//! wav.extend_from_slice(&1u16.to_le_bytes()); // mono
//! wav.extend_from_slice(&48_000u32.to_le_bytes());
//! wav.extend_from_slice(&96_000u32.to_le_bytes()); // byte rate
//! wav.extend_from_slice(&2u16.to_le_bytes()); // block align
//! wav.extend_from_slice(&16u16.to_le_bytes()); // bits
//! wav.extend_from_slice(b"data");
//! wav.extend_from_slice(&(frames * 2).to_le_bytes());
//! wav.resize(wav.len() + frames as usize * 2, 0);
//!
//! let clip = decode_wav(&wav, &AudioLimits::default())?;
//! let at_16k: AudioClip = resample(&clip, 16_000)?;
//! assert_eq!(at_16k.samples.len(), 16_000);
//! assert_eq!(split(&at_16k, 0.25)?.len(), 4);
//! # Ok::<(), media::Error>(())
//! ```

#![deny(missing_docs)]

// Clip type and limits; wav.rs (RIFF walk, decode, downmix), resample.rs, split.rs,
// features.rs (Whisper's log-mel spectrogram).
mod audio;
// Format by signature.
mod detect;
// The one error enum and the Modality it names.
mod error;
// MediaId: SHA-256 of bytes and preprocessing shape.
mod identity;
// decode.rs (limits, header first, EXIF), jpeg.rs (libjpeg-turbo pixels), preprocess.rs (fit,
// normalize), resize.rs, tiling.rs, pan_and_scan.rs (Gemma 3's crops of long images).
mod image;
// Base64, data URLs, input_audio, capability check: what the runner's handlers call.
mod intake;
// prepare_image / prepare_audio: the one-call common path.
mod prepare;
// [img-N] segments and expansion-range validation.
mod prompt;

pub use crate::audio::features::{LogMel, LogMelConfig, log_mel};
pub use crate::audio::resample::resample;
pub use crate::audio::split::{SplitConfig, split, split_ranges};
pub use crate::audio::wav::{SampleEncoding, WavHeader, decode_wav, read_wav_header};
pub use crate::audio::{AudioClip, AudioLimits};
pub use crate::detect::{AudioFormat, ImageFormat, MediaFormat, detect};
pub use crate::error::{Error, Modality, Result};
pub use crate::identity::MediaId;
pub use crate::image::decode::{ImageLimits, decode_image, image_dimensions, upright_dimensions};
pub use crate::image::pan_and_scan::{CropRect, PanAndScan, crop};
pub use crate::image::patches::{
    ImagePatches, PatchGrid, PatchProcessorConfig, patchify, preprocess_patches,
};
pub use crate::image::preprocess::{
    Fit, ImageProcessorConfig, PixelValues, normalize, preprocess, resize_to_fit,
};
pub use crate::image::resize::{Resample, ResizeBackend};
pub use crate::image::tiling::{TileGrid, smart_resize, split_tiles, tile_grid};
pub use crate::intake::{
    Capabilities, DEFAULT_MAX_PAYLOAD_BYTES, decode_base64, decode_image_url, decode_input_audio,
    decode_ollama_image,
};
pub use crate::prepare::{
    PreparedAudio, PreparedImage, PreparedPatches, prepare_audio, prepare_image,
    prepare_image_patches,
};
pub use crate::prompt::{Segment, media_segment_count, split_prompt, validate_expansions};
/// The decoded image type [`decode_image`] returns, from the `image` crate.
pub use ::image::RgbImage;
