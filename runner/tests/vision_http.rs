//! A model that reads images, served over HTTP (issue 21): the tiny Gemma 3 with its SigLIP
//! tower from `nn/tests/fixtures/gemma3_vision`, imported with a byte-level tokenizer holding
//! Gemma's turn markers and its image tokens at the ids the fixture's config names
//! (`<start_of_image>` 509, `<end_of_image>` 510, the image token 511), driven as a chat client
//! would: a conversation that sends its image again each turn encodes it once and evaluates
//! only what each turn adds; a different image in the same place is encoded and evaluated
//! anew; the answer is the one the model computes directly, through every API that takes
//! images, with prefill chunks that cut across each image and with two image requests batched;
//! a text model refuses images before loading; broken, oversized and hostile media are
//! refused and the server serves on.
//!
//! No download: the fixtures are committed, so this runs everywhere.

mod support;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use mlx::{Array, Dtype};
use nn::Model;
use nn::arch::gemma3_multimodal::{Config, Gemma3Multimodal};
use quant::{SafetensorsFile, Tensor};
use runner::engine::LoopConfig;
use runner::model_name::ModelName;
use runner::store::Store;
use serde_json::{Value, json};
use support::{Server, assert_first_logprobs, base64, get, png, post, start_server_with};

const MODEL: &str = "tiny-gemma3-vision:test";
const TEXT_MODEL: &str = "tiny-gemma3-text:test";
/// The vision fixture with pan and scan on (crops of at least 8 pixels).
const PAN_MODEL: &str = "tiny-gemma3-pan-and-scan:test";

/// Gemma's turns, with the tokenizer's BOS first (no newline right after a block tag, which
/// `trim_blocks` would eat).
const TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}<start_of_turn>\
{{ 'model' if message.role == 'assistant' else message.role }}\n\
{{ message.content }}<end_of_turn>\n{% endfor %}\
{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";

/// Where the 256 bytes start: Gemma's `<pad>`, `<eos>` and `<bos>` come first, at the ids the
/// fixture's config names.
const FIRST_BYTE: u32 = 3;

/// The specials around the bytes, and the image tokens at the config's ids.
const SPECIALS: &[(u32, &str)] = &[
    (0, "<pad>"),
    (1, "<eos>"),
    (2, "<bos>"),
    (259, "<start_of_turn>"),
    (260, "<end_of_turn>"),
    (509, "<start_of_image>"),
    (510, "<end_of_image>"),
    (511, "<image_soft_token>"),
];

/// Image tokens per image (`mm_tokens_per_image`).
const TOKENS_PER_IMAGE: usize = 4;

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

/// The server; the direct computation runs first, on this thread, before the engine's MLX
/// worker exists (two threads must not drive MLX at once).
fn server() -> &'static Server {
    static SERVER: OnceLock<Option<Server>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            references();
            // Prefill chunks of 4 tokens: every image (4 tokens after its start marker) lies
            // across a chunk boundary, which the engine must not cut it at.
            let config = LoopConfig {
                prefill_chunk: 4,
                prefill_budget_while_decoding: 4,
                prefill_budget_idle: 16,
                ..LoopConfig::from_env()
            };
            start_server_with(&[], config, |store| {
                import(store, MODEL, "gemma3_vision");
                import(store, TEXT_MODEL, "gemma3");
                let folder = tokenizer_folder("gemma3_vision");
                let preprocessor = json!({
                    "do_pan_and_scan": true,
                    "pan_and_scan_min_crop_size": 8,
                    "pan_and_scan_max_num_crops": 4,
                    "pan_and_scan_min_ratio_to_activate": 1.2,
                });
                std::fs::write(
                    folder.path().join("preprocessor_config.json"),
                    preprocessor.to_string(),
                )
                .unwrap();
                let name = ModelName::parse(PAN_MODEL).unwrap();
                runner::import::import_path(store, &name, folder.path(), "test", &mut |_, _, _| {})
                    .unwrap();
            })
        })
        .as_ref()
        .expect("the tiny models need no download")
}

/// Imports a fixture with the byte-level tokenizer and Gemma's template.
fn import(store: &Store, model: &str, fixture_name: &str) {
    let folder = tokenizer_folder(fixture_name);
    let name = ModelName::parse(model).unwrap();
    runner::import::import_path(store, &name, folder.path(), "test", &mut |_, _, _| {}).unwrap();
}

/// Gemma's byte-level test vocabulary: [`SPECIALS`] and the bytes from [`FIRST_BYTE`], 512
/// ids as the fixture's.
const VOCABULARY: support::ByteVocabulary = support::ByteVocabulary {
    first_byte: FIRST_BYTE,
    specials: SPECIALS,
    size: 512,
};

/// A folder with the fixture's files, Gemma's byte-level tokenizer and [`TEMPLATE`].
fn tokenizer_folder(fixture_name: &str) -> tempfile::TempDir {
    VOCABULARY.tokenizer_folder(&fixture(fixture_name), TEMPLATE, "<bos>", "<eos>")
}

/// The ids of `text` under the test's tokenizer: specials by name, every other byte alone.
fn ids(text: &str) -> Vec<u32> {
    VOCABULARY.ids(text)
}

/// Gemma 3's processor layout of one image.
fn image_layout() -> String {
    format!(
        "\n\n<start_of_image>{}<end_of_image>\n\n",
        "<image_soft_token>".repeat(TOKENS_PER_IMAGE)
    )
}

/// A 60 x 20 image: pan and scan cuts it into three 20-pixel squares.
fn pan_png() -> Vec<u8> {
    png(60, 20, 9)
}

/// The prompt of a user turn `[pan_png] text` with pan and scan, as transformers 5.24's
/// `Gemma3Processor` lays out an image with three crops.
fn pan_prompt(text: &str) -> String {
    let image = image_layout();
    format!(
        "<bos><start_of_turn>user\nHere is the original image {image} and here are some crops \
         to help you see better {image} {image} {image}{text}<end_of_turn>\n\
         <start_of_turn>model\n"
    )
}

/// The image the direct computation and its HTTP twins use.
fn reference_png() -> Vec<u8> {
    png(48, 40, 200)
}

const REFERENCE_TEXT: &str = "Describe:";
const REFERENCE_TOKENS: usize = 8;

/// The prompt of a user turn `[image] text` as the server renders it.
fn one_turn_prompt(text: &str) -> String {
    format!(
        "<bos><start_of_turn>user\n{}{text}<end_of_turn>\n<start_of_turn>model\n",
        image_layout()
    )
}

/// Images whose answers to [`REFERENCE_TEXT`] are computed directly: [`reference_png`] and
/// two sent at once by `requests_with_images_at_once_answer_as_alone`.
fn reference_images() -> [Vec<u8>; 3] {
    [reference_png(), png(30, 22, 5), png(18, 34, 6)]
}

/// [`references`]' first: the reference image's.
fn reference() -> &'static Reference {
    &references()[0]
}

/// The greedy replies the model computes directly for [`reference_images`] and
/// [`REFERENCE_TEXT`], then for [`pan_png`] with pan and scan ([`pan_prompt`]):
/// `Gemma3Multimodal::forward_with_images` over the whole prompt, then one token at a time,
/// stopping at the tokenizer's stop tokens.
fn references() -> &'static [Reference] {
    static REFERENCES: OnceLock<Vec<Reference>> = OnceLock::new();
    REFERENCES.get_or_init(|| {
        let source = fixture("gemma3_vision");
        let config: Value =
            serde_json::from_slice(&std::fs::read(source.join("config.json")).unwrap()).unwrap();
        let config = Config::from_json(&config).unwrap();
        let file = SafetensorsFile::open(&source.join("model.safetensors")).unwrap();
        let tensors = file
            .entries()
            .keys()
            .map(|name| (name.clone(), Tensor::Dense(file.load(name).unwrap())))
            .collect::<Vec<_>>();
        let mut weights = nn::Weights::new(tensors, Dtype::F32);
        let model = Gemma3Multimodal::new(config, &mut weights).unwrap();
        mlx::eval(&model.parameters()).unwrap();

        let folder = tokenizer_folder("gemma3_vision");
        let tokenizer = tokenizer::Tokenizer::from_hf_dir(folder.path()).unwrap();
        let prompt = ids(&one_turn_prompt(REFERENCE_TEXT));
        assert_eq!(
            tokenizer
                .encode(&one_turn_prompt(REFERENCE_TEXT), false)
                .unwrap(),
            prompt
        );
        let mut references: Vec<Reference> = reference_images()
            .iter()
            .map(|png| {
                let image = media::prepare_image(
                    png,
                    &media::ImageLimits::default(),
                    &media::ImageProcessorConfig::siglip(32),
                )
                .unwrap();
                let pixels = Array::from_slice(&image.pixels.data, &[1, 3, 32, 32]).unwrap();
                let features = model.encode_images(&pixels).unwrap();
                direct_reply(&model, &tokenizer, &prompt, &features)
            })
            .collect();
        // Pan and scan: the whole image and its three 20-pixel crops, each encoded as an
        // image, in the layout Gemma3Processor writes.
        let config = media::ImageProcessorConfig::siglip(32);
        let rgb = media::decode_image(&pan_png(), &media::ImageLimits::default()).unwrap();
        let mut views = vec![rgb.clone()];
        for x in [0, 20, 40] {
            let rect = media::CropRect {
                x,
                y: 0,
                width: 20,
                height: 20,
            };
            views.push(media::crop(&rgb, rect));
        }
        let data: Vec<f32> = views
            .iter()
            .flat_map(|view| media::preprocess(view, &config).unwrap().data)
            .collect();
        let pixels = Array::from_slice(&data, &[4, 3, 32, 32]).unwrap();
        let features = model.encode_images(&pixels).unwrap();
        let prompt = ids(&pan_prompt(REFERENCE_TEXT));
        references.push(direct_reply(&model, &tokenizer, &prompt, &features));
        references
    })
}

/// The greedy reply of `model` to `prompt` with one image's `features`.
fn direct_reply(
    model: &Gemma3Multimodal,
    tokenizer: &tokenizer::Tokenizer,
    prompt: &[u32],
    features: &Array,
) -> Reference {
    let mut caches = model.language_model().new_caches().unwrap();
    let batch = nn::Batch::single(prompt, 0).unwrap();
    let out = model
        .forward_with_images(&batch, Some(features), &mut [&mut caches])
        .unwrap();
    let mut hidden = out.hidden;
    let mut reply = Vec::new();
    let mut first_logprobs = Vec::new();
    for position in prompt.len()..prompt.len() + REFERENCE_TOKENS {
        let last = hidden.slice_axis(1, -1, hidden.dim(1).unwrap()).unwrap();
        let logits = model.language_model().unembed(&last).unwrap();
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
        hidden = model
            .language_model()
            .forward(&batch, &mut caches)
            .unwrap()
            .hidden;
    }
    let text = tokenizer.decode(&reply, true).unwrap();
    eprintln!("direct reply: {reply:?} = {text:?}, first top logprobs {first_logprobs:?}");
    Reference {
        prompt: prompt.to_vec(),
        reply,
        first_logprobs,
    }
}

/// What the model computes directly for the reference image and text.
#[derive(Clone)]
struct Reference {
    /// The prompt's ids.
    prompt: Vec<u32>,
    /// The greedy reply's ids.
    reply: Vec<u32>,
    /// The five largest logprobs of the first reply token.
    first_logprobs: Vec<f32>,
}

/// A greedy chat turn of at most `tokens` tokens; returns the reply and the final object.
fn chat(messages: &[Value], tokens: usize) -> (String, Value) {
    let (status, reply) = post(
        server(),
        "/api/chat",
        json!({
            "model": MODEL,
            "messages": messages,
            "stream": false,
            "options": { "temperature": 0, "num_predict": tokens },
        }),
    );
    assert_eq!(status, 200, "{reply}");
    let text = reply["message"]["content"].as_str().unwrap().to_string();
    (text, reply)
}

/// `mlxkit_images_decoded_total` now (the tests here run one at a time, so a difference is
/// their own).
fn images_decoded() -> u64 {
    let text = reqwest::blocking::get(format!("{}/metrics", server().base))
        .unwrap()
        .text()
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix("mlxkit_images_decoded_total "))
        .map_or(0, |value| value.trim().parse::<f64>().unwrap() as u64)
}

fn count(reply: &Value, field: &str) -> usize {
    reply[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field}: {reply}")) as usize
}

fn user(text: &str, images: &[&[u8]]) -> Value {
    let images: Vec<String> = images.iter().map(|i| base64(i)).collect();
    json!({ "role": "user", "content": text, "images": images })
}

/// The acceptance of issue 21: a conversation re-sends its image each turn, as clients do;
/// the image is encoded once and the second turn evaluates only what it adds. A different
/// image in the same place is encoded and evaluated anew; the first image in a new place is
/// not encoded again (the cache of encoded images) though its tokens are evaluated there.
#[test]
fn an_image_sent_again_is_encoded_once_and_not_evaluated_again() {
    let _serial = serial();
    let a = png(20, 12, 1);
    let b = png(20, 12, 2);
    let question = "What is in the picture?";
    let first = [user(question, &[&a])];
    let decoded = images_decoded();
    let (reply, one) = chat(&first, 6);
    assert_eq!(images_decoded() - decoded, 1);
    let prompt_one = count(&one, "prompt_eval_count") + count(&one, "prompt_cached_count");
    assert_eq!(prompt_one, ids(&one_turn_prompt(question)).len(), "{one}");
    assert_eq!(count(&one, "images_encoded"), 1, "{one}");
    // Other tests on this server may have left the text before the image cached, never
    // anything past it: the image is new.
    let image_start = ids("<bos><start_of_turn>user\n\n\n<start_of_image>").len();
    assert!(count(&one, "prompt_cached_count") <= image_start, "{one}");
    eprintln!(
        "turn 1: prompt {prompt_one}, evaluated {}, encoded {}, reply {reply:?}",
        count(&one, "prompt_eval_count"),
        count(&one, "images_encoded")
    );

    // Turn 2 repeats turn 1 with its image, the reply, and a new question.
    let follow_up = "And the colours?";
    let second = [
        first[0].clone(),
        json!({ "role": "assistant", "content": reply }),
        user(follow_up, &[]),
    ];
    let decoded = images_decoded();
    let (_, two) = chat(&second, 6);
    // Its features are kept: the server leaves it undecoded.
    assert_eq!(images_decoded() - decoded, 0);
    let new_turn = ids(&format!(
        "<end_of_turn>\n<start_of_turn>user\n{follow_up}<end_of_turn>\n<start_of_turn>model\n"
    ))
    .len();
    // The reply's last token was sampled but never fed back (the budget ended it), so the
    // cache holds the reply but that token: it is evaluated with the new turn.
    let unfed = usize::from(one["done_reason"] == "length");
    eprintln!(
        "turn 2: prompt {}, evaluated {}, cached {}, encoded {}; the new turn is {new_turn} \
         tokens, {unfed} reply token never fed",
        count(&two, "prompt_eval_count") + count(&two, "prompt_cached_count"),
        count(&two, "prompt_eval_count"),
        count(&two, "prompt_cached_count"),
        count(&two, "images_encoded")
    );
    assert_eq!(count(&two, "images_encoded"), 0, "{two}");
    assert_eq!(count(&two, "prompt_eval_count"), new_turn + unfed, "{two}");

    // The same words about another image: encoded, and evaluated from the image on.
    let decoded = images_decoded();
    let (_, other) = chat(&[user(question, &[&b])], 6);
    assert_eq!(images_decoded() - decoded, 1);
    eprintln!(
        "another image: prompt {prompt_one}, evaluated {}, cached {}, encoded {}",
        count(&other, "prompt_eval_count"),
        count(&other, "prompt_cached_count"),
        count(&other, "images_encoded")
    );
    assert_eq!(count(&other, "images_encoded"), 1, "{other}");
    assert!(
        count(&other, "prompt_cached_count") <= image_start,
        "no prefix past the first image is reused for another: {other}"
    );

    // The first image again, in a new turn: not encoded (kept by content), but its tokens are
    // new to the prompt there and evaluated.
    let again = "Look again:";
    let third = [
        first[0].clone(),
        json!({ "role": "assistant", "content": reply }),
        user(again, &[&a]),
    ];
    let decoded = images_decoded();
    let (_, three) = chat(&third, 6);
    assert_eq!(images_decoded() - decoded, 0);
    let new_turn = ids(&format!(
        "<end_of_turn>\n<start_of_turn>user\n{}{again}<end_of_turn>\n<start_of_turn>model\n",
        image_layout()
    ))
    .len();
    eprintln!(
        "the image in a new turn: evaluated {}, cached {}, encoded {}",
        count(&three, "prompt_eval_count"),
        count(&three, "prompt_cached_count"),
        count(&three, "images_encoded")
    );
    assert_eq!(count(&three, "images_encoded"), 0, "{three}");
    // Everything turn 2 shared with it is reused (up to a restore point of its sliding-window
    // layers, which restore only where a snapshot was taken); the image is not.
    let prompt_three = count(&three, "prompt_eval_count") + count(&three, "prompt_cached_count");
    let after_image = ids(&format!(
        "<end_of_image>\n\n{again}<end_of_turn>\n<start_of_turn>model\n"
    ))
    .len();
    assert!(count(&three, "prompt_cached_count") >= count(&two, "prompt_cached_count"));
    assert!(
        count(&three, "prompt_eval_count") >= after_image + TOKENS_PER_IMAGE,
        "the image's tokens are evaluated in their new place: {three}"
    );
    assert!(
        count(&three, "prompt_eval_count") < new_turn + unfed + 1,
        "{three}"
    );
    assert_eq!(
        prompt_three,
        count(&two, "prompt_cached_count") + new_turn + unfed
    );
}

/// What the server answers with an image is what the model computes directly, greedy, through
/// `/api/generate` and through OpenAI's `image_url` parts alike.
#[test]
fn the_answer_with_an_image_is_the_models_own() {
    let _serial = serial();
    let Reference {
        prompt,
        reply: expected,
        first_logprobs,
    } = reference().clone();
    let (status, reply) = post(
        server(),
        "/api/generate",
        json!({
            "model": MODEL,
            "prompt": REFERENCE_TEXT,
            "images": [base64(&reference_png())],
            "stream": false,
            "logprobs": true,
            "top_logprobs": 5,
            "options": { "temperature": 0, "num_predict": REFERENCE_TOKENS },
        }),
    );
    assert_eq!(status, 200, "{reply}");
    // The first token's distribution, not only its argmax: the image reached the model as the
    // direct computation gives it.
    assert_first_logprobs(&reply, &first_logprobs);
    assert_eq!(
        count(&reply, "prompt_eval_count") + count(&reply, "prompt_cached_count"),
        prompt.len(),
        "{reply}"
    );
    assert_eq!(count(&reply, "images_encoded"), 1, "{reply}");
    let got: Vec<u8> = reply["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|entry| {
            entry["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8)
                .collect::<Vec<_>>()
        })
        .collect();
    let folder = tokenizer_folder("gemma3_vision");
    let tokenizer = tokenizer::Tokenizer::from_hf_dir(folder.path()).unwrap();
    let want: Vec<u8> = expected
        .iter()
        .flat_map(|&id| tokenizer.decode(&[id], false).unwrap().into_bytes())
        .collect();
    assert_eq!(got, want, "{reply}");
    let text = reply["response"].as_str().unwrap().to_string();
    assert_eq!(text, tokenizer.decode(&expected, true).unwrap(), "{reply}");

    // The same conversation through OpenAI's API: the same answer, the image not encoded again.
    let url = format!("data:image/png;base64,{}", base64(&reference_png()));
    let (status, completion) = post(
        server(),
        "/v1/chat/completions",
        json!({
            "model": MODEL,
            "messages": [{ "role": "user", "content": [
                { "type": "image_url", "image_url": { "url": url } },
                { "type": "text", "text": REFERENCE_TEXT },
            ]}],
            "temperature": 0,
            "max_tokens": REFERENCE_TOKENS,
        }),
    );
    assert_eq!(status, 200, "{completion}");
    assert_eq!(
        completion["choices"][0]["message"]["content"], text,
        "{completion}"
    );
    assert_eq!(completion["usage"]["images_encoded"], 0, "{completion}");
    assert_eq!(completion["usage"]["prompt_tokens"], prompt.len());
}

/// `show` lists `vision` for the model with a tower, not for the text model; the text model
/// refuses an image before it is loaded; broken and oversized images get a 400.
#[test]
fn capabilities_refusals_and_hostile_images() {
    let _serial = serial();
    let (_, show) = post(server(), "/api/show", json!({ "model": MODEL }));
    assert_eq!(
        show["capabilities"],
        json!(["completion", "vision", "tools"]),
        "{show}"
    );
    let (_, show) = post(server(), "/api/show", json!({ "model": TEXT_MODEL }));
    assert_eq!(
        show["capabilities"],
        json!(["completion", "tools"]),
        "{show}"
    );

    let image = base64(&png(8, 8, 3));
    for (path, body) in [
        (
            "/api/chat",
            json!({ "model": TEXT_MODEL, "messages": [user("hi", &[&png(8, 8, 3)])] }),
        ),
        (
            "/api/generate",
            json!({ "model": TEXT_MODEL, "prompt": "hi", "images": [image] }),
        ),
    ] {
        let (status, reply) = post(server(), path, body);
        assert_eq!(status, 400, "{reply}");
        assert!(
            reply.to_string().contains(&format!(
                "model `{}` does not support images",
                ModelName::parse(TEXT_MODEL).unwrap()
            )),
            "{reply}"
        );
    }
    let (_, ps) = get(server(), "/api/ps");
    assert!(
        !ps.to_string().contains("tiny-gemma3-text"),
        "the text model was loaded to refuse an image: {ps}"
    );

    // A PNG cut short: its signature passes, its decoding does not.
    let whole = png(16, 16, 4);
    let truncated = &whole[..whole.len() / 2];
    // A PNG whose header claims 100,000 × 100,000 pixels (40 GB of RGB): refused from the
    // header, before any pixel buffer exists.
    let huge = with_dimensions(&whole, 100_000, 100_000);
    for (what, bytes) in [("truncated", truncated.to_vec()), ("huge", huge)] {
        let (status, reply) = post(
            server(),
            "/api/chat",
            json!({ "model": MODEL, "stream": false,
                    "messages": [user("hi", &[&bytes])] }),
        );
        assert_eq!(status, 400, "{what}: {reply}");
        assert!(
            reply.to_string().contains("invalid image"),
            "{what}: {reply}"
        );
    }
    let (status, reply) = post(
        server(),
        "/api/chat",
        json!({ "model": MODEL, "stream": false,
                "messages": [{ "role": "user", "content": "hi", "images": ["%%%"] }] }),
    );
    assert_eq!(status, 400, "{reply}");
    // A client typing the image token itself cannot make the images and their places disagree.
    let (status, reply) = post(
        server(),
        "/api/chat",
        json!({ "model": MODEL, "stream": false,
                "messages": [user("<image_soft_token> hi", &[&whole])] }),
    );
    assert_eq!(status, 400, "{reply}");
    // The server still serves.
    let (_, ok) = chat(&[user("hi", &[&whole])], 2);
    assert_eq!(count(&ok, "images_encoded"), 1, "{ok}");
}

/// `png` with its IHDR width and height replaced (and the chunk's CRC recomputed).
fn with_dimensions(png: &[u8], width: u32, height: u32) -> Vec<u8> {
    let mut out = png.to_vec();
    // Signature (8), length (4), "IHDR" (4), then width and height.
    out[16..20].copy_from_slice(&width.to_be_bytes());
    out[20..24].copy_from_slice(&height.to_be_bytes());
    let crc = crc32(&out[12..29]);
    out[29..33].copy_from_slice(&crc.to_be_bytes());
    out
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The first `message` item's text of a Responses API response.
fn responses_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item["type"] == "message")
        .and_then(|item| item["content"][0]["text"].as_str())
        .unwrap_or_else(|| panic!("no message: {response}"))
        .to_string()
}

/// Anthropic image blocks and Responses `input_image` parts reach the model as Ollama's images
/// and OpenAI's `image_url` parts do: the same greedy answer, the image not encoded again (the
/// cache of encoded images holds it). A Responses follow-up by `previous_response_id` still
/// holds the earlier turn's image; a screenshot in an Anthropic tool result takes its place in
/// the tool turn.
#[test]
fn anthropic_and_responses_take_images() {
    let _serial = serial();
    // An image of this test's own, so that which test runs first does not matter: its answer
    // through Ollama's API (which `the_answer_with_an_image_is_the_models_own` holds to the
    // model's direct computation) is the one the other APIs must give.
    let image = png(36, 28, 77);
    let data = base64(&image);
    let (text, first) = chat(&[user(REFERENCE_TEXT, &[&image])], REFERENCE_TOKENS);
    assert_eq!(count(&first, "images_encoded"), 1, "{first}");
    let prompt_tokens = count(&first, "prompt_eval_count") + count(&first, "prompt_cached_count");

    let image_block = |data: &str| json!({ "type": "image", "source": { "type": "base64", "media_type": "image/png", "data": data } });
    let (status, message) = post(
        server(),
        "/v1/messages",
        json!({
            "model": MODEL,
            "max_tokens": REFERENCE_TOKENS,
            "temperature": 0,
            "messages": [{ "role": "user", "content": [
                image_block(&data),
                { "type": "text", "text": REFERENCE_TEXT },
            ]}],
        }),
    );
    assert_eq!(status, 200, "{message}");
    assert_eq!(message["content"][0]["text"], text, "{message}");
    assert_eq!(message["usage"]["images_encoded"], 0, "{message}");

    let url = format!("data:image/png;base64,{data}");
    let (status, response) = post(
        server(),
        "/v1/responses",
        json!({
            "model": MODEL,
            "max_output_tokens": REFERENCE_TOKENS,
            "temperature": 0,
            "input": [{ "type": "message", "role": "user", "content": [
                { "type": "input_image", "image_url": url },
                { "type": "input_text", "text": REFERENCE_TEXT },
            ]}],
        }),
    );
    assert_eq!(status, 200, "{response}");
    assert_eq!(responses_text(&response), text, "{response}");
    assert_eq!(response["usage"]["images_encoded"], 0, "{response}");
    // The follow-up's prompt still holds the image (so the usage names it) and reads it, and
    // the turn before, from the prefix cache.
    let (status, follow_up) = post(
        server(),
        "/v1/responses",
        json!({
            "model": MODEL,
            "max_output_tokens": 2,
            "temperature": 0,
            "previous_response_id": response["id"],
            "input": "And?",
        }),
    );
    assert_eq!(status, 200, "{follow_up}");
    assert_eq!(follow_up["usage"]["images_encoded"], 0, "{follow_up}");
    let cached = follow_up["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap() as usize;
    assert!(cached >= prompt_tokens, "{follow_up}");

    // A tool's screenshot, never seen before: encoded once, in the tool turn.
    let screenshot = base64(&png(10, 10, 7));
    let (status, message) = post(
        server(),
        "/v1/messages",
        json!({
            "model": MODEL,
            "max_tokens": 2,
            "temperature": 0,
            "messages": [
                { "role": "user", "content": "Take a screenshot." },
                { "role": "assistant", "content": [
                    { "type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {} },
                ]},
                { "role": "user", "content": [
                    { "type": "tool_result", "tool_use_id": "toolu_1",
                      "content": [image_block(&screenshot)] },
                ]},
            ],
        }),
    );
    assert_eq!(status, 200, "{message}");
    assert_eq!(message["usage"]["images_encoded"], 1, "{message}");

    // Sources the server does not fetch are refused by name.
    let (status, refused) = post(
        server(),
        "/v1/responses",
        json!({
            "model": MODEL,
            "input": [{ "type": "message", "role": "user", "content": [
                { "type": "input_image", "file_id": "file-1" },
            ]}],
        }),
    );
    assert_eq!(status, 400, "{refused}");
    assert!(refused.to_string().contains("file_id"), "{refused}");
}

/// The media crate's hostile corpus (images whose headers lie, truncated files, pixel bombs,
/// WAVs with impossible chunks) sent to the vision model through every API that takes media:
/// each is a 400 naming the problem, and the server goes on serving.
#[test]
fn the_hostile_corpus_is_refused_through_every_api() {
    let _serial = serial();
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../media/tests/corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&corpus)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 20, "the corpus at {}", corpus.display());
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        let data = base64(&std::fs::read(file).unwrap());
        let wav = name.ends_with(".wav");
        let requests = if wav {
            vec![(
                "/v1/chat/completions",
                json!({ "model": MODEL, "messages": [{ "role": "user", "content": [
                    { "type": "input_audio", "input_audio": { "data": data, "format": "wav" } },
                ]}]}),
            )]
        } else {
            vec![
                (
                    "/api/chat",
                    json!({ "model": MODEL, "stream": false, "messages": [
                        { "role": "user", "content": "hi", "images": [data] },
                    ]}),
                ),
                (
                    "/v1/chat/completions",
                    json!({ "model": MODEL, "messages": [{ "role": "user", "content": [
                        { "type": "image_url",
                          "image_url": { "url": format!("data:image/png;base64,{data}") } },
                    ]}]}),
                ),
                (
                    "/v1/messages",
                    json!({ "model": MODEL, "max_tokens": 2, "messages": [
                        { "role": "user", "content": [{ "type": "image", "source": {
                            "type": "base64", "media_type": "image/png", "data": data } }] },
                    ]}),
                ),
            ]
        };
        for (path, body) in requests {
            let (status, reply) = post(server(), path, body);
            assert_eq!(status, 400, "{name} through {path}: {reply}");
            let said = reply.to_string();
            assert!(
                said.contains("invalid image")
                    || said.contains("invalid audio")
                    || said.contains("does not support audio"),
                "{name} through {path}: {reply}"
            );
        }
    }
    let (_, ok) = chat(&[user("hi", &[&png(8, 8, 9)])], 2);
    assert!(count(&ok, "images_encoded") <= 1, "{ok}");
}

/// Two requests with different images sent at once, prefilled in chunks of 4 tokens that
/// batch together and decoded in one batch: each answer, and the first token's top-5
/// logprobs, are what the model computes for it alone.
#[test]
fn requests_with_images_at_once_answer_as_alone() {
    let _serial = serial();
    let images = reference_images();
    let expected = references();
    let folder = tokenizer_folder("gemma3_vision");
    let tokenizer = tokenizer::Tokenizer::from_hf_dir(folder.path()).unwrap();
    let replies: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = images[1..]
            .iter()
            .map(|image| {
                scope.spawn(move || {
                    post(
                        server(),
                        "/api/generate",
                        json!({
                            "model": MODEL,
                            "prompt": REFERENCE_TEXT,
                            "images": [base64(image)],
                            "stream": false,
                            "logprobs": true,
                            "top_logprobs": 5,
                            "options": { "temperature": 0, "num_predict": REFERENCE_TOKENS },
                        }),
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| {
                let (status, reply) = handle.join().unwrap();
                assert_eq!(status, 200, "{reply}");
                reply
            })
            .collect()
    });
    // The two images lead the model to distributions far enough apart for the comparison
    // below to tell them apart.
    let apart = expected[1]
        .first_logprobs
        .iter()
        .zip(&expected[2].first_logprobs)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(apart > 1e-2, "{apart}");
    for (reply, want) in replies.iter().zip(&expected[1..]) {
        assert_first_logprobs(reply, &want.first_logprobs);
        assert_eq!(count(reply, "images_encoded"), 1, "{reply}");
        assert_eq!(
            reply["response"].as_str().unwrap(),
            tokenizer.decode(&want.reply, true).unwrap(),
            "{reply}"
        );
    }
}

/// Pan and scan (issue 21): a long image is shown whole and as crops, each encoded as an image
/// and laid out as Gemma 3's processor does; the first token's top-5 logprobs and the answer
/// are what the model computes from those four images directly, and asking again decodes and
/// encodes none of them.
#[test]
fn a_long_image_is_shown_whole_and_as_crops() {
    let _serial = serial();
    let want = &references()[3];
    let ask = || {
        post(
            server(),
            "/api/generate",
            json!({
                "model": PAN_MODEL,
                "prompt": REFERENCE_TEXT,
                "images": [base64(&pan_png())],
                "stream": false,
                "logprobs": true,
                "top_logprobs": 5,
                "options": { "temperature": 0, "num_predict": REFERENCE_TOKENS },
            }),
        )
    };
    let decoded = images_decoded();
    let (status, reply) = ask();
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        images_decoded() - decoded,
        1,
        "one decode for the image and its crops"
    );
    assert_eq!(count(&reply, "images_encoded"), 4, "{reply}");
    assert_eq!(
        count(&reply, "prompt_eval_count") + count(&reply, "prompt_cached_count"),
        want.prompt.len(),
        "{reply}"
    );
    assert_first_logprobs(&reply, &want.first_logprobs);
    let folder = tokenizer_folder("gemma3_vision");
    let tokenizer = tokenizer::Tokenizer::from_hf_dir(folder.path()).unwrap();
    let text = reply["response"].as_str().unwrap();
    assert_eq!(
        text,
        tokenizer.decode(&want.reply, true).unwrap(),
        "{reply}"
    );

    // Asked again: the image's views are neither decoded nor encoded.
    let decoded = images_decoded();
    let (status, again) = ask();
    assert_eq!(status, 200, "{again}");
    assert_eq!(images_decoded() - decoded, 0);
    assert_eq!(count(&again, "images_encoded"), 0, "{again}");

    // The crops moved the answer: without them (the model without pan and scan, loaded in
    // its place) the same image gives other logprobs.
    let (status, whole) = post(
        server(),
        "/api/generate",
        json!({
            "model": MODEL,
            "prompt": REFERENCE_TEXT,
            "images": [base64(&pan_png())],
            "stream": false,
            "logprobs": true,
            "top_logprobs": 5,
            "options": { "temperature": 0, "num_predict": 1 },
        }),
    );
    assert_eq!(status, 200, "{whole}");
    let apart = (whole["logprobs"][0]["top_logprobs"][1]["logprob"]
        .as_f64()
        .unwrap() as f32
        - want.first_logprobs[1])
        .abs();
    eprintln!("pan and scan against the whole image alone: second logprob {apart} apart");
    assert!(apart > 1e-2, "{apart}");
}
