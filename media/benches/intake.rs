//! Decode and preprocess cost for a 1024x1024 JPEG and a 60 s 44.1 kHz stereo WAV.
//!
//! `cargo bench -p mlxkit-media --bench intake`

use divan::{Bencher, black_box};
use image::{ImageEncoder, Rgb, RgbImage};
use media::{
    AudioLimits, ImageLimits, ImageProcessorConfig, decode_image, decode_wav, prepare_audio,
    prepare_image, preprocess, split,
};

fn main() {
    divan::main();
}

/// A 1024x1024 JPEG with texture, so the entropy decoder has real work.
fn jpeg_1024() -> Vec<u8> {
    let image = RgbImage::from_fn(1024, 1024, |x, y| {
        let (fx, fy) = (f64::from(x), f64::from(y));
        let v = |a: f64, b: f64| (((fx * a).sin() + (fy * b).cos()) * 60.0 + 128.0) as u8;
        Rgb([v(0.05, 0.031), v(0.013, 0.07), ((x ^ y) & 0xFF) as u8])
    });
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
        .write_image(image.as_raw(), 1024, 1024, image::ExtendedColorType::Rgb8)
        .expect("encoding an in-memory JPEG");
    out
}

/// 60 s of 44.1 kHz stereo 16-bit PCM: two tones, one per channel.
fn wav_60s_stereo() -> Vec<u8> {
    let rate = 44_100u32;
    let frames = 60 * rate;
    let data_len = frames * 4;
    let mut out = Vec::with_capacity(44 + data_len as usize);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data_len).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&(rate * 4).to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    for i in 0..frames {
        let t = f64::from(i) / f64::from(rate);
        for freq in [440.0, 1_250.0] {
            let s = (0.3 * (2.0 * std::f64::consts::PI * freq * t).sin() * 32_767.0) as i16;
            out.extend_from_slice(&s.to_le_bytes());
        }
    }
    out
}

#[divan::bench(sample_count = 20)]
fn jpeg_1024_decode(bencher: Bencher) {
    let bytes = jpeg_1024();
    bencher.bench(|| decode_image(black_box(&bytes), &ImageLimits::default()).expect("valid JPEG"));
}

#[divan::bench(sample_count = 20, args = [224, 384, 896])]
fn jpeg_1024_decode_preprocess(bencher: Bencher, size: u32) {
    let bytes = jpeg_1024();
    let config = ImageProcessorConfig::clip(size);
    bencher.bench(|| {
        prepare_image(black_box(&bytes), &ImageLimits::default(), &config).expect("valid JPEG")
    });
}

#[divan::bench(sample_count = 20, args = [224, 384, 896])]
fn rgb_1024_preprocess_only(bencher: Bencher, size: u32) {
    let rgb = decode_image(&jpeg_1024(), &ImageLimits::default()).expect("valid JPEG");
    let config = ImageProcessorConfig::clip(size);
    bencher.bench(|| preprocess(black_box(&rgb), &config).expect("valid config"));
}

#[divan::bench(sample_count = 10)]
fn wav_60s_decode(bencher: Bencher) {
    let bytes = wav_60s_stereo();
    bencher.bench(|| decode_wav(black_box(&bytes), &AudioLimits::default()).expect("valid WAV"));
}

#[divan::bench(sample_count = 10)]
fn wav_60s_decode_resample_16k(bencher: Bencher) {
    let bytes = wav_60s_stereo();
    bencher.bench(|| {
        prepare_audio(black_box(&bytes), &AudioLimits::default(), 16_000).expect("valid WAV")
    });
}

#[divan::bench(sample_count = 10)]
fn wav_60s_split_30s(bencher: Bencher) {
    let bytes = wav_60s_stereo();
    let clip = prepare_audio(&bytes, &AudioLimits::default(), 16_000)
        .expect("valid WAV")
        .clip;
    bencher.bench(|| split(black_box(&clip), 25.0).expect("valid split"));
}
