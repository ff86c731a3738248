//! Qwen2.5-VL served over HTTP (issue 21): the tiny Qwen2.5-VL from
//! `nn/tests/fixtures/qwen2_5_vl` (a windowed vision tower over 4-pixel patches merged 2×2, a
//! Qwen2 decoder with M-RoPE), imported with a byte-level tokenizer holding the fixture's
//! special ids, a ChatML template and a `preprocessor_config.json` whose pixel budget (1,024 to
//! 4,096 pixels) replaces the processor's default one. An image enters the prompt as
//! `<|vision_start|>`, one `<|image_pad|>` per merged block of its grid, `<|vision_end|>`; the
//! text after it sits at rotary positions some way from its cache positions, which the engine
//! carries per sequence through prefill chunks (4 tokens, so images lie across chunk
//! boundaries and text chunks follow them), decode steps and the prefix cache.
//!
//! Each answer is compared with what the model computes directly (`Qwen25Vl` on `media`'s
//! patches, one forward over the prompt, then a token at a time at cache position plus the
//! rope delta): the greedy reply exactly, the first token's top-5 logprobs within 1e-4, the
//! f32 parity bound of `nn/tests/vision.rs` (the server prefills in other chunks and encodes
//! images one at a time, which changes only summation order).
//!
//! No download: the fixture is committed, so this runs everywhere.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use mlx::{Array, Dtype};
use nn::arch::qwen2_5_vl::{Config, Qwen25Vl};
use nn::{ImageGrid, Model, Vision};
use quant::{SafetensorsFile, Tensor};
use runner::engine::LoopConfig;
use runner::model_name::ModelName;
use serde_json::{Value, json};
use support::{
    ByteVocabulary, Server, assert_first_logprobs, base64, png, post, start_server_with,
};

const MODEL: &str = "tiny-qwen2.5-vl:test";

/// ChatML, as Qwen's templates write it (no system turn unless one is sent).
const TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n\
{{ message.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The byte-level vocabulary: `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` at 0–2 (the
/// fixture's config names EOS 2), the bytes from 3, and the vision specials at the ids the
/// config names (508–511).
const VOCABULARY: ByteVocabulary = ByteVocabulary {
    first_byte: 3,
    specials: &[
        (0, "<|endoftext|>"),
        (1, "<|im_start|>"),
        (2, "<|im_end|>"),
        (508, "<|vision_start|>"),
        (509, "<|vision_end|>"),
        (510, "<|video_pad|>"),
        (511, "<|image_pad|>"),
    ],
    size: 512,
};

/// The checkpoint's image processor: the encoder's patch sizes, and a pixel budget of its
/// own, so an image's grid (hence its tokens) depends on the server reading this file.
const MIN_PIXELS: u64 = 1024;
const MAX_PIXELS: u64 = 4096;

fn processor() -> media::PatchProcessorConfig {
    media::PatchProcessorConfig {
        patch_size: 4,
        merge_size: 2,
        temporal_patch_size: 2,
        min_pixels: MIN_PIXELS,
        max_pixels: MAX_PIXELS,
        ..media::PatchProcessorConfig::qwen2_vl()
    }
}

/// Tests share one server and count encodes: one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/tests/fixtures/qwen2_5_vl")
}

/// The fixture's files, the byte-level tokenizer and the processor's config.
fn tokenizer_folder() -> tempfile::TempDir {
    let folder = VOCABULARY.tokenizer_folder(&fixture(), TEMPLATE, "<|endoftext|>", "<|im_end|>");
    let preprocessor = json!({
        "image_processor_type": "Qwen2VLImageProcessor",
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
        "patch_size": 4,
        "merge_size": 2,
        "temporal_patch_size": 2,
    });
    std::fs::write(
        folder.path().join("preprocessor_config.json"),
        preprocessor.to_string(),
    )
    .unwrap();
    folder
}

/// The server; the direct computation runs first, on this thread, before the engine's MLX
/// worker exists (two threads must not drive MLX at once).
fn server() -> &'static Server {
    static SERVER: OnceLock<Option<Server>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            direct();
            // Prefill chunks of 4 tokens: every image lies across chunk boundaries, which the
            // engine must not cut it at, and text chunks after an image carry its delta.
            let config = LoopConfig {
                prefill_chunk: 4,
                prefill_budget_while_decoding: 4,
                prefill_budget_idle: 16,
                ..LoopConfig::from_env()
            };
            start_server_with(&[], config, |store| {
                let folder = tokenizer_folder();
                let name = ModelName::parse(MODEL).unwrap();
                runner::import::import_path(store, &name, folder.path(), "test", &mut |_, _, _| {})
                    .unwrap();
            })
        })
        .as_ref()
        .expect("the tiny model needs no download")
}

/// An image's place in the prompt: its grid's merged tokens between the vision markers.
fn image_layout(png: &[u8]) -> String {
    let (width, height) = media::upright_dimensions(png, &media::ImageLimits::default()).unwrap();
    let grid = processor().grid(width, height).unwrap();
    format!(
        "<|vision_start|>{}<|vision_end|>",
        "<|image_pad|>".repeat(grid.tokens(2))
    )
}

/// The prompt of a user turn `[images] text` as the server renders it.
fn one_turn_prompt(text: &str, images: &[&[u8]]) -> String {
    let layouts: String = images.iter().map(|png| image_layout(png)).collect();
    format!("<|im_start|>user\n{layouts}{text}<|im_end|>\n<|im_start|>assistant\n")
}

/// 48×40: inside the budget, 10×12 patches, 30 tokens.
fn reference_png() -> Vec<u8> {
    png(48, 40, 200)
}

/// 24×40: below the budget's least area, enlarged to 32×48 (12×8 patches, 24 tokens).
fn second_png() -> Vec<u8> {
    png(24, 40, 90)
}

const REFERENCE_TEXT: &str = "Describe:";
const REFERENCE_TOKENS: usize = 8;

/// The first turn of the conversation test.
fn first_png() -> Vec<u8> {
    png(30, 70, 1)
}
const FIRST_QUESTION: &str = "What is in it?";
const FIRST_TOKENS: usize = 6;
const FOLLOW_UP: &str = "Why?";
const SECOND_TOKENS: usize = 6;

/// The conversation's second turn as the server renders it, after `reply` (the first turn's
/// text as the client sends it back).
fn second_turn_prompt(reply: &str) -> String {
    format!(
        "{}{reply}<|im_end|>\n<|im_start|>user\n{FOLLOW_UP}<|im_end|>\n<|im_start|>assistant\n",
        one_turn_prompt(FIRST_QUESTION, &[&first_png()])
    )
}

/// The batch test's images: its own, so no other test has encoded or cached them (40×48:
/// 12×10 patches; 64×40: over the budget, shrunk to 48×32, 8×12 patches).
fn batched_pngs() -> [Vec<u8>; 2] {
    [png(40, 48, 33), png(64, 40, 7)]
}

/// The text-only request decoded beside an image's.
const TEXT_PROMPT: &str = "Tell me a story about a lighthouse.";
const TEXT_TOKENS: usize = 12;

/// What the model computes directly for one prompt.
#[derive(Clone, Debug)]
struct Reference {
    /// The prompt's ids.
    prompt: Vec<u32>,
    /// The greedy reply's ids.
    reply: Vec<u32>,
    /// The five largest logprobs of the first reply token.
    first_logprobs: Vec<f32>,
}

/// Every reference the tests compare with, computed before the server starts.
struct Direct {
    /// The reference image and text.
    reference: Reference,
    /// Two images of different sizes, then the text.
    two_images: Reference,
    /// The first turn of the conversation test.
    first_turn: Reference,
    /// Its second turn: the first, its reply as the client sends it back, [`FOLLOW_UP`].
    second_turn: Reference,
    /// The batch test's two images, then the text.
    batched: Reference,
    /// Text alone.
    text: Reference,
}

fn direct() -> &'static Direct {
    static DIRECT: OnceLock<Direct> = OnceLock::new();
    DIRECT.get_or_init(|| {
        let config: Value =
            serde_json::from_slice(&std::fs::read(fixture().join("config.json")).unwrap()).unwrap();
        let config = Config::from_json(&config).unwrap();
        let file = SafetensorsFile::open(&fixture().join("model.safetensors")).unwrap();
        let tensors = file
            .entries()
            .keys()
            .map(|name| (name.clone(), Tensor::Dense(file.load(name).unwrap())))
            .collect::<Vec<_>>();
        let mut weights = nn::Weights::new(tensors, Dtype::F32);
        let model = Qwen25Vl::new(config, &mut weights).unwrap();
        mlx::eval(&model.parameters()).unwrap();
        let folder = tokenizer_folder();
        let tokenizer = tokenizer::Tokenizer::from_hf_dir(folder.path()).unwrap();
        let (a, b, c) = (reference_png(), second_png(), first_png());
        let [d, e] = batched_pngs();
        let one = |text: &str, images: &[&[u8]]| one_turn_prompt(text, images);
        let first_turn = greedy(
            &model,
            &tokenizer,
            &one(FIRST_QUESTION, &[&c]),
            &[&c],
            FIRST_TOKENS,
        );
        let sent_back = tokenizer.decode(&first_turn.reply, true).unwrap();
        Direct {
            reference: greedy(
                &model,
                &tokenizer,
                &one(REFERENCE_TEXT, &[&a]),
                &[&a],
                REFERENCE_TOKENS,
            ),
            two_images: greedy(
                &model,
                &tokenizer,
                &one(REFERENCE_TEXT, &[&a, &b]),
                &[&a, &b],
                REFERENCE_TOKENS,
            ),
            second_turn: greedy(
                &model,
                &tokenizer,
                &second_turn_prompt(&sent_back),
                &[&c],
                SECOND_TOKENS,
            ),
            first_turn,
            batched: greedy(
                &model,
                &tokenizer,
                &one(REFERENCE_TEXT, &[&d, &e]),
                &[&d, &e],
                REFERENCE_TOKENS,
            ),
            text: greedy(&model, &tokenizer, &one(TEXT_PROMPT, &[]), &[], TEXT_TOKENS),
        }
    })
}

/// The greedy reply of the model for the `rendered` prompt holding `images`: the images'
/// patches as `media` prepares them encoded in one call, the prompt in one forward at
/// position 0, then one token at a time at its cache position plus the prompt's rope delta,
/// at most `tokens`, stopping at the tokenizer's stop tokens.
fn greedy(
    model: &Qwen25Vl,
    tokenizer: &tokenizer::Tokenizer,
    rendered: &str,
    images: &[&[u8]],
    tokens: usize,
) -> Reference {
    let prompt = VOCABULARY.ids(rendered);
    assert_eq!(tokenizer.encode(rendered, false).unwrap(), prompt);
    let mut grids = Vec::new();
    let mut data = Vec::new();
    for png in images {
        let prepared =
            media::prepare_image_patches(png, &media::ImageLimits::default(), &processor())
                .unwrap();
        let g = prepared.patches.grid;
        grids.push(ImageGrid {
            t: g.t as usize,
            h: g.h as usize,
            w: g.w as usize,
        });
        data.extend_from_slice(&prepared.patches.data);
    }
    let features = (!images.is_empty()).then(|| {
        let rows = grids.iter().map(|g| g.patches()).sum::<usize>() as i32;
        let patches =
            Array::from_slice(&data, &[rows, (data.len() / rows as usize) as i32]).unwrap();
        model.encode_images(&patches, &grids).unwrap()
    });
    let delta = model.rope_delta(&prompt, &grids).unwrap();

    let mut caches = model.new_caches().unwrap();
    let batch = nn::Batch::single(&prompt, 0).unwrap();
    let out = model
        .forward_with_images(&batch, features.as_ref(), &grids, &mut [&mut caches])
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
        let batch = nn::Batch::single(&[next], position)
            .unwrap()
            .with_rope_deltas(vec![delta])
            .unwrap();
        hidden = model.forward(&batch, &mut caches).unwrap().hidden;
    }
    let text = tokenizer.decode(&reply, true).unwrap();
    eprintln!(
        "direct: {} prompt tokens, {} images, delta {delta}, reply {reply:?} = {text:?}, first \
         top logprobs {first_logprobs:?}",
        prompt.len(),
        images.len()
    );
    Reference {
        prompt,
        reply,
        first_logprobs,
    }
}

fn generate(text: &str, images: &[&[u8]], tokens: usize) -> Value {
    let images: Vec<String> = images.iter().map(|i| base64(i)).collect();
    let (status, reply) = post(
        server(),
        "/api/generate",
        json!({
            "model": MODEL,
            "prompt": text,
            "images": images,
            "stream": false,
            "logprobs": true,
            "top_logprobs": 5,
            "options": { "temperature": 0, "num_predict": tokens },
        }),
    );
    assert_eq!(status, 200, "{reply}");
    reply
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

fn count(reply: &Value, field: &str) -> usize {
    reply[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field}: {reply}")) as usize
}

fn user(text: &str, images: &[&[u8]]) -> Value {
    let images: Vec<String> = images.iter().map(|i| base64(i)).collect();
    json!({ "role": "user", "content": text, "images": images })
}

fn decode(ids: &[u32]) -> String {
    let folder = tokenizer_folder();
    let tokenizer = tokenizer::Tokenizer::from_hf_dir(folder.path()).unwrap();
    tokenizer.decode(ids, true).unwrap()
}

/// The served `/api/generate` reply is `want`'s: the text, the first token's top-5 logprobs
/// within 1e-4 (returned: how far apart), and the prompt's length.
fn assert_matches(reply: &Value, want: &Reference) -> f32 {
    let worst = assert_first_logprobs(reply, &want.first_logprobs);
    assert_eq!(
        reply["response"].as_str().unwrap(),
        decode(&want.reply),
        "{reply}"
    );
    assert_eq!(
        count(reply, "prompt_eval_count") + count(reply, "prompt_cached_count"),
        want.prompt.len(),
        "{reply}"
    );
    worst
}

/// What the server answers with an image is what the model computes directly, greedy, through
/// `/api/generate` and through OpenAI's `image_url` parts alike (the second encoding nothing);
/// two images of different sizes in one prompt too; `show` lists vision.
#[test]
fn the_answer_with_images_is_the_models_own() {
    let _serial = serial();
    let expected = &direct().reference;
    let reply = generate(REFERENCE_TEXT, &[&reference_png()], REFERENCE_TOKENS);
    assert_matches(&reply, expected);
    assert_eq!(count(&reply, "images_encoded"), 1, "{reply}");
    let text = reply["response"].as_str().unwrap().to_string();

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
    assert_eq!(completion["usage"]["prompt_tokens"], expected.prompt.len());

    // Two images of different grids (10x12 and an enlarged 12x8 patches) in one prompt: the
    // second is encoded, the first comes from the cache of encoded images.
    let two = &direct().two_images;
    let reply = generate(
        REFERENCE_TEXT,
        &[&reference_png(), &second_png()],
        REFERENCE_TOKENS,
    );
    assert_matches(&reply, two);
    assert_eq!(count(&reply, "images_encoded"), 1, "{reply}");
    // The second image's tokens change the answer's distribution (the check above tells them
    // apart).
    let apart = two
        .first_logprobs
        .iter()
        .zip(&expected.first_logprobs)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(apart > 1e-3, "{apart}");

    let (_, show) = post(server(), "/api/show", json!({ "model": MODEL }));
    assert_eq!(
        show["capabilities"],
        json!(["completion", "vision", "tools"]),
        "{show}"
    );
}

/// Issue 21's acceptance for Qwen2.5-VL: a conversation re-sends its image each turn; the
/// image is encoded once, and the second turn evaluates only what the first did not feed (its
/// cached prefix restored with the rope delta its image gives).
#[test]
fn an_image_sent_again_is_encoded_once_and_not_evaluated_again() {
    let _serial = serial();
    let Reference {
        prompt: prompt_one,
        reply: generated,
        ..
    } = &direct().first_turn;
    let first = [user(FIRST_QUESTION, &[&first_png()])];
    let (reply, one) = chat(&first, FIRST_TOKENS);
    assert_eq!(reply, decode(generated), "{one}");
    assert_eq!(
        count(&one, "prompt_eval_count") + count(&one, "prompt_cached_count"),
        prompt_one.len(),
        "{one}"
    );
    assert_eq!(count(&one, "images_encoded"), 1, "{one}");

    // Turn 2 repeats turn 1 with its image, the reply, and a new question.
    let second = [
        first[0].clone(),
        json!({ "role": "assistant", "content": reply }),
        user(FOLLOW_UP, &[]),
    ];
    let (_, two) = chat(&second, SECOND_TOKENS);
    let prompt_two = VOCABULARY.ids(&second_turn_prompt(&reply));
    // What turn 1 fed the model: its prompt and its reply but the last token when the budget
    // cut it (sampled, never fed back).
    let unfed = usize::from(one["done_reason"] == "length");
    let fed: Vec<u32> = prompt_one
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
        "turn 1: prompt {}, reply {generated:?} = {reply:?}; turn 2: prompt {}, evaluated {}, \
         cached {}, encoded {}; it shares {shared} tokens with what turn 1 fed",
        prompt_one.len(),
        prompt_two.len(),
        count(&two, "prompt_eval_count"),
        count(&two, "prompt_cached_count"),
        count(&two, "images_encoded")
    );
    // The random reply need not come back as the same tokens (a lone UTF-8 byte is sent back
    // as U+FFFD, skipped specials as nothing): turn 2 holds at least turn 1's prompt.
    assert!(shared >= prompt_one.len(), "turn 2 holds turn 1's prompt");
    assert_eq!(count(&two, "images_encoded"), 0, "{two}");
    assert_eq!(count(&two, "prompt_cached_count"), shared, "{two}");
    assert_eq!(
        count(&two, "prompt_eval_count"),
        prompt_two.len() - shared,
        "{two}"
    );

    // The same prompt again, raw with its image tag, for its logprobs (the chat reply is
    // specials that render nothing): restored from the cache past its image, with the rope
    // delta the image gives, it answers as the model does from scratch.
    let layout = image_layout(&first_png());
    let raw = second_turn_prompt(&reply).replacen(&layout, "[img-0]", 1);
    let (status, again) = post(
        server(),
        "/api/generate",
        json!({
            "model": MODEL,
            "prompt": raw,
            "raw": true,
            "images": [base64(&first_png())],
            "stream": false,
            "logprobs": true,
            "top_logprobs": 5,
            "options": { "temperature": 0, "num_predict": SECOND_TOKENS },
        }),
    );
    assert_eq!(status, 200, "{again}");
    assert_matches(&again, &direct().second_turn);
    assert!(
        count(&again, "prompt_cached_count") > prompt_one.len(),
        "{again}"
    );
    assert_eq!(count(&again, "images_encoded"), 0, "{again}");
}

/// A request with images and a text-only one sent at once, prefilled in chunks of 4 tokens
/// and decoded in one batch (one row with its rope delta, one with none): each answers as the
/// model computes it alone.
#[test]
fn an_image_row_decodes_beside_a_text_row() {
    let _serial = serial();
    let direct = direct();
    let [a, b] = batched_pngs();
    let (with_images, text_only) = std::thread::scope(|scope| {
        let images = scope.spawn(|| generate(REFERENCE_TEXT, &[&a, &b], REFERENCE_TOKENS));
        let text = scope.spawn(|| generate(TEXT_PROMPT, &[], TEXT_TOKENS));
        (images.join().unwrap(), text.join().unwrap())
    });
    assert_matches(&with_images, &direct.batched);
    assert_eq!(count(&with_images, "images_encoded"), 2, "{with_images}");
    assert_matches(&text_only, &direct.text);
}
