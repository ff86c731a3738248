//! WAV decoding by a bounds-checked RIFF chunk walk: PCM 8/16/24/32-bit integer, 32/64-bit
//! float, `WAVE_FORMAT_EXTENSIBLE`, any channel count averaged to mono.
//!
//! The walk is ours rather than `hound`'s so that every claimed size is compared with the bytes
//! actually present, and the clip's duration is checked against the limits, before a single
//! sample buffer is allocated.

use std::ops::Range;

use crate::audio::{AudioClip, AudioLimits};
use crate::detect::{MediaFormat, detect};
use crate::error::{Error, Modality, Result};

const WAVE_FORMAT_PCM: u16 = 0x0001;
const WAVE_FORMAT_IEEE_FLOAT: u16 = 0x0003;
const WAVE_FORMAT_EXTENSIBLE: u16 = 0xFFFE;
/// Largest accepted magnitude of a float sample (full scale is 1.0). Float WAVs may go a little
/// over full scale; values 60 dB over are garbage, and huge ones would overflow the resampler's
/// FFT into NaN.
pub(crate) const MAX_SAMPLE_MAGNITUDE: f64 = 1024.0;
/// Bytes 2..16 of every `KSDATAFORMAT_SUBTYPE_*` GUID derived from a format tag.
const SUBTYPE_GUID_TAIL: [u8; 14] = [
    0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71,
];

/// How one sample is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleEncoding {
    /// Unsigned 8-bit, 128 is silence.
    PcmU8,
    /// Signed 16-bit little-endian.
    PcmI16,
    /// Signed 24-bit little-endian, packed in 3 bytes.
    PcmI24,
    /// Signed 32-bit little-endian.
    PcmI32,
    /// IEEE 754 single.
    Float32,
    /// IEEE 754 double.
    Float64,
}

impl SampleEncoding {
    /// Bytes one sample occupies.
    pub fn bytes(self) -> usize {
        match self {
            SampleEncoding::PcmU8 => 1,
            SampleEncoding::PcmI16 => 2,
            SampleEncoding::PcmI24 => 3,
            SampleEncoding::PcmI32 | SampleEncoding::Float32 => 4,
            SampleEncoding::Float64 => 8,
        }
    }
}

/// What the header says, after every claim has been checked against the file and the limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WavHeader {
    /// Sample storage.
    pub encoding: SampleEncoding,
    /// Interleaved channels per frame.
    pub channels: u16,
    /// Frames per second.
    pub sample_rate: u32,
    /// Whole frames in the data chunk.
    pub frames: u64,
    /// Byte range of the sample data within the file.
    pub data: Range<usize>,
}

impl WavHeader {
    /// Length in seconds.
    pub fn duration_seconds(&self) -> f64 {
        self.frames as f64 / f64::from(self.sample_rate)
    }
}

/// Parses and validates the RIFF structure and format chunk without decoding samples.
///
/// Fails on a missing or misordered `fmt `/`data` chunk, any size that overruns the file, an
/// unsupported encoding, a zero or excessive channel count, a sample rate outside the limits, an
/// inconsistent `block_align`, an empty data chunk, or a duration over `limits.max_seconds`.
pub fn read_wav_header(bytes: &[u8], limits: &AudioLimits) -> Result<WavHeader> {
    match detect(bytes)? {
        MediaFormat::Audio(_) => {}
        other => {
            return Err(Error::WrongModality {
                expected: Modality::Audio,
                found: other.modality(),
            });
        }
    }
    let mut format: Option<Format> = None;
    let mut pos = 12usize;
    let data = loop {
        let Some(header) = bytes.get(pos..pos + 8) else {
            return Err(Error::MalformedWav(if format.is_some() {
                "no data chunk".into()
            } else {
                "no fmt chunk".into()
            }));
        };
        let id = &header[0..4];
        let size = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let body_start = pos + 8;
        let available = (bytes.len() - body_start) as u64;
        if id == b"data" {
            let Some(format) = format else {
                return Err(Error::MalformedWav("data chunk before fmt chunk".into()));
            };
            // Streaming writers that never seek back leave the size at its placeholder.
            let len = if size == u32::MAX {
                available
            } else {
                u64::from(size)
            };
            if len > available {
                return Err(Error::TruncatedWav {
                    what: "data chunk",
                    needed: len,
                    available,
                });
            }
            break (format, body_start..body_start + len as usize);
        }
        if u64::from(size) > available {
            let what = if id == b"fmt " {
                "fmt chunk"
            } else {
                "chunk before data"
            };
            return Err(Error::TruncatedWav {
                what,
                needed: u64::from(size),
                available,
            });
        }
        let body = &bytes[body_start..body_start + size as usize];
        if id == b"fmt " {
            if format.is_some() {
                return Err(Error::MalformedWav("more than one fmt chunk".into()));
            }
            format = Some(parse_fmt(body)?);
        }
        // Chunks are padded to an even length; the pad byte may be missing at end of file.
        pos = body_start + size as usize + (size as usize & 1);
    };
    let (format, data) = data;
    check_format(&format, limits)?;
    let block_align = usize::from(format.channels) * format.encoding.bytes();
    let frames = (data.len() / block_align) as u64;
    if frames == 0 {
        return Err(Error::EmptyAudio);
    }
    let header = WavHeader {
        encoding: format.encoding,
        channels: format.channels,
        sample_rate: format.sample_rate,
        frames,
        data: data.start..data.start + frames as usize * block_align,
    };
    let seconds = header.duration_seconds();
    if seconds > limits.max_seconds {
        return Err(Error::AudioTooLong {
            seconds,
            limit: limits.max_seconds,
        });
    }
    Ok(header)
}

/// Decodes a WAV file to a mono clip at its own sample rate, averaging the channels.
///
/// Fails as [`read_wav_header`] does, and on a float sample that is not finite or whose
/// magnitude exceeds 1024 (60 dB over full scale).
pub fn decode_wav(bytes: &[u8], limits: &AudioLimits) -> Result<AudioClip> {
    let header = read_wav_header(bytes, limits)?;
    let data = &bytes[header.data.clone()];
    let channels = usize::from(header.channels);
    let width = header.encoding.bytes();
    let scale = 1.0 / channels as f64;
    let mut samples = Vec::with_capacity(header.frames as usize);
    for (index, frame) in data.chunks_exact(channels * width).enumerate() {
        let mut sum = 0.0f64;
        for sample in frame.chunks_exact(width) {
            sum += read_sample(header.encoding, sample);
        }
        let mono = sum * scale;
        if !mono.is_finite() || mono.abs() > MAX_SAMPLE_MAGNITUDE {
            return Err(Error::MalformedWav(format!(
                "sample {mono} in frame {index} is not finite or beyond {MAX_SAMPLE_MAGNITUDE}"
            )));
        }
        samples.push(mono as f32);
    }
    Ok(AudioClip {
        samples,
        sample_rate: header.sample_rate,
    })
}

#[derive(Debug, Clone, Copy)]
struct Format {
    encoding: SampleEncoding,
    channels: u16,
    sample_rate: u32,
    block_align: u16,
}

fn parse_fmt(body: &[u8]) -> Result<Format> {
    if body.len() < 16 {
        return Err(Error::MalformedWav(format!(
            "fmt chunk of {} bytes, need 16",
            body.len()
        )));
    }
    let u16_at = |i: usize| u16::from_le_bytes([body[i], body[i + 1]]);
    let mut tag = u16_at(0);
    let channels = u16_at(2);
    let sample_rate = u32::from_le_bytes([body[4], body[5], body[6], body[7]]);
    let block_align = u16_at(12);
    let bits = u16_at(14);
    if tag == WAVE_FORMAT_EXTENSIBLE {
        if body.len() < 40 || u16_at(16) < 22 {
            return Err(Error::MalformedWav(
                "WAVE_FORMAT_EXTENSIBLE fmt chunk is too short".into(),
            ));
        }
        let valid_bits = u16_at(18);
        if valid_bits > bits {
            return Err(Error::MalformedWav(format!(
                "{valid_bits} valid bits in a {bits}-bit container"
            )));
        }
        if body[26..40] != SUBTYPE_GUID_TAIL {
            return Err(Error::UnsupportedWav(
                "WAVE_FORMAT_EXTENSIBLE with a non-standard subformat GUID".into(),
            ));
        }
        tag = u16_at(24);
    }
    let encoding = match (tag, bits) {
        (WAVE_FORMAT_PCM, 8) => SampleEncoding::PcmU8,
        (WAVE_FORMAT_PCM, 16) => SampleEncoding::PcmI16,
        (WAVE_FORMAT_PCM, 24) => SampleEncoding::PcmI24,
        (WAVE_FORMAT_PCM, 32) => SampleEncoding::PcmI32,
        (WAVE_FORMAT_IEEE_FLOAT, 32) => SampleEncoding::Float32,
        (WAVE_FORMAT_IEEE_FLOAT, 64) => SampleEncoding::Float64,
        (WAVE_FORMAT_PCM, _) | (WAVE_FORMAT_IEEE_FLOAT, _) => {
            return Err(Error::UnsupportedWav(format!(
                "{bits}-bit samples with format tag {tag:#06x}"
            )));
        }
        _ => {
            return Err(Error::UnsupportedWav(format!(
                "format tag {tag:#06x} (compressed or unknown)"
            )));
        }
    };
    Ok(Format {
        encoding,
        channels,
        sample_rate,
        block_align,
    })
}

fn check_format(format: &Format, limits: &AudioLimits) -> Result<()> {
    if format.channels == 0 || format.channels > limits.max_channels {
        return Err(Error::ChannelCount {
            channels: format.channels,
            max: limits.max_channels,
        });
    }
    if format.sample_rate < limits.min_sample_rate || format.sample_rate > limits.max_sample_rate {
        return Err(Error::SampleRateOutOfRange {
            rate: format.sample_rate,
            min: limits.min_sample_rate,
            max: limits.max_sample_rate,
        });
    }
    let expected = usize::from(format.channels) * format.encoding.bytes();
    if usize::from(format.block_align) != expected {
        return Err(Error::MalformedWav(format!(
            "block_align {} but {} channels of {} bytes need {expected}",
            format.block_align,
            format.channels,
            format.encoding.bytes()
        )));
    }
    Ok(())
}

fn read_sample(encoding: SampleEncoding, b: &[u8]) -> f64 {
    match encoding {
        SampleEncoding::PcmU8 => (f64::from(b[0]) - 128.0) / 128.0,
        SampleEncoding::PcmI16 => f64::from(i16::from_le_bytes([b[0], b[1]])) / 32_768.0,
        SampleEncoding::PcmI24 => {
            // Place the 24 bits at the top of an i32 so the sign extends, then shift back.
            let v = i32::from_le_bytes([0, b[0], b[1], b[2]]) >> 8;
            f64::from(v) / 8_388_608.0
        }
        SampleEncoding::PcmI32 => {
            f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])) / 2_147_483_648.0
        }
        SampleEncoding::Float32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        SampleEncoding::Float64 => {
            f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
        }
    }
}
