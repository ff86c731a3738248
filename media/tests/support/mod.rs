//! Helpers shared by the integration tests: WAV and image builders, signal generators, and a
//! counting allocator that records peak heap use so "no large allocation" can be asserted.
#![allow(dead_code)] // each test binary uses a different subset

pub mod alloc;

use image::{ImageEncoder, RgbImage};

/// Everything a WAV `fmt ` chunk says, so tests can also make it lie.
#[derive(Debug, Clone, Copy)]
pub struct WavSpec {
    pub tag: u16,
    pub channels: u16,
    pub rate: u32,
    pub bits: u16,
    /// Write `WAVE_FORMAT_EXTENSIBLE` with `tag` as the subformat.
    pub extensible: bool,
    /// Override the computed block alignment.
    pub block_align: Option<u16>,
}

impl WavSpec {
    pub fn pcm(channels: u16, rate: u32, bits: u16) -> Self {
        WavSpec {
            tag: 1,
            channels,
            rate,
            bits,
            extensible: false,
            block_align: None,
        }
    }

    pub fn float(channels: u16, rate: u32, bits: u16) -> Self {
        WavSpec {
            tag: 3,
            channels,
            rate,
            bits,
            extensible: false,
            block_align: None,
        }
    }
}

/// `fmt ` chunk body for `spec`.
pub fn fmt_body(spec: &WavSpec) -> Vec<u8> {
    let block_align = spec
        .block_align
        .unwrap_or((u32::from(spec.channels) * u32::from(spec.bits) / 8) as u16);
    let mut fmt = Vec::new();
    fmt.extend_from_slice(&(if spec.extensible { 0xFFFEu16 } else { spec.tag }).to_le_bytes());
    fmt.extend_from_slice(&spec.channels.to_le_bytes());
    fmt.extend_from_slice(&spec.rate.to_le_bytes());
    fmt.extend_from_slice(&spec.rate.wrapping_mul(u32::from(block_align)).to_le_bytes());
    fmt.extend_from_slice(&block_align.to_le_bytes());
    fmt.extend_from_slice(&spec.bits.to_le_bytes());
    if spec.extensible {
        fmt.extend_from_slice(&22u16.to_le_bytes());
        fmt.extend_from_slice(&spec.bits.to_le_bytes());
        fmt.extend_from_slice(&0u32.to_le_bytes()); // channel mask
        fmt.extend_from_slice(&spec.tag.to_le_bytes());
        fmt.extend_from_slice(&[0, 0, 0, 0, 0x10, 0, 0x80, 0, 0, 0xAA, 0, 0x38, 0x9B, 0x71]);
    }
    fmt
}

/// RIFF/WAVE file from raw chunks, sizes written truthfully unless the caller lies in a body.
pub fn riff(chunks: &[(&[u8; 4], &[u8])]) -> Vec<u8> {
    let mut body = b"WAVE".to_vec();
    for (id, data) in chunks {
        body.extend_from_slice(*id);
        body.extend_from_slice(&(data.len() as u32).to_le_bytes());
        body.extend_from_slice(data);
        if data.len() % 2 == 1 {
            body.push(0);
        }
    }
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// A well-formed WAV of `spec` holding `data`.
pub fn wav(spec: &WavSpec, data: &[u8]) -> Vec<u8> {
    riff(&[(b"fmt ", &fmt_body(spec)), (b"data", data)])
}

/// Encodes interleaved samples in `[-1, 1]` as `spec` stores them.
pub fn encode(spec: &WavSpec, samples: &[f64]) -> Vec<u8> {
    let mut out = Vec::new();
    for &s in samples {
        match (spec.tag, spec.bits) {
            (1, 8) => out.push(((s * 128.0).round() + 128.0).clamp(0.0, 255.0) as u8),
            (1, 16) => out.extend_from_slice(
                &((s * 32768.0).round().clamp(-32768.0, 32767.0) as i16).to_le_bytes(),
            ),
            (1, 24) => {
                let v = (s * 8_388_608.0).round().clamp(-8_388_608.0, 8_388_607.0) as i32;
                out.extend_from_slice(&v.to_le_bytes()[..3]);
            }
            (1, 32) => out.extend_from_slice(
                &((s * 2_147_483_648.0)
                    .round()
                    .clamp(-2_147_483_648.0, 2_147_483_647.0) as i32)
                    .to_le_bytes(),
            ),
            (3, 32) => out.extend_from_slice(&(s as f32).to_le_bytes()),
            (3, 64) => out.extend_from_slice(&s.to_le_bytes()),
            other => panic!("test helper cannot encode {other:?}"),
        }
    }
    out
}

/// `seconds` of a sine at `freq` Hz, amplitude `amp`, sampled at `rate`.
pub fn sine(freq: f64, amp: f64, rate: u32, seconds: f64) -> Vec<f32> {
    let n = (seconds * f64::from(rate)) as usize;
    (0..n)
        .map(|i| {
            (amp * (2.0 * std::f64::consts::PI * freq * i as f64 / f64::from(rate)).sin()) as f32
        })
        .collect()
}

pub fn png(image: &RgbImage) -> Vec<u8> {
    let mut out = Vec::new();
    image::codecs::png::PngEncoder::new(&mut out)
        .write_image(
            image.as_raw(),
            image.width(),
            image.height(),
            image::ExtendedColorType::Rgb8,
        )
        .unwrap();
    out
}

pub fn jpeg(image: &RgbImage, quality: u8) -> Vec<u8> {
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality)
        .write_image(
            image.as_raw(),
            image.width(),
            image.height(),
            image::ExtendedColorType::Rgb8,
        )
        .unwrap();
    out
}

pub fn webp_lossless(image: &RgbImage) -> Vec<u8> {
    let mut out = Vec::new();
    image::codecs::webp::WebPEncoder::new_lossless(&mut out)
        .write_image(
            image.as_raw(),
            image.width(),
            image.height(),
            image::ExtendedColorType::Rgb8,
        )
        .unwrap();
    out
}

/// A GIF whose frames are solid fills of `colors`, in order.
pub fn gif(width: u32, height: u32, colors: &[[u8; 3]]) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut encoder = image::codecs::gif::GifEncoder::new(&mut out);
        for c in colors {
            let frame =
                image::RgbaImage::from_pixel(width, height, image::Rgba([c[0], c[1], c[2], 255]));
            encoder.encode_frame(image::Frame::new(frame)).unwrap();
        }
    }
    out
}

/// A smooth test pattern.
pub fn pattern(width: u32, height: u32) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([
            (x * 255 / width) as u8,
            (y * 255 / height) as u8,
            ((x + y) * 127 / (width + height)) as u8,
        ])
    })
}
