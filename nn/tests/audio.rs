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
use nn::audio::whisper::{self, Encoder};
use nn::{Audio, AudioInput, Batch, Model, Weights, build_model};
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

fn qwen2_audio_golden() -> serde_json::Value {
    json("qwen2_audio", "golden.json")
}

fn ids(golden: &serde_json::Value, key: &str) -> Vec<u32> {
    golden[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn qwen2_audio() -> Box<dyn Model> {
    let config = json("qwen2_audio", "config.json");
    let mut weights = weights("qwen2_audio");
    let model = build_model(&config, &mut weights).unwrap();
    assert_eq!(weights.unused(), Vec::<&str>::new(), "weights never used");
    model
}

/// Each clip's features as transformers computed them (`[1, 128, 100]`) and its valid frames.
fn qwen2_audio_clips() -> Vec<(Array, usize)> {
    let golden = qwen2_audio_golden();
    let mel = reference("qwen2_audio", "input_features");
    ids(&golden, "valid_frames")
        .into_iter()
        .enumerate()
        .map(|(i, valid)| {
            (
                mel.slice_axis(0, i as i32, i as i32 + 1).unwrap(),
                valid as usize,
            )
        })
        .collect()
}

fn encode_all(audio: &dyn Audio, clips: &[(Array, usize)]) -> Array {
    let rows: Vec<Array> = clips
        .iter()
        .map(|(mel, valid)| audio.encode_audio(mel, *valid).unwrap())
        .collect();
    mlx::concatenate(&rows, 0).unwrap()
}

#[test]
fn qwen2_audio_matches_transformers() {
    let config = json("qwen2_audio", "config.json");
    let golden = qwen2_audio_golden();
    // What it reads, known before loading.
    let input = nn::registry::audio_input(&config).unwrap().unwrap();
    assert_eq!(
        input,
        AudioInput {
            num_mel_bins: 128,
            max_frames: 100,
            audio_token: 509
        }
    );
    assert_eq!(nn::registry::image_input(&config).unwrap(), None);

    let model = qwen2_audio();
    let audio = model.audio().expect("Qwen2-Audio reads audio");
    assert_eq!(audio.audio_input(), input);
    let clips = qwen2_audio_clips();
    let tokens: Vec<usize> = clips.iter().map(|(_, v)| audio.audio_tokens(*v)).collect();
    assert_eq!(tokens, [19, 25]);
    assert_eq!(
        tokens,
        ids(&golden, "audio_tokens")
            .iter()
            .map(|&t| t as usize)
            .collect::<Vec<_>>()
    );

    // The encoder, pooled and normalized, before the projector.
    let typed = nn::arch::qwen2_audio::Config::from_json(&config).unwrap();
    let mut w = weights("qwen2_audio");
    let direct = nn::arch::qwen2_audio::Qwen2Audio::new(typed, &mut w).unwrap();
    let hidden: Vec<Array> = clips
        .iter()
        .map(|(mel, valid)| direct.encode_audio_hidden(mel, *valid).unwrap())
        .collect();
    compare(
        &mlx::concatenate(&hidden, 0).unwrap(),
        &reference("qwen2_audio", "audio_hidden"),
        "qwen2-audio encoder",
        TOLERANCE,
    );
    let features = encode_all(audio, &clips);
    compare(
        &features,
        &reference("qwen2_audio", "audio_features"),
        "qwen2-audio features",
        TOLERANCE,
    );

    // The prompt with both clips in one pass.
    let prompt = ids(&golden, "prompt_ids");
    let mut caches = model.new_caches().unwrap();
    let batch = Batch::single(&prompt, 0).unwrap();
    let out = audio
        .forward_rows_with_audio(&batch, Some(&features), &mut [&mut caches[..]])
        .unwrap();
    let logits = model.unembed(&out.hidden).unwrap().squeeze(&[0]).unwrap();
    let expected = reference("qwen2_audio", "logits");
    compare(&logits, &expected, "qwen2-audio logits", TOLERANCE);

    // In chunks of 7 tokens, cutting through both clips' runs (the decoder is causal, so a
    // clip may span forwards: each chunk takes the feature rows of its own audio tokens), then
    // the last tokens one at a time.
    let mut caches = model.new_caches().unwrap();
    let (mut rows, mut used) = (Vec::new(), 0i32);
    let audio_id = input.audio_token;
    let mut start = 0;
    while start < prompt.len() {
        let end = (start + if start < 50 { 7 } else { 1 }).min(prompt.len());
        let chunk = &prompt[start..end];
        let n = chunk.iter().filter(|&&t| t == audio_id).count() as i32;
        let part = (n > 0).then(|| features.slice_axis(0, used, used + n).unwrap());
        used += n;
        let out = audio
            .forward_rows_with_audio(
                &Batch::single(chunk, start).unwrap(),
                part.as_ref(),
                &mut [&mut caches[..]],
            )
            .unwrap();
        rows.push(model.unembed(&out.hidden).unwrap().squeeze(&[0]).unwrap());
        start = end;
    }
    compare(
        &mlx::concatenate(&rows, 0).unwrap(),
        &expected,
        "qwen2-audio logits in chunks",
        TOLERANCE,
    );

    // The text model alone, through the same checkpoint.
    let text = ids(&golden, "text_prompt_ids");
    let mut caches = model.new_caches().unwrap();
    let out = model
        .forward(&Batch::single(&text, 0).unwrap(), &mut caches)
        .unwrap();
    compare(
        &model.unembed(&out.hidden).unwrap().squeeze(&[0]).unwrap(),
        &reference("qwen2_audio", "text_logits"),
        "qwen2-audio text-only logits",
        TOLERANCE,
    );
}

/// The same clips from the WAV through `media::log_mel`, end to end.
#[test]
fn qwen2_audio_on_media_features() {
    let model = qwen2_audio();
    let audio = model.audio().unwrap();
    let golden = qwen2_audio_golden();
    let speech = speech();
    let clips: Vec<(Array, usize)> = ids(&golden, "samples")
        .into_iter()
        .map(|n| {
            let clip = media::AudioClip {
                samples: speech.samples[..n as usize].to_vec(),
                sample_rate: 16_000,
            };
            media_features(&clip, 128)
        })
        .collect();
    let valid: Vec<usize> = clips.iter().map(|(_, v)| *v).collect();
    assert_eq!(valid, [78, 100]);
    let features = encode_all(audio, &clips);
    compare(
        &features,
        &reference("qwen2_audio", "audio_features"),
        "qwen2-audio features from media",
        TOLERANCE,
    );
    let prompt = ids(&golden, "prompt_ids");
    let mut caches = model.new_caches().unwrap();
    let out = audio
        .forward_rows_with_audio(
            &Batch::single(&prompt, 0).unwrap(),
            Some(&features),
            &mut [&mut caches[..]],
        )
        .unwrap();
    compare(
        &model.unembed(&out.hidden).unwrap().squeeze(&[0]).unwrap(),
        &reference("qwen2_audio", "logits"),
        "qwen2-audio logits from media",
        TOLERANCE,
    );
}

#[test]
fn qwen2_audio_refuses_what_does_not_fit() {
    let model = qwen2_audio();
    let audio = model.audio().unwrap();
    let clips = qwen2_audio_clips();
    let features = encode_all(audio, &clips);
    let golden = qwen2_audio_golden();
    let prompt = ids(&golden, "prompt_ids");
    let mut caches = model.new_caches().unwrap();
    let short = features.slice_axis(0, 0, 43).unwrap();
    let err = audio
        .forward_rows_with_audio(
            &Batch::single(&prompt, 0).unwrap(),
            Some(&short),
            &mut [&mut caches[..]],
        )
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("44 audio tokens in the batch for 43 rows"),
        "{err}"
    );
    // Too short a clip for a token (two frames make one position, pooled into none).
    assert_eq!(audio.audio_tokens(2), 0);
    assert_eq!(audio.audio_tokens(3), 1);
    let err = audio
        .encode_audio(&clips[0].0, 2)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("too short"), "{err}");
    // Two clips at once, or features of another size.
    let both = reference("qwen2_audio", "input_features");
    assert!(audio.encode_audio(&both, 100).is_err());
    let narrow = Array::zeros(&[1, 80, 100], Dtype::F32).unwrap();
    assert!(audio.encode_audio(&narrow, 100).is_err());

    // A config without its audio token, and a text model's config.
    let mut config = json("qwen2_audio", "config.json");
    config.as_object_mut().unwrap().remove("audio_token_index");
    let err = nn::registry::audio_input(&config).unwrap_err().to_string();
    assert!(err.contains("audio_token_index"), "{err}");
    assert_eq!(
        nn::registry::audio_input(&json("qwen2", "config.json")).unwrap(),
        None
    );
}

/// The checkpoint named by transformers 5's modules (`model.audio_tower.…`,
/// `model.multi_modal_projector.…`, `model.language_model.…`, `lm_head`) computes the same.
#[test]
fn qwen2_audio_reads_the_module_layout() {
    let file = SafetensorsFile::open(&fixture("qwen2_audio").join("model.safetensors")).unwrap();
    let renames = [
        ("language_model.model.", "model.language_model."),
        ("language_model.lm_head.", "lm_head."),
        ("audio_tower.", "model.audio_tower."),
        ("multi_modal_projector.", "model.multi_modal_projector."),
    ];
    let tensors = file
        .entries()
        .keys()
        .map(|name| {
            let renamed = renames
                .iter()
                .find_map(|(from, to)| name.strip_prefix(from).map(|rest| format!("{to}{rest}")))
                .unwrap();
            (renamed, Tensor::Dense(file.load(name).unwrap()))
        })
        .collect::<Vec<_>>();
    let mut weights = Weights::new(tensors, Dtype::F32);
    let model = build_model(&json("qwen2_audio", "config.json"), &mut weights).unwrap();
    assert_eq!(weights.unused(), Vec::<&str>::new(), "weights never used");
    let audio = model.audio().unwrap();
    let features = encode_all(audio, &qwen2_audio_clips());
    let prompt = ids(&qwen2_audio_golden(), "prompt_ids");
    let mut caches = model.new_caches().unwrap();
    let out = audio
        .forward_rows_with_audio(
            &Batch::single(&prompt, 0).unwrap(),
            Some(&features),
            &mut [&mut caches[..]],
        )
        .unwrap();
    compare(
        &model.unembed(&out.hidden).unwrap().squeeze(&[0]).unwrap(),
        &reference("qwen2_audio", "logits"),
        "qwen2-audio logits, module layout",
        TOLERANCE,
    );
}
