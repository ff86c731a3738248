//! Qwen2-Audio served over HTTP (issue 21): the tiny Qwen2-Audio from
//! `nn/tests/fixtures/qwen2_audio` (a Whisper-style encoder whose window is 100 mel frames,
//! 1 s, before a Qwen2 decoder), imported with a byte-level tokenizer holding ChatML's specials
//! and the audio markers and token at the config's ids. A clip sent as OpenAI `input_audio`
//! enters the prompt as `<|audio_bos|>`, one `<|AUDIO|>` per encoded row, `<|audio_eos|>`; a
//! clip longer than the window is cut at pauses into segments, each its own such run.
//!
//! Each answer is compared with what the model computes directly (`Qwen2Audio` on `media`'s
//! log-mel features of the same segments, one forward over the prompt, then a token at a
//! time): the greedy reply exactly, the first token's top-5 logprobs within 1e-4, the f32
//! parity bound of `nn/tests/audio.rs` (the server prefills in other chunks, which changes only
//! summation order).
//!
//! No download: the fixture is committed, so this runs everywhere.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use mlx::{Array, Dtype};
use nn::arch::qwen2_audio::{Config, Qwen2Audio};
use nn::{Audio, Model};
use quant::{SafetensorsFile, Tensor};
use runner::engine::LoopConfig;
use runner::model_name::ModelName;
use serde_json::{Value, json};
use support::{ByteVocabulary, Server, base64, get, post, start_server_with};

const MODEL: &str = "tiny-qwen2-audio:test";
const TEXT_MODEL: &str = "tiny-qwen2-text:test";

/// ChatML, as Qwen's templates write it (no system turn unless one is sent).
const TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n\
{{ message.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The byte-level vocabulary: `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` at 0–2 (the
/// fixture's config names EOS 2), the bytes from 3, and the audio markers and token at 507–509
/// (the config's `audio_token_index` is 509).
const VOCABULARY: ByteVocabulary = ByteVocabulary {
    first_byte: 3,
    specials: &[
        (0, "<|endoftext|>"),
        (1, "<|im_start|>"),
        (2, "<|im_end|>"),
        (507, "<|audio_bos|>"),
        (508, "<|audio_eos|>"),
        (509, "<|AUDIO|>"),
    ],
    size: 512,
};

/// The encoder's window: 100 frames of 160 samples at 16 kHz.
const WINDOW_SECONDS: f64 = 1.0;

/// Tests share one server and count encodes: one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nn/tests/fixtures")
        .join(name)
}

fn tokenizer_folder(name: &str) -> tempfile::TempDir {
    VOCABULARY.tokenizer_folder(&fixture(name), TEMPLATE, "<|endoftext|>", "<|im_end|>")
}

/// The server, with the audio model and a text-only Qwen2; the direct computation runs first,
/// on this thread, before the engine's MLX worker exists (two threads must not drive MLX at
/// once).
fn server() -> &'static Server {
    static SERVER: OnceLock<Option<Server>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            direct();
            // Prefill chunks of 4 tokens: every segment's run lies across chunk boundaries,
            // which the engine must not cut it at.
            let config = LoopConfig {
                prefill_chunk: 4,
                prefill_budget_while_decoding: 4,
                prefill_budget_idle: 16,
                ..LoopConfig::from_env()
            };
            start_server_with(&[], config, |store| {
                for (model, fixture_name) in [(MODEL, "qwen2_audio"), (TEXT_MODEL, "qwen2")] {
                    let folder = tokenizer_folder(fixture_name);
                    let name = ModelName::parse(model).unwrap();
                    runner::import::import_path(
                        store,
                        &name,
                        folder.path(),
                        "test",
                        &mut |_, _, _| {},
                    )
                    .unwrap();
                }
            })
        })
        .as_ref()
        .expect("the tiny models need no download")
}

/// A mono 16-bit PCM WAV of `seconds` at `rate`: a tone whose pitch follows `seed`, with a
/// quiet gap every 0.4 s so a long clip has pauses to be cut at.
fn wav(seconds: f64, rate: u32, seed: u32) -> Vec<u8> {
    let frames = (seconds * f64::from(rate)) as u32;
    let mut out = Vec::with_capacity(44 + 2 * frames as usize);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + frames * 2).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes()); // PCM
    out.extend_from_slice(&1u16.to_le_bytes()); // mono
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&(rate * 2).to_le_bytes()); // byte rate
    out.extend_from_slice(&2u16.to_le_bytes()); // block align
    out.extend_from_slice(&16u16.to_le_bytes()); // bits
    out.extend_from_slice(b"data");
    out.extend_from_slice(&(frames * 2).to_le_bytes());
    let pitch = 220.0 + 37.0 * f64::from(seed);
    for n in 0..frames {
        let t = f64::from(n) / f64::from(rate);
        let gap = (t % 0.4) > 0.33;
        let value = if gap {
            0.0
        } else {
            0.5 * (2.0 * std::f64::consts::PI * pitch * t).sin()
        };
        out.extend_from_slice(&((value * 32767.0) as i16).to_le_bytes());
    }
    out
}

/// 0.8 s at 24 kHz: one segment, resampled.
fn short_clip() -> Vec<u8> {
    wav(0.8, 24_000, 1)
}

/// 2.5 s at 16 kHz: three segments.
fn long_clip() -> Vec<u8> {
    wav(2.5, 16_000, 2)
}

/// The conversation test's clip: its own, so no other test has encoded or cached it.
fn conversation_clip() -> Vec<u8> {
    wav(0.9, 16_000, 3)
}

/// The segments of `clip` as the server cuts them, as log-mel features of the encoder's
/// window.
fn segments(clip: &[u8]) -> Vec<media::LogMel> {
    let limits = media::AudioLimits::default();
    let prepared = media::prepare_audio(clip, &limits, 16_000).unwrap();
    let pieces = if prepared.clip.duration_seconds() > WINDOW_SECONDS {
        media::split(&prepared.clip, WINDOW_SECONDS).unwrap()
    } else {
        vec![prepared.clip]
    };
    let config = media::LogMelConfig {
        chunk_length: 1,
        ..media::LogMelConfig::whisper(128)
    };
    pieces
        .iter()
        .map(|piece| media::log_mel(piece, &config, &limits).unwrap())
        .collect()
}

/// A clip's place in the prompt: per segment, its audio tokens between the markers.
fn audio_layout(model: &Qwen2Audio, clip: &[u8]) -> String {
    segments(clip)
        .iter()
        .map(|mel| {
            format!(
                "<|audio_bos|>{}<|audio_eos|>",
                "<|AUDIO|>".repeat(model.audio_tokens(mel.valid_frames))
            )
        })
        .collect()
}

const QUESTION: &str = "What is this?";
const TOKENS: usize = 8;
const FOLLOW_UP: &str = "Why?";

/// What the model computes directly for one prompt.
#[derive(Clone, Debug)]
struct Reference {
    /// The prompt's ids.
    prompt: Vec<u32>,
    /// The greedy reply's ids.
    reply: Vec<u32>,
    /// The five largest logprobs of the first reply token.
    first_logprobs: Vec<f32>,
    /// Audio segments in the prompt.
    segments: usize,
}

struct Direct {
    short: Reference,
    long: Reference,
    /// The conversation's first turn, and its clip's layout.
    first_turn: Reference,
    first_layout: String,
}

fn user_turn(layout: &str, text: &str) -> String {
    format!("<|im_start|>user\n{layout}{text}<|im_end|>\n")
}

const ASSISTANT: &str = "<|im_start|>assistant\n";

fn direct() -> &'static Direct {
    static DIRECT: OnceLock<Direct> = OnceLock::new();
    DIRECT.get_or_init(|| {
        let dir = fixture("qwen2_audio");
        let config: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let config = Config::from_json(&config).unwrap();
        let file = SafetensorsFile::open(&dir.join("model.safetensors")).unwrap();
        let tensors = file
            .entries()
            .keys()
            .map(|name| (name.clone(), Tensor::Dense(file.load(name).unwrap())))
            .collect::<Vec<_>>();
        let mut weights = nn::Weights::new(tensors, Dtype::F32);
        let model = Qwen2Audio::new(config, &mut weights).unwrap();
        mlx::eval(&model.parameters()).unwrap();
        let folder = tokenizer_folder("qwen2_audio");
        let tokenizer = tokenizer::Tokenizer::from_hf_dir(folder.path()).unwrap();
        let one = |clip: &[u8]| {
            let prompt = format!(
                "{}{ASSISTANT}",
                user_turn(&audio_layout(&model, clip), QUESTION)
            );
            greedy(&model, &tokenizer, &prompt, &[clip], TOKENS)
        };
        Direct {
            short: one(&short_clip()),
            long: one(&long_clip()),
            first_turn: one(&conversation_clip()),
            first_layout: audio_layout(&model, &conversation_clip()),
        }
    })
}

/// The greedy reply of the model for the `rendered` prompt holding `clips`: each segment's
/// features encoded alone, the prompt in one forward at position 0, then one token at a time,
/// at most `tokens`, stopping at the tokenizer's stop tokens.
fn greedy(
    model: &Qwen2Audio,
    tokenizer: &tokenizer::Tokenizer,
    rendered: &str,
    clips: &[&[u8]],
    tokens: usize,
) -> Reference {
    let prompt = VOCABULARY.ids(rendered);
    assert_eq!(tokenizer.encode(rendered, false).unwrap(), prompt);
    let mut rows = Vec::new();
    for clip in clips {
        for mel in segments(clip) {
            let features = Array::from_slice(&mel.features, &[1, 128, mel.frames as i32]).unwrap();
            rows.push(model.encode_audio(&features, mel.valid_frames).unwrap());
        }
    }
    let features = mlx::concatenate(&rows, 0).unwrap();
    let mut caches = model.new_caches().unwrap();
    let batch = nn::Batch::single(&prompt, 0).unwrap();
    let out = model
        .forward_rows_with_audio(&batch, Some(&features), &mut [&mut caches[..]])
        .unwrap();
    let mut hidden = out.hidden;
    let mut reply = Vec::new();
    let mut first_logprobs = Vec::new();
    for position in prompt.len()..prompt.len() + tokens {
        let last = hidden.slice_axis(1, -1, hidden.dim(1).unwrap()).unwrap();
        let logits = model.unembed(&last).unwrap();
        if first_logprobs.is_empty() {
            let values = logits.reshape(&[-1]).unwrap().to_vec::<f32>().unwrap();
            let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = values.iter().map(|v| (v - max).exp()).sum();
            let mut logprobs: Vec<f32> = values.iter().map(|v| v - max - sum.ln()).collect();
            logprobs.sort_by(|a, b| b.total_cmp(a));
            first_logprobs = logprobs[..5].to_vec();
        }
        let next = logits
            .argmax(-1, false)
            .unwrap()
            .astype(Dtype::I32)
            .unwrap();
        let next = next.to_vec::<i32>().unwrap()[0] as u32;
        if tokenizer.stop_tokens().contains(&next) {
            break;
        }
        reply.push(next);
        let batch = nn::Batch::single(&[next], position).unwrap();
        hidden = model.forward(&batch, &mut caches).unwrap().hidden;
    }
    eprintln!(
        "direct: {} prompt tokens, {} segments, reply {reply:?}, first top logprobs \
         {first_logprobs:?}",
        prompt.len(),
        rows.len()
    );
    Reference {
        prompt,
        reply,
        first_logprobs,
        segments: rows.len(),
    }
}

fn decode(ids: &[u32]) -> String {
    let folder = tokenizer_folder("qwen2_audio");
    let tokenizer = tokenizer::Tokenizer::from_hf_dir(folder.path()).unwrap();
    tokenizer.decode(ids, true).unwrap()
}

/// An OpenAI user message: the clip as an `input_audio` part, then `text`.
fn audio_message(clip: &[u8], text: &str) -> Value {
    json!({ "role": "user", "content": [
        { "type": "input_audio", "input_audio": { "data": base64(clip), "format": "wav" } },
        { "type": "text", "text": text },
    ]})
}

/// A greedy `/v1/chat/completions` answer of at most `tokens` tokens, with the first token's
/// top-5 logprobs.
fn complete(model: &str, messages: &[Value], tokens: usize) -> (u16, Value) {
    post(
        server(),
        "/v1/chat/completions",
        json!({
            "model": model,
            "messages": messages,
            "temperature": 0,
            "max_tokens": tokens,
            "logprobs": true,
            "top_logprobs": 5,
        }),
    )
}

fn usage(reply: &Value, field: &str) -> usize {
    reply["usage"][field]
        .as_u64()
        .unwrap_or_else(|| panic!("no usage.{field}: {reply}")) as usize
}

fn cached(reply: &Value) -> usize {
    reply["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached tokens: {reply}")) as usize
}

/// The served answer is `want`'s: the text, the first token's top-5 logprobs within 1e-4,
/// the prompt's length and its segments.
fn assert_matches(reply: &Value, want: &Reference) {
    support::assert_top_logprobs(
        &reply["choices"][0]["logprobs"]["content"][0]["top_logprobs"],
        &want.first_logprobs,
        reply,
    );
    assert_eq!(
        reply["choices"][0]["message"]["content"].as_str().unwrap(),
        decode(&want.reply),
        "{reply}"
    );
    assert_eq!(usage(reply, "prompt_tokens"), want.prompt.len(), "{reply}");
}

/// What the server answers with a clip is what the model computes directly, greedy: a short
/// clip (resampled from 24 kHz, one segment) and a long one (three segments, each its own run
/// of audio tokens); `show` lists audio.
#[test]
fn the_answer_with_audio_is_the_models_own() {
    let _serial = serial();
    let short = &direct().short;
    assert_eq!(short.segments, 1);
    let (status, reply) = complete(MODEL, &[audio_message(&short_clip(), QUESTION)], TOKENS);
    assert_eq!(status, 200, "{reply}");
    assert_matches(&reply, short);
    assert_eq!(usage(&reply, "audio_encoded"), 1, "{reply}");

    let long = &direct().long;
    assert_eq!(long.segments, 3);
    let (status, reply) = complete(MODEL, &[audio_message(&long_clip(), QUESTION)], TOKENS);
    assert_eq!(status, 200, "{reply}");
    assert_matches(&reply, long);
    assert_eq!(usage(&reply, "audio_encoded"), 3, "{reply}");
    // The segments' tokens change the answer's distribution (the check above tells the clips
    // apart).
    let apart = long
        .first_logprobs
        .iter()
        .zip(&short.first_logprobs)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(apart > 1e-3, "{apart}");

    let (_, show) = post(server(), "/api/show", json!({ "model": MODEL }));
    assert_eq!(
        show["capabilities"],
        json!(["completion", "audio", "tools"]),
        "{show}"
    );
    let (_, show) = post(server(), "/api/show", json!({ "model": TEXT_MODEL }));
    assert_eq!(
        show["capabilities"],
        json!(["completion", "tools"]),
        "{show}"
    );
}

/// A conversation re-sends its clip each turn; the clip is encoded once, and the second turn
/// evaluates only what the first did not feed (its cached prefix, audio included, restored).
#[test]
fn a_clip_sent_again_is_encoded_once_and_not_evaluated_again() {
    let _serial = serial();
    let Direct {
        first_turn,
        first_layout,
        ..
    } = direct();
    let first = [audio_message(&conversation_clip(), QUESTION)];
    let (status, one) = complete(MODEL, &first, TOKENS);
    assert_eq!(status, 200, "{one}");
    assert_matches(&one, first_turn);
    assert_eq!(usage(&one, "audio_encoded"), 1, "{one}");
    let reply = one["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();

    let second = [
        first[0].clone(),
        json!({ "role": "assistant", "content": reply }),
        json!({ "role": "user", "content": FOLLOW_UP }),
    ];
    let (status, two) = complete(MODEL, &second, TOKENS);
    assert_eq!(status, 200, "{two}");
    let prompt_two = VOCABULARY.ids(&format!(
        "{}{ASSISTANT}{reply}<|im_end|>\n{}{ASSISTANT}",
        user_turn(first_layout, QUESTION),
        user_turn("", FOLLOW_UP)
    ));
    assert_eq!(usage(&two, "prompt_tokens"), prompt_two.len(), "{two}");
    // What turn 1 fed the model: its prompt and its reply but the last token when the budget
    // cut it (sampled, never fed back).
    let generated = &first_turn.reply;
    let unfed = usize::from(one["choices"][0]["finish_reason"] == "length");
    let fed: Vec<u32> = first_turn
        .prompt
        .iter()
        .chain(&generated[..generated.len() - unfed])
        .copied()
        .collect();
    let shared = fed
        .iter()
        .zip(&prompt_two)
        .take_while(|(a, b)| a == b)
        .count();
    eprintln!(
        "turn 1: prompt {}, reply {generated:?} = {reply:?}; turn 2: prompt {}, cached {}, \
         encoded {}; it shares {shared} tokens with what turn 1 fed",
        first_turn.prompt.len(),
        prompt_two.len(),
        cached(&two),
        usage(&two, "audio_encoded"),
    );
    // The random reply need not come back as the same tokens: turn 2 holds at least turn 1's
    // prompt, its clip included.
    assert!(
        shared >= first_turn.prompt.len(),
        "turn 2 holds turn 1's prompt"
    );
    assert_eq!(usage(&two, "audio_encoded"), 0, "{two}");
    assert_eq!(cached(&two), shared, "{two}");
}

/// The text model refuses audio before it is loaded; truncated, lying and oversized clips get
/// a 400 naming the problem, and the server keeps serving.
#[test]
fn refusals_and_hostile_audio() {
    let _serial = serial();
    let (status, reply) = complete(TEXT_MODEL, &[audio_message(&short_clip(), "hi")], 4);
    assert_eq!(status, 400, "{reply}");
    let text_model = ModelName::parse(TEXT_MODEL).unwrap();
    assert!(
        reply
            .to_string()
            .contains(&format!("model `{text_model}` does not support audio")),
        "{reply}"
    );
    let (_, ps) = get(server(), "/api/ps");
    assert!(
        !ps.to_string().contains("tiny-qwen2-text"),
        "the text model was loaded to refuse audio: {ps}"
    );

    let whole = short_clip();
    // Cut short: the data chunk claims more samples than the bytes hold.
    let truncated = whole[..whole.len() / 2].to_vec();
    // A header claiming 1 Hz: a tiny file that would last hours.
    let mut one_hertz = whole.clone();
    one_hertz[24..28].copy_from_slice(&1u32.to_le_bytes());
    one_hertz[28..32].copy_from_slice(&2u32.to_le_bytes());
    // A header claiming 20 minutes at 16 kHz over 0.1 s of samples.
    let mut long_header = wav(0.1, 16_000, 4);
    let claimed = 16_000u32 * 2 * 1200;
    long_header[40..44].copy_from_slice(&claimed.to_le_bytes());
    // A whole clip over the 10 minute cap (1.2 MB at 1 kHz), refused from its header.
    let too_long = wav(601.0, 1_000, 4);
    // Not a WAV at all, but sent as one.
    let noise = b"RIFF\x10\0\0\0WAVEjunkjunkjunk".to_vec();
    for (what, bytes) in [
        ("truncated", truncated),
        ("1 Hz", one_hertz),
        ("20 minutes", long_header),
        ("601 s", too_long),
        ("junk", noise),
    ] {
        let (status, reply) = complete(MODEL, &[audio_message(&bytes, "hi")], 4);
        eprintln!("{what}: {status} {reply}");
        assert_eq!(status, 400, "{what}: {reply}");
        assert!(
            reply.to_string().contains("invalid audio"),
            "{what}: {reply}"
        );
    }
    // 30 s in 1 s windows: more audio tokens than the model's context of 256, refused from
    // the segments' lengths before any features are computed.
    let (status, reply) = complete(MODEL, &[audio_message(&wav(30.0, 16_000, 6), "hi")], 4);
    assert_eq!(status, 400, "{reply}");
    assert!(
        reply
            .to_string()
            .contains("more than the model's context of 256"),
        "{reply}"
    );
    // A clip in a format the server does not decode.
    let (status, reply) = post(
        server(),
        "/v1/chat/completions",
        json!({ "model": MODEL, "messages": [{ "role": "user", "content": [
            { "type": "input_audio", "input_audio": { "data": base64(&whole), "format": "mp3" } },
        ]}]}),
    );
    assert_eq!(status, 400, "{reply}");
    // Still serving (a clip of its own: the other tests count encodes of theirs).
    let (status, reply) = complete(MODEL, &[audio_message(&wav(0.5, 16_000, 5), QUESTION)], 2);
    assert_eq!(status, 200, "{reply}");
    assert_eq!(usage(&reply, "audio_encoded"), 1, "{reply}");
}
