//! Whisper the speech recognizer against transformers 5.24 on tiny random weights
//! (`scripts/make_whisper_fixture.py`): the decoder's logits for a forced prefix, all at once
//! and one token at a time over the self-attention cache, and greedy decoding without and
//! with timestamps, token for token, for the log-mel features transformers computed from the
//! speech WAV of `media/tests/fixtures/whisper_features/` (a 1 s window: 50 encoder
//! positions).
//!
//! Tolerance: 1e-4 absolute on the logits in f32, as in `parity.rs`; the reference moves by
//! 5.9e-7 between f32 and f64 weights (`f32_vs_f64_max_abs_diff` in golden.json), so the
//! bound is what MLX's and torch's f32 kernels may differ by, not rounding of the reference.

use std::path::{Path, PathBuf};

use mlx::{Array, Dtype};
use nn::audio::whisper_decoding::{self, SpecialTokens, Task};
use nn::audio::whisper_model::Whisper;
use quant::SafetensorsFile;

const TOLERANCE: f32 = 1e-4;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/whisper")
}

fn json(file: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(fixture().join(file)).unwrap()).unwrap()
}

fn reference(tensor: &str) -> Array {
    SafetensorsFile::open(&fixture().join("logits.safetensors"))
        .unwrap()
        .load(tensor)
        .unwrap()
}

fn ids(golden: &serde_json::Value, key: &str) -> Vec<u32> {
    golden[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn model() -> Whisper {
    Whisper::load(&fixture(), Some(Dtype::F32)).unwrap()
}

fn special() -> SpecialTokens {
    let vocab = json("config.json")["vocab_size"].as_u64().unwrap() as usize;
    SpecialTokens::from_generation_config(&json("generation_config.json"), vocab).unwrap()
}

fn max_abs_diff(got: &Array, expected: &Array) -> f32 {
    assert_eq!(got.shape(), expected.shape());
    let got = got.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
    let expected = expected.to_vec::<f32>().unwrap();
    got.iter()
        .zip(&expected)
        .map(|(g, e)| (g - e).abs())
        .fold(0f32, |a, e| if e.is_nan() { f32::NAN } else { a.max(e) })
}

#[test]
fn forced_prefix_logits_match_transformers() {
    let model = model();
    let golden = json("golden.json");
    let forced: Vec<i32> = ids(&golden, "forced_prefix")
        .into_iter()
        .map(|t| t as i32)
        .collect();
    let expected = reference("logits");
    let cross = model.encode(&reference("input_features")).unwrap();

    let mut cache = model.decoder().new_cache();
    let tokens = Array::from_slice(&forced, &[1, forced.len() as i32]).unwrap();
    let all = model
        .decoder()
        .forward(&tokens, &cross, &mut cache)
        .unwrap();
    assert_eq!(cache.len(), forced.len());
    let worst = max_abs_diff(&all.squeeze(&[0]).unwrap(), &expected);
    eprintln!("forced prefix at once: max abs error {worst:e}");
    assert!(worst <= TOLERANCE, "{worst}");

    // The same tokens through the cache: four at once, then one at a time.
    let mut cache = model.decoder().new_cache();
    let mut rows = Vec::new();
    let head = Array::from_slice(&forced[..4], &[1, 4]).unwrap();
    rows.push(model.decoder().forward(&head, &cross, &mut cache).unwrap());
    for &t in &forced[4..] {
        let one = Array::from_slice(&[t], &[1, 1]).unwrap();
        rows.push(model.decoder().forward(&one, &cross, &mut cache).unwrap());
    }
    let stepped = mlx::concatenate(&rows, 1).unwrap();
    let worst = max_abs_diff(&stepped.squeeze(&[0]).unwrap(), &expected);
    eprintln!("forced prefix step by step: max abs error {worst:e}");
    assert!(worst <= TOLERANCE, "{worst}");
}

#[test]
fn greedy_decoding_matches_transformers_generate() {
    let model = model();
    let special = special();
    let golden = json("golden.json");
    let max_new = golden["max_new_tokens"].as_u64().unwrap() as usize;
    let cross = model.encode(&reference("input_features")).unwrap();

    let prompt = special.prompt(Some("en"), Task::Transcribe, false).unwrap();
    assert_eq!(prompt, ids(&golden, "forced_prefix")[..4]);
    let plain =
        whisper_decoding::greedy(&model, &cross, &special, &prompt, false, max_new).unwrap();
    assert_eq!(plain.tokens, ids(&golden, "greedy_tokens"));
    assert_eq!(plain.logprobs.len(), plain.tokens.len());
    assert!(plain.logprobs.iter().all(|l| *l <= 0.0 && l.is_finite()));

    let prompt = special.prompt(Some("en"), Task::Transcribe, true).unwrap();
    let timed = whisper_decoding::greedy(&model, &cross, &special, &prompt, true, max_new).unwrap();
    let expected = ids(&golden, "greedy_timestamped_tokens");
    assert_eq!(timed.tokens, expected);

    // <|0.02|> text <|0.66|> <|0.66|> text <|0.88|> <|0.88|> text… : three segments, the last
    // one running to the window's end.
    let segments = whisper_decoding::segments(&timed, &special, 1.0);
    let spans: Vec<(f32, f32)> = segments.iter().map(|s| (s.start, s.end)).collect();
    let at = |t: u32| (t - special.timestamp_begin()) as f32 * 0.02;
    assert_eq!(
        spans,
        [
            (at(expected[0]), at(expected[2])),
            (at(expected[3]), at(expected[5])),
            (at(expected[6]), 1.0)
        ]
    );
    let text: usize = segments.iter().map(|s| s.tokens.len()).sum();
    assert_eq!(
        text,
        expected
            .iter()
            .filter(|t| !special.is_timestamp(**t))
            .count()
    );

    // The checkpoint's language tokens; which one random weights favour is not checked.
    let language = whisper_decoding::detect_language(&model, &cross, &special).unwrap();
    assert!(special.languages.contains_key(language.as_deref().unwrap()));
}

#[test]
fn parameter_count_is_what_the_checkpoint_holds() {
    let file = SafetensorsFile::open(&fixture().join("model.safetensors")).unwrap();
    let stored: u64 = file
        .entries()
        .keys()
        .map(|name| file.load(name).unwrap().size() as u64)
        .sum();
    let counted = nn::audio::whisper_model::parameter_count(&json("config.json")).unwrap();
    assert_eq!(counted, stored);
}

#[test]
fn hostile_configs_and_inputs_are_refused() {
    let mut config = json("config.json");
    config["decoder_attention_heads"] = 3.into();
    let err = nn::audio::whisper_decoder::DecoderConfig::from_json(&config)
        .unwrap_err()
        .to_string();
    assert!(err.contains("do not split"), "{err}");
    config["decoder_attention_heads"] = 2.into();
    config["max_target_positions"] = (1u64 << 40).into();
    let err = nn::audio::whisper_decoder::DecoderConfig::from_json(&config)
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_target_positions"), "{err}");

    let mut generation = json("generation_config.json");
    generation["eos_token_id"] = 5000.into();
    let err = SpecialTokens::from_generation_config(&generation, 382)
        .unwrap_err()
        .to_string();
    assert!(err.contains("eos_token_id"), "{err}");
    generation.as_object_mut().unwrap().remove("eos_token_id");
    let err = SpecialTokens::from_generation_config(&generation, 382)
        .unwrap_err()
        .to_string();
    assert!(err.contains("eos_token_id"), "{err}");

    let special = special();
    let err = special
        .prompt(Some("xx"), Task::Transcribe, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`xx`"), "{err}");

    let model = model();
    let cross = model.encode(&reference("input_features")).unwrap();
    let long = vec![special.start_of_transcript; 48];
    assert!(whisper_decoding::greedy(&model, &cross, &special, &long, false, 4).is_err());
    let mut cache = model.decoder().new_cache();
    let too_many = Array::zeros(&[1, 49], Dtype::I32).unwrap();
    let err = model
        .decoder()
        .forward(&too_many, &cross, &mut cache)
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_target_positions"), "{err}");

    // Not a Whisper checkpoint: the encoder fixture's config says whisper, a text one not.
    let text = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen2");
    let err = Whisper::load(&text, Some(Dtype::F32))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("not a Whisper checkpoint"), "{err}");
}
