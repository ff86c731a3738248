//! `POST /v1/audio/transcriptions` with the tiny Whisper of `nn/tests/fixtures/whisper`
//! (`scripts/make_whisper_fixture.py`: random weights, a 1 s window, its own byte-level BPE
//! tokenizer with Whisper's special and timestamp tokens), imported into the store as
//! `mlxkit create` imports a folder.
//!
//! Each answer is compared with what the model computes directly on this thread: the speech
//! WAV of `media/tests/fixtures/whisper_features/` (1.31 s) cut at pauses into windows as the
//! server cuts it, each window's log-mel features through `Whisper` and greedy decoding, the
//! text decoded by the fixture's tokenizer with special tokens skipped. Tokens must be equal,
//! not close: both sides run the same f32 kernels on the same features. The clip's first
//! second alone, the parity fixture's input, must also decode to transformers' greedy tokens
//! (`golden.json`), media's features being within 4e-5 of transformers'.
//!
//! Also: hostile and malformed requests get a 400 naming the problem, an unknown model a 404,
//! a chat model a 400 before anything loads, a Whisper model asked to chat a 400, and the
//! server keeps answering. No download: the fixture is committed, so this runs everywhere.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use mlx::{Array, Dtype};
use nn::audio::whisper_decoding::{self, SpecialTokens, Task};
use nn::audio::whisper_model::Whisper;
use runner::engine::LoopConfig;
use runner::model_name::ModelName;
use serde_json::{Value, json};
use support::{ByteVocabulary, Server, client, post, start_server_with};

const MODEL: &str = "tiny-whisper:test";
const TEXT_MODEL: &str = "tiny-qwen2-text:test";
/// The encoder's window: 100 frames of 160 samples at 16 kHz.
const WINDOW_SECONDS: f64 = 1.0;
/// What the server lets a window decode: half the decoder's 48 positions.
const MAX_NEW_TOKENS: usize = 24;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nn/tests/fixtures")
        .join(name)
}

fn speech() -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../media/tests/fixtures/whisper_features/speech_16k.wav"),
    )
    .unwrap()
}

/// The checkpoint's files alone (the fixture folder also holds the reference outputs, which a
/// checkpoint does not).
fn whisper_folder() -> tempfile::TempDir {
    let folder = tempfile::tempdir().unwrap();
    for file in [
        "config.json",
        "generation_config.json",
        "preprocessor_config.json",
        "model.safetensors",
        "tokenizer.json",
    ] {
        std::fs::copy(fixture("whisper").join(file), folder.path().join(file)).unwrap();
    }
    folder
}

/// What the model computes directly for the speech clip.
struct Direct {
    /// Each window's start in the clip, seconds.
    offsets: Vec<f64>,
    /// The clip's length at 16 kHz, seconds.
    duration: f64,
    /// Greedy tokens per window, without timestamps.
    plain: Vec<Vec<u32>>,
    /// Greedy tokens per window, with timestamps.
    timed: Vec<whisper_decoding::Decoded>,
    /// The plain transcript.
    text: String,
    /// The language detected from the first window.
    detected: Option<String>,
    tokenizer: tokenizer::Tokenizer,
    special: SpecialTokens,
}

fn direct() -> &'static Direct {
    static DIRECT: OnceLock<Direct> = OnceLock::new();
    DIRECT.get_or_init(|| {
        let dir = fixture("whisper");
        let model = Whisper::load(whisper_folder().path(), Some(Dtype::F32)).unwrap();
        let generation: Value =
            serde_json::from_slice(&std::fs::read(dir.join("generation_config.json")).unwrap())
                .unwrap();
        let special = SpecialTokens::from_generation_config(&generation, 382).unwrap();
        let tokenizer = tokenizer::Tokenizer::from_hf_dir(&dir).unwrap();

        let limits = media::AudioLimits::default();
        let clip = media::prepare_audio(&speech(), &limits, 16_000)
            .unwrap()
            .clip;
        let ranges =
            media::split_ranges(&clip, WINDOW_SECONDS, &media::SplitConfig::default()).unwrap();
        let config = media::LogMelConfig {
            chunk_length: 1,
            ..media::LogMelConfig::whisper(80)
        };
        let mut out = Direct {
            offsets: Vec::new(),
            duration: clip.duration_seconds(),
            plain: Vec::new(),
            timed: Vec::new(),
            text: String::new(),
            detected: None,
            tokenizer,
            special: special.clone(),
        };
        for (k, range) in ranges.into_iter().enumerate() {
            out.offsets.push(range.start as f64 / 16_000.0);
            let piece = media::AudioClip {
                samples: clip.samples[range].to_vec(),
                sample_rate: 16_000,
            };
            let mel = media::log_mel(&piece, &config, &limits).unwrap();
            let features = Array::from_slice(&mel.features, &[1, 80, 100]).unwrap();
            let cross = model.encode(&features).unwrap();
            if k == 0 {
                out.detected = whisper_decoding::detect_language(&model, &cross, &special).unwrap();
            }
            let prompt = special.prompt(Some("en"), Task::Transcribe, false).unwrap();
            let plain =
                whisper_decoding::greedy(&model, &cross, &special, &prompt, false, MAX_NEW_TOKENS)
                    .unwrap();
            out.text
                .push_str(&out.tokenizer.decode(&plain.tokens, true).unwrap());
            out.plain.push(plain.tokens);
            let prompt = special.prompt(Some("en"), Task::Transcribe, true).unwrap();
            out.timed.push(
                whisper_decoding::greedy(&model, &cross, &special, &prompt, true, MAX_NEW_TOKENS)
                    .unwrap(),
            );
        }
        out.text = out.text.trim().to_string();
        out
    })
}

/// The server, with the Whisper model and a text-only Qwen2; the direct computation runs
/// first, on this thread, before the engine's MLX worker exists.
fn server() -> &'static Server {
    static SERVER: OnceLock<Option<Server>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            direct();
            start_server_with(&[], LoopConfig::from_env(), |store| {
                let folder = whisper_folder();
                let name = ModelName::parse(MODEL).unwrap();
                runner::import::import_path(store, &name, folder.path(), "test", &mut |_, _, _| {})
                    .unwrap();
                let vocabulary = ByteVocabulary {
                    first_byte: 3,
                    specials: &[(0, "<|endoftext|>"), (1, "<|im_start|>"), (2, "<|im_end|>")],
                    size: 512,
                };
                let folder = vocabulary.tokenizer_folder(
                    &fixture("qwen2"),
                    "{% for m in messages %}{{ m.content }}{% endfor %}",
                    "<|endoftext|>",
                    "<|im_end|>",
                );
                let name = ModelName::parse(TEXT_MODEL).unwrap();
                runner::import::import_path(store, &name, folder.path(), "test", &mut |_, _, _| {})
                    .unwrap();
            })
        })
        .as_ref()
        .expect("the tiny models need no download")
}

const BOUNDARY: &str = "mlxkit-test-boundary";

/// A multipart form of text `fields` and, when given, a `file` part.
fn form(fields: &[(&str, &str)], file: Option<&[u8]>) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, value) in fields {
        body.extend_from_slice(
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
            .as_bytes(),
        );
    }
    if let Some(file) = file {
        body.extend_from_slice(
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; \
                 filename=\"clip.wav\"\r\nContent-Type: audio/wav\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(file);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body
}

/// Posts `body` as a multipart form: the status and the body's text.
fn transcribe(body: Vec<u8>) -> (u16, String) {
    let r = client()
        .post(format!("{}/v1/audio/transcriptions", server().base))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(body)
        .send()
        .unwrap();
    (r.status().as_u16(), r.text().unwrap())
}

fn transcribe_json(fields: &[(&str, &str)], file: Option<&[u8]>) -> (u16, Value) {
    let (status, text) = transcribe(form(fields, file));
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn error_message(body: &Value) -> String {
    body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn json_and_text_equal_the_direct_transcript() {
    let direct = direct();
    assert!(
        direct.plain.len() >= 2,
        "the clip spans more than one window"
    );
    assert!(direct.plain.iter().all(|w| !w.is_empty()));
    let clip = speech();
    let (status, body) = transcribe_json(&[("model", MODEL), ("language", "en")], Some(&clip));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({ "text": direct.text }));

    let (status, text) = transcribe(form(
        &[
            ("model", MODEL),
            ("language", "en"),
            ("response_format", "text"),
        ],
        Some(&clip),
    ));
    assert_eq!(status, 200, "{text}");
    assert_eq!(text, direct.text);
}

#[test]
fn verbose_json_segments_equal_the_direct_decoding() {
    let direct = direct();
    let (status, body) = transcribe_json(
        &[
            ("model", MODEL),
            ("language", "en"),
            ("response_format", "verbose_json"),
            ("timestamp_granularities[]", "segment"),
        ],
        Some(&speech()),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["task"], "transcribe");
    assert_eq!(body["language"], "en");
    assert_eq!(
        body["duration"].as_f64().unwrap(),
        (direct.duration * 1000.0).round() / 1000.0
    );

    let mut expected = Vec::new();
    let mut text = String::new();
    for (k, decoded) in direct.timed.iter().enumerate() {
        let words: Vec<u32> = decoded
            .tokens
            .iter()
            .copied()
            .filter(|t| !direct.special.is_timestamp(*t))
            .collect();
        text.push_str(&direct.tokenizer.decode(&words, true).unwrap());
        for s in whisper_decoding::segments(decoded, &direct.special, WINDOW_SECONDS as f32) {
            let start = direct.offsets[k] + f64::from(s.start);
            let end = (direct.offsets[k] + f64::from(s.end)).min(direct.duration);
            expected.push((
                (start * 1000.0).round() / 1000.0,
                (end * 1000.0).round() / 1000.0,
                s.tokens.clone(),
                direct.tokenizer.decode(&s.tokens, true).unwrap(),
            ));
        }
    }
    assert_eq!(body["text"], text.trim());
    let segments = body["segments"].as_array().unwrap();
    assert!(segments.len() >= 2, "{body}");
    let got: Vec<(f64, f64, Vec<u32>, String)> = segments
        .iter()
        .map(|s| {
            (
                s["start"].as_f64().unwrap(),
                s["end"].as_f64().unwrap(),
                s["tokens"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_u64().unwrap() as u32)
                    .collect(),
                s["text"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(got, expected);
    for (id, s) in segments.iter().enumerate() {
        assert_eq!(s["id"], id);
        let avg = s["avg_logprob"].as_f64().unwrap();
        assert!(avg <= 0.0 && avg.is_finite(), "{s}");
    }

    // The same segments as SubRip and WebVTT cues.
    for (format, head, separator) in [("srt", "1\n", ','), ("vtt", "WEBVTT\n\n", '.')] {
        let (status, text) = transcribe(form(
            &[
                ("model", MODEL),
                ("language", "en"),
                ("response_format", format),
            ],
            Some(&speech()),
        ));
        assert_eq!(status, 200, "{text}");
        assert!(text.starts_with(head), "{text}");
        assert_eq!(text.matches(" --> ").count(), expected.len(), "{text}");
        let (start, _, _, _) = &expected[0];
        let cue = format!(
            "00:00:00{separator}{:03} --> ",
            (start * 1000.0).round() as u64
        );
        assert!(text.contains(&cue), "{cue} in {text}");
    }

    // Without a language, the first window's likeliest language token decides.
    let (status, body) = transcribe_json(
        &[("model", MODEL), ("response_format", "verbose_json")],
        Some(&speech()),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["language"].as_str(), direct.detected.as_deref());
}

#[test]
fn bad_requests_are_refused_and_the_server_keeps_serving() {
    let clip = speech();
    // A WAV whose header claims 1 Hz; a truncated one; bytes that are no audio at all.
    let mut one_hertz = clip.clone();
    one_hertz[24..28].copy_from_slice(&1u32.to_le_bytes());
    for (bytes, what) in [
        (one_hertz, "1 Hz"),
        (clip[..30].to_vec(), "truncated"),
        (b"not audio at all".to_vec(), "garbage"),
    ] {
        let (status, body) = transcribe_json(&[("model", MODEL)], Some(&bytes));
        assert_eq!(status, 400, "{what}: {body}");
        assert!(
            error_message(&body).contains("invalid audio"),
            "{what}: {body}"
        );
    }

    let (status, body) = transcribe_json(&[("model", MODEL)], None);
    assert_eq!(status, 400, "{body}");
    assert!(error_message(&body).contains("no `file`"), "{body}");
    let (status, body) = transcribe_json(&[], Some(&clip));
    assert_eq!(status, 400, "{body}");
    assert!(error_message(&body).contains("no `model`"), "{body}");
    let (status, body) =
        transcribe_json(&[("model", MODEL), ("response_format", "xml")], Some(&clip));
    assert_eq!(status, 400, "{body}");
    assert!(error_message(&body).contains("xml"), "{body}");
    let (status, body) = transcribe_json(&[("model", MODEL), ("temperature", "0.7")], Some(&clip));
    assert_eq!(status, 400, "{body}");
    let (status, body) = transcribe_json(&[("model", MODEL), ("language", "xx")], Some(&clip));
    assert_eq!(status, 400, "{body}");
    assert!(error_message(&body).contains("`xx`"), "{body}");

    // Not a multipart form; a form cut off in the middle.
    let r = client()
        .post(format!("{}/v1/audio/transcriptions", server().base))
        .json(&json!({ "model": MODEL }))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let mut cut = form(&[("model", MODEL)], Some(&clip));
    cut.truncate(cut.len() - 40);
    let (status, text) = transcribe(cut);
    assert_eq!(status, 400, "{text}");

    // An unknown model; a chat model, refused before it loads.
    let (status, body) = transcribe_json(&[("model", "no-such-model:x")], Some(&clip));
    assert_eq!(status, 404, "{body}");
    let (status, body) = transcribe_json(&[("model", TEXT_MODEL)], Some(&clip));
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        error_message(&body),
        format!("model `{TEXT_MODEL}` does not transcribe audio")
    );

    // The Whisper model asked to chat.
    let (status, body) = post(
        server(),
        "/api/chat",
        json!({ "model": MODEL, "messages": [{ "role": "user", "content": "hi" }], "stream": false }),
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("transcribes audio"),
        "{body}"
    );

    // Still serving.
    let (status, body) = transcribe_json(&[("model", MODEL), ("language", "en")], Some(&clip));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], direct().text);
}

/// The first second of the speech WAV alone: one window, the input the parity fixture's
/// transformers reference was computed from.
fn first_second() -> Vec<u8> {
    let clip = speech();
    // A 44-byte canonical header, then 16-bit mono samples at 16 kHz.
    assert_eq!(&clip[36..40], b"data");
    let data = 16_000 * 2;
    let mut out = clip[..44].to_vec();
    out[4..8].copy_from_slice(&(36 + data as u32).to_le_bytes());
    out[40..44].copy_from_slice(&(data as u32).to_le_bytes());
    out.extend_from_slice(&clip[44..44 + data]);
    out
}

#[test]
fn one_window_decodes_as_transformers_does() {
    // transformers' greedy tokens for this second (`nn/tests/fixtures/whisper/golden.json`,
    // at most 20 tokens there, 24 here), from its own features: media's are within 4e-5 of
    // them, and the server's tokens must still be the same.
    let golden: Value =
        serde_json::from_slice(&std::fs::read(fixture("whisper").join("golden.json")).unwrap())
            .unwrap();
    let ids = |key: &str| -> Vec<u32> {
        golden[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    let (status, body) = transcribe_json(
        &[
            ("model", MODEL),
            ("language", "en"),
            ("response_format", "verbose_json"),
        ],
        Some(&first_second()),
    );
    assert_eq!(status, 200, "{body}");
    let tokens: Vec<u32> = body["segments"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["tokens"].as_array().unwrap().clone())
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let special = &direct().special;
    let expected: Vec<u32> = ids("greedy_timestamped_tokens")
        .into_iter()
        .filter(|t| !special.is_timestamp(*t))
        .collect();
    assert_eq!(tokens[..expected.len()], expected);
    let starts: Vec<f64> = body["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["start"].as_f64().unwrap())
        .collect();
    let first_stamp =
        ids("greedy_timestamped_tokens")[0] - golden["timestamp_begin"].as_u64().unwrap() as u32;
    assert_eq!(starts[0], f64::from(first_stamp) * 0.02);
}

#[test]
fn show_lists_transcription() {
    let (status, body) = post(server(), "/api/show", json!({ "model": MODEL }));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["capabilities"], json!(["transcription"]));
    assert_eq!(body["details"]["family"], "whisper");
}
