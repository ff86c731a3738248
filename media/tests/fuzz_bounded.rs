//! A bounded, seeded fuzz run that CI executes: arbitrary bytes and mutations of valid files
//! go through every entry point that takes untrusted input. Nothing may panic, and no input may
//! make the decoders allocate beyond the limits they were given.
//!
//! The open-ended counterparts are the `cargo fuzz` targets in `media/fuzz/`.

mod support;

use std::path::PathBuf;

use media::{
    AudioLimits, ImageLimits, ImageProcessorConfig, LogMelConfig, PatchProcessorConfig,
    decode_base64, decode_image_url, decode_input_audio, detect, log_mel, prepare_audio,
    prepare_image, prepare_image_patches, read_wav_header, split_prompt, upright_dimensions,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::alloc::measure;
use support::{WavSpec, encode, wav};

const SEED: u64 = 0x6d6c_786b_6974;
const RANDOM_INPUTS: usize = 5_000;
const MUTATIONS: usize = 20_000;

const IMAGE_LIMITS: ImageLimits = ImageLimits {
    max_width: 1024,
    max_height: 1024,
    max_pixels: 1 << 20,
    max_decoded_bytes: 16 << 20,
};
/// Qwen2-VL's processor held to 128 x 128 pixels: its patches (6 f32 per pixel) stay
/// below 400 KB whatever the image.
fn patches() -> PatchProcessorConfig {
    PatchProcessorConfig {
        max_pixels: 128 * 128,
        ..PatchProcessorConfig::qwen2_vl()
    }
}
const AUDIO_LIMITS: AudioLimits = AudioLimits {
    max_seconds: 30.0,
    min_sample_rate: 1_000,
    max_sample_rate: 192_000,
    max_channels: 16,
};
/// Decoder scratch beyond the declared decoded size.
const SLACK: usize = 4 << 20;
/// 30 s at 16 kHz of f32 output, plus the decoded input (at most four bytes of f32 per input
/// byte for 8-bit mono) and resampler state.
const AUDIO_BUDGET: usize = 30 * 16_000 * 4 + SLACK;

fn seeds() -> Vec<Vec<u8>> {
    let small = support::pattern(24, 16);
    let stereo: Vec<f64> = (0..400).map(|i| ((i as f64) * 0.1).sin() * 0.5).collect();
    let mut seeds = vec![
        support::png(&small),
        support::jpeg(&small, 85),
        support::webp_lossless(&small),
        support::gif(6, 5, &[[1, 2, 3], [4, 5, 6]]),
    ];
    for spec in [
        WavSpec::pcm(2, 16_000, 8),
        WavSpec::pcm(2, 44_100, 16),
        WavSpec {
            extensible: true,
            ..WavSpec::pcm(2, 48_000, 24)
        },
        WavSpec::float(2, 22_050, 32),
        WavSpec::float(2, 8_000, 64),
    ] {
        seeds.push(wav(&spec, &encode(&spec, &stereo)));
    }
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<_> = std::fs::read_dir(corpus)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    seeds.extend(files.iter().map(|p| std::fs::read(p).unwrap()));
    seeds
}

fn mutate(rng: &mut StdRng, input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..rng.random_range(1..=4) {
        if out.is_empty() {
            out.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..out.len());
        match rng.random_range(0..6) {
            0 => out[at] ^= 1 << rng.random_range(0..8),
            1 => out[at] = rng.random(),
            2 => out.truncate(at),
            3 => {
                let extra: Vec<u8> = (0..rng.random_range(1..16)).map(|_| rng.random()).collect();
                out.splice(at..at, extra);
            }
            4 => {
                // Set a 32-bit field to an extreme, as a lying size or dimension would be.
                let value = [0u32, 1, 0xFFFF, 0x7FFF_FFFF, u32::MAX][rng.random_range(0..5)];
                let end = (at + 4).min(out.len());
                out[at..end].copy_from_slice(&value.to_le_bytes()[..end - at]);
            }
            _ => {
                let end = rng.random_range(at..out.len());
                let copy = out[at..end].to_vec();
                out.extend_from_slice(&copy);
            }
        }
    }
    out
}

fn random_bytes(rng: &mut StdRng) -> Vec<u8> {
    const PREFIXES: [&[u8]; 7] = [
        b"",
        b"\x89PNG\r\n\x1a\n",
        b"\xFF\xD8\xFF",
        b"GIF89a",
        b"RIFF\0\0\0\0WEBP",
        b"RIFF\0\0\0\0WAVE",
        b"RIFF\xff\xff\xff\xffWAVEfmt ",
    ];
    let mut out = PREFIXES[rng.random_range(0..PREFIXES.len())].to_vec();
    out.extend((0..rng.random_range(0..256)).map(|_| rng.random::<u8>()));
    out
}

/// Feeds one input to every byte-level entry point; returns the peak heap growth.
fn exercise(bytes: &[u8]) -> usize {
    let ((), peak) = measure(|| {
        let _ = detect(bytes);
        let _ = read_wav_header(bytes, &AUDIO_LIMITS);
        let _ = prepare_image(bytes, &IMAGE_LIMITS, &ImageProcessorConfig::clip(32));
        // The dynamic-resolution path (Qwen2.5-VL's): the header read that lays out its
        // tokens, then decode and patches within a small pixel budget.
        let _ = upright_dimensions(bytes, &IMAGE_LIMITS);
        let _ = prepare_image_patches(bytes, &IMAGE_LIMITS, &patches());
        if let Ok(audio) = prepare_audio(bytes, &AUDIO_LIMITS, 16_000) {
            // Whisper's features of what decoded, over a 1 s chunk to keep the run short: the
            // buffers are sized by the chunk, never by the clip.
            let config = LogMelConfig {
                chunk_length: 1,
                ..LogMelConfig::whisper(80)
            };
            let _ = log_mel(&audio.clip, &config, &AUDIO_LIMITS);
        }
    });
    peak
}

#[test]
fn seeded_fuzz_of_decoders_stays_within_limits() {
    let mut rng = StdRng::seed_from_u64(SEED);
    let seeds = seeds();
    let mut worst = 0usize;
    let mut inputs = 0usize;
    for _ in 0..RANDOM_INPUTS {
        worst = worst.max(exercise(&random_bytes(&mut rng)));
        inputs += 1;
    }
    for _ in 0..MUTATIONS {
        let seed = &seeds[rng.random_range(0..seeds.len())];
        let input = mutate(&mut rng, seed);
        let peak = exercise(&input);
        let budget = IMAGE_LIMITS.max_decoded_bytes as usize + SLACK + AUDIO_BUDGET;
        assert!(
            peak <= budget,
            "input of {} bytes allocated {peak} bytes: {:02x?}",
            input.len(),
            &input[..input.len().min(64)]
        );
        worst = worst.max(peak);
        inputs += 1;
    }
    eprintln!("{inputs} fuzz inputs, largest peak {worst} bytes");
}

#[test]
fn seeded_fuzz_of_text_entry_points() {
    let mut rng = StdRng::seed_from_u64(SEED ^ 1);
    const ALPHABET: &[u8] = b"AZaz09+/=-_ \n,;:[]img-0123456789data:image/png;base64,";
    for _ in 0..2_000 {
        let len = rng.random_range(0..96);
        let text: String = (0..len)
            .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
            .collect();
        let _ = decode_base64(&text, 1 << 16);
        let _ = decode_image_url(&text, 1 << 16);
        let _ = decode_input_audio(&text, "wav", 1 << 16);
        if let Ok(segments) = split_prompt(&text, 3) {
            // Reassembling text segments never yields more than the prompt held.
            let text_len: usize = segments
                .iter()
                .map(|s| {
                    if let media::Segment::Text(t) = s {
                        t.len()
                    } else {
                        0
                    }
                })
                .sum();
            assert!(text_len <= text.len());
        }
    }
}
