//! Log-mel parity with transformers 5.24's `WhisperFeatureExtractor` on committed WAVs: the
//! fixtures under `tests/fixtures/whisper_features/` come from
//! `scripts/make_audio_fixtures.py`.
//!
//! Every one of the 3000 frames is checked: the stored columns cover the clip and the frames
//! its reflection reaches; every later frame must equal the stored padding value.
//!
//! Two references: the extractor's own output (its torch path, f32 STFT and filters, taken
//! whenever torch is installed) and its numpy path (f64 throughout). `log_mel` works in f64,
//! so it is held to the f64 path at 2e-6 (measured 1.2e-7 on the 16 kHz WAV at 80 and 128
//! bins: both sides round once to f32, each within 6e-8 of values up to ~1.2), and to the
//! torch path at 1e-4, the torch path's own distance from the f64 one being up to 4.1e-5 (the
//! manifest's `torch_vs_numpy_f64_max_abs_diff`; measured 4.4e-6 and 7.0e-6 here).

use std::path::{Path, PathBuf};

use media::{AudioLimits, LogMelConfig, decode_wav, log_mel, resample};
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/whisper_features")
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn case(name: &str) -> Value {
    let manifest: Value = serde_json::from_slice(&read("manifest.json")).unwrap();
    manifest["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("case {name}"))
        .clone()
}

fn usize_of(v: &Value, key: &str) -> usize {
    v[key].as_u64().unwrap_or_else(|| panic!("{key}")) as usize
}

/// The largest difference between `ours` (`[bins, 3000]`) and a reference's stored columns
/// (`[bins, stored]`) with every later frame at `padding`.
fn max_diff(ours: &[f32], reference: &[f32], bins: usize, stored: usize, padding: f32) -> f32 {
    assert_eq!(ours.len(), bins * 3000);
    assert_eq!(reference.len(), bins * stored);
    let mut worst = 0.0f32;
    for b in 0..bins {
        for t in 0..3000 {
            let want = if t < stored {
                reference[b * stored + t]
            } else {
                padding
            };
            worst = worst.max((ours[b * 3000 + t] - want).abs());
        }
    }
    worst
}

/// Our features of a case against both references: (vs torch path, vs f64 path).
fn check(name: &str, samples_at_16k: Vec<f32>) -> (f32, f32) {
    let c = case(name);
    let bins = usize_of(&c, "feature_size");
    let stored = usize_of(&c, "stored_frames");
    let padding = c["padding_value"].as_f64().unwrap() as f32;
    assert_eq!(samples_at_16k.len(), usize_of(&c, "samples_at_16k"));
    let clip = media::AudioClip {
        samples: samples_at_16k,
        sample_rate: 16_000,
    };
    let out = log_mel(&clip, &LogMelConfig::whisper(bins), &AudioLimits::default()).unwrap();
    assert_eq!((out.feature_size, out.frames), (bins, 3000));
    assert_eq!(out.valid_frames, usize_of(&c, "valid_frames"), "{name}");
    let torch = f32s(&read(c["file"].as_str().unwrap()));
    let exact = f32s(&read(c["numpy_f64_file"].as_str().unwrap()));
    let diffs = (
        max_diff(&out.features, &torch, bins, stored, padding),
        max_diff(&out.features, &exact, bins, stored, padding),
    );
    eprintln!(
        "{name}: vs torch path {:.2e}, vs f64 path {:.2e}",
        diffs.0, diffs.1
    );
    diffs
}

#[test]
fn wav_at_16k_matches_the_extractor() {
    let clip = decode_wav(&read("speech_16k.wav"), &AudioLimits::default()).unwrap();
    assert_eq!(clip.sample_rate, 16_000);
    for name in ["speech_16k_80", "speech_16k_128"] {
        let (torch, exact) = check(name, clip.samples.clone());
        assert!(torch <= 1e-4, "{name}: {torch} from the torch path");
        assert!(exact <= 2e-6, "{name}: {exact} from the f64 path");
    }
}

/// A 44.1 kHz float WAV through `resample` then `log_mel`, against the extractor on the ideal
/// 16 kHz signal (the same band-limited formula sampled at 16 kHz, where rubato puts its
/// output: half an input sample, 11 µs, late; sampled on time instead, the features differ by
/// 4.8e-2, all of it that shift). What this adds to the 16 kHz case is the resampler's
/// passband error, 3e-5 in amplitude on these tones. Measured: 2.0e-5 from the f64 path,
/// 5.4e-5 from the torch path (whose own distance from f64 is 4.1e-5 here); bound 1e-4.
#[test]
fn resampled_wav_matches_the_extractor_on_the_ideal_signal() {
    let clip = decode_wav(&read("tones_44k.wav"), &AudioLimits::default()).unwrap();
    assert_eq!(clip.sample_rate, 44_100);
    let at_16k = resample(&clip, 16_000).unwrap();
    let (torch, exact) = check("tones_44k_80", at_16k.samples);
    assert!(torch <= 1e-4, "{torch} from the torch path");
    assert!(exact <= 1e-4, "{exact} from the f64 path");
}

/// A clip past the chunk is cut, as the extractor's truncation does: the first 30 s decide
/// everything, so two clips sharing them have equal features.
#[test]
fn long_clips_are_cut_to_the_chunk() {
    let clip = decode_wav(&read("speech_16k.wav"), &AudioLimits::default()).unwrap();
    let config = LogMelConfig::whisper(80);
    let mut long = clip.samples.iter().copied().cycle();
    let first: Vec<f32> = long.by_ref().take(480_000).collect();
    let mut a = first.clone();
    a.extend(std::iter::repeat_n(0.3, 16_000));
    let mut b = first;
    b.extend(std::iter::repeat_n(-0.7, 32_000));
    let limits = AudioLimits::default();
    let fa = log_mel(
        &media::AudioClip {
            samples: a,
            sample_rate: 16_000,
        },
        &config,
        &limits,
    )
    .unwrap();
    let fb = log_mel(
        &media::AudioClip {
            samples: b,
            sample_rate: 16_000,
        },
        &config,
        &limits,
    )
    .unwrap();
    assert_eq!(fa.valid_frames, 3000);
    assert_eq!(fa, fb);
}
