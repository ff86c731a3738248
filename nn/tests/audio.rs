//! Audio encoders and an audio-language family against transformers 5.24 on tiny random
//! weights (`scripts/make_fixtures.py whisper_encoder qwen2_audio`): a Whisper encoder alone,
//! and Qwen2-Audio (a Whisper-style encoder, pooled and projected into a Qwen2 decoder) with
//! each stage checked on its own. Both take 50 encoder positions (100 mel frames, a 1 s chunk)
//! instead of Whisper's 1500; the input is the log-mel features transformers computed for the
//! speech WAV of `media/tests/fixtures/whisper_features/`, stored with the fixture, and also
//! the features `media::log_mel` computes for that WAV.
//!
//! Tolerance: 1e-4 absolute in f32, as in `parity.rs`. The references were checked against an
//! f64 copy of the same weights when the fixtures were drawn (`f32_vs_f64_max_abs_diff` in
//! golden.json: 2.4e-6 on the Whisper encoder, 1.3e-6 on Qwen2-Audio's, 1.5e-5 on its logits).

use std::path::{Path, PathBuf};

use mlx::{Array, Dtype};
use nn::Weights;
use nn::audio::whisper::{self, Encoder};
use quant::{SafetensorsFile, Tensor};

const TOLERANCE: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn json(name: &str, file: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(fixture(name).join(file)).unwrap()).unwrap()
}

fn reference(name: &str, tensor: &str) -> Array {
    SafetensorsFile::open(&fixture(name).join("logits.safetensors"))
        .unwrap()
        .load(tensor)
        .unwrap()
}

fn weights(name: &str) -> Weights {
    let file = SafetensorsFile::open(&fixture(name).join("model.safetensors")).unwrap();
    let tensors = file
        .entries()
        .keys()
        .map(|n| (n.clone(), Tensor::Dense(file.load(n).unwrap())))
        .collect::<Vec<_>>();
    Weights::new(tensors, Dtype::F32)
}

/// The largest absolute difference, checked against `tolerance`.
fn compare(got: &Array, expected: &Array, what: &str, tolerance: f32) -> f32 {
    assert_eq!(got.shape(), expected.shape(), "{what}: shape");
    let got = got.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
    let expected = expected
        .astype(Dtype::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let worst = got
        .iter()
        .zip(&expected)
        .map(|(g, e)| (g - e).abs())
        .fold(0f32, |a, e| if e.is_nan() { f32::NAN } else { a.max(e) });
    eprintln!("{what}: max abs error {worst:e}");
    assert!(
        worst <= tolerance,
        "{what}: max abs error {worst} > {tolerance}"
    );
    worst
}

/// The speech WAV's samples at 16 kHz, as media decodes them.
fn speech() -> media::AudioClip {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../media/tests/fixtures/whisper_features/speech_16k.wav");
    media::decode_wav(
        &std::fs::read(path).unwrap(),
        &media::AudioLimits::default(),
    )
    .unwrap()
}

/// `media::log_mel` of `clip` over the fixtures' 1 s chunk, as `[1, bins, 100]`.
fn media_features(clip: &media::AudioClip, bins: usize) -> (Array, usize) {
    let config = media::LogMelConfig {
        chunk_length: 1,
        ..media::LogMelConfig::whisper(bins)
    };
    let mel = media::log_mel(clip, &config, &media::AudioLimits::default()).unwrap();
    let array = Array::from_slice(&mel.features, &[1, bins as i32, mel.frames as i32]).unwrap();
    (array, mel.valid_frames)
}

fn whisper_encoder() -> Encoder {
    let config = whisper::Config::from_json(&json("whisper_encoder", "config.json")).unwrap();
    let mut weights = weights("whisper_encoder");
    let encoder = Encoder::new(config, &mut weights, "model.encoder").unwrap();
    assert_eq!(weights.unused(), Vec::<&str>::new(), "weights never used");
    mlx::eval(&encoder.parameters()).unwrap();
    encoder
}

#[test]
fn whisper_encoder_matches_transformers() {
    let encoder = whisper_encoder();
    let mel = reference("whisper_encoder", "input_features");
    assert_eq!(mel.shape(), [1, 80, 100]);
    let expected = reference("whisper_encoder", "encoder_hidden");
    compare(
        &encoder.forward(&mel).unwrap(),
        &expected,
        "whisper encoder",
        TOLERANCE,
    );

    // The same WAV through media's features, which are within 1.2e-7 of the extractor's f64
    // path; the stored input is its torch path (f32 STFT), up to 4e-5 from that (media's
    // tests/whisper_features.rs), hence the looser bound on the features themselves.
    let (ours, valid) = media_features(&speech(), 80);
    assert_eq!(valid, 100);
    compare(&ours, &mel, "media features", TOLERANCE);
    compare(
        &encoder.forward(&ours).unwrap(),
        &expected,
        "whisper encoder on media's features",
        TOLERANCE,
    );
}

#[test]
fn whisper_encoder_refuses_what_does_not_fit() {
    let encoder = whisper_encoder();
    for shape in [[1, 80, 99], [1, 79, 100], [0, 80, 100]] {
        let bad = Array::zeros(&shape, Dtype::F32).unwrap();
        let err = encoder.forward(&bad).unwrap_err().to_string();
        assert!(err.contains("expected [batch, 80, 100]"), "{err}");
    }
    let mel = reference("whisper_encoder", "input_features");
    for positions in [0, 51] {
        assert!(encoder.hidden_states(&mel, positions).is_err());
    }
    let mut config = json("whisper_encoder", "config.json");
    config["encoder_attention_heads"] = 3.into();
    let err = whisper::Config::from_json(&config).unwrap_err().to_string();
    assert!(err.contains("do not split"), "{err}");
    config["encoder_attention_heads"] = 4.into();
    config.as_object_mut().unwrap().remove("num_mel_bins");
    let err = whisper::Config::from_json(&config).unwrap_err().to_string();
    assert!(err.contains("num_mel_bins"), "{err}");
}
