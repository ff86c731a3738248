//! LLaVA served over HTTP (issue 21): the tiny LLaVA from `nn/tests/fixtures/llava` (a CLIP
//! tower, a GELU projector and a llama decoder), imported with a byte-level tokenizer holding
//! Llama's `<s>` / `</s>` and the image token at the id its config names (511) and a
//! LLaVA-1.5-style `USER: … ASSISTANT:` template. An image enters the prompt as its 16 image
//! tokens alone (no markers) and is prepared by CLIP's processor (shortest edge to 56, centre
//! crop). A conversation that sends its image again encodes it once and evaluates only what
//! the new turn adds; the answer is the one the model computes directly.
//!
//! No download: the fixture is committed, so this runs everywhere.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use mlx::{Array, Dtype};
use nn::Model;
use nn::arch::llava::{Config, Llava};
use quant::{SafetensorsFile, Tensor};
use runner::engine::LoopConfig;
use runner::model_name::ModelName;
use serde_json::{Value, json};
use support::{
    ByteVocabulary, Server, assert_first_logprobs, base64, png, post, start_server_with,
};

const MODEL: &str = "tiny-llava:test";

/// LLaVA 1.5's conversation layout (Vicuna's `USER:` / `ASSISTANT:`), the BOS first; an
/// assistant turn ends in `</s>` and follows `ASSISTANT:` directly, as the generation prompt
/// leaves it, so a reply fed back in the next turn is the same tokens.
const TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\
{% if message.role == 'user' %}USER: {{ message.content }} \
{% else %}ASSISTANT:{{ message.content }}</s>{% endif %}{% endfor %}\
{% if add_generation_prompt %}ASSISTANT:{% endif %}";

/// The byte-level vocabulary: Llama's `<unk>`, `<s>`, `</s>` at 0–2 (the fixture's config
/// names BOS 1 and EOS 2), the bytes from 3, the image token at 511.
const VOCABULARY: ByteVocabulary = ByteVocabulary {
    first_byte: 3,
    specials: &[(0, "<unk>"), (1, "<s>"), (2, "</s>"), (511, "<image>")],
    size: 512,
};

/// Image tokens per image: the tower's 4×4 patches, the class token dropped.
const TOKENS_PER_IMAGE: usize = 16;

/// The image's side after CLIP's processor: the tower's `image_size`.
const IMAGE_SIZE: u32 = 56;

/// Tests share one server and count encodes: one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../nn/tests/fixtures/llava")
}

fn tokenizer_folder() -> tempfile::TempDir {
    VOCABULARY.tokenizer_folder(&fixture(), TEMPLATE, "<s>", "</s>")
}

/// The server; the direct computation runs first, on this thread, before the engine's MLX
/// worker exists (two threads must not drive MLX at once).
fn server() -> &'static Server {
    static SERVER: OnceLock<Option<Server>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            direct();
            start_server_with(&[], LoopConfig::from_env(), |store| {
                let folder = tokenizer_folder();
                let name = ModelName::parse(MODEL).unwrap();
                runner::import::import_path(store, &name, folder.path(), "test", &mut |_, _, _| {})
                    .unwrap();
            })
        })
        .as_ref()
        .expect("the tiny model needs no download")
}

/// An image's place in the prompt: its image tokens alone.
fn image_layout() -> String {
    "<image>".repeat(TOKENS_PER_IMAGE)
}

/// The prompt of a user turn `[image] text` as the server renders it.
fn one_turn_prompt(text: &str) -> String {
    format!("<s>USER: {}{text} ASSISTANT:", image_layout())
}

/// A non-square image, so CLIP's processor resizes its shortest edge and crops.
fn reference_png() -> Vec<u8> {
    png(48, 40, 200)
}

const REFERENCE_TEXT: &str = "Describe:";
const REFERENCE_TOKENS: usize = 8;

/// The first turn of the conversation test: its image, question and reply budget.
fn first_png() -> Vec<u8> {
    png(30, 70, 1)
}
const FIRST_QUESTION: &str = "What is in the picture?";
const FIRST_TOKENS: usize = 6;

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

/// What the model computes directly, before the server starts: for [`reference_png`] and
/// [`REFERENCE_TEXT`] (the answer test), and for the first turn of the conversation test.
struct Direct {
    reference: Reference,
    first_turn: Reference,
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
        let model = Llava::new(config, &mut weights, nn::registry::build_text_model).unwrap();
        mlx::eval(&model.parameters()).unwrap();
        let folder = tokenizer_folder();
        let tokenizer = tokenizer::Tokenizer::from_hf_dir(folder.path()).unwrap();
        Direct {
            reference: greedy(
                &model,
                &tokenizer,
                REFERENCE_TEXT,
                &reference_png(),
                REFERENCE_TOKENS,
            ),
            first_turn: greedy(
                &model,
                &tokenizer,
                FIRST_QUESTION,
                &first_png(),
                FIRST_TOKENS,
            ),
        }
    })
}

/// The greedy reply `Llava::forward_with_images` gives for `png` (prepared with `media`'s
/// CLIP processor) and `text` in one user turn: the whole prompt, then one token at a time, at
/// most `tokens`, stopping at the tokenizer's stop tokens.
fn greedy(
    model: &Llava,
    tokenizer: &tokenizer::Tokenizer,
    text: &str,
    png: &[u8],
    tokens: usize,
) -> Reference {
    let prompt = VOCABULARY.ids(&one_turn_prompt(text));
    assert_eq!(
        tokenizer.encode(&one_turn_prompt(text), false).unwrap(),
        prompt
    );
    let image = media::prepare_image(
        png,
        &media::ImageLimits::default(),
        &media::ImageProcessorConfig::clip(IMAGE_SIZE),
    )
    .unwrap();
    let side = IMAGE_SIZE as i32;
    let pixels = Array::from_slice(&image.pixels.data, &[1, 3, side, side]).unwrap();
    let features = model.encode_images(&pixels).unwrap();

    let mut caches = model.language_model().new_caches().unwrap();
    let batch = nn::Batch::single(&prompt, 0).unwrap();
    let out = model
        .forward_with_images(&batch, Some(&features), &mut [&mut caches])
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
    let text = tokenizer.decode(&reply, true).unwrap();
    eprintln!("direct reply: {reply:?} = {text:?}, first top logprobs {first_logprobs:?}");
    Reference {
        prompt,
        reply,
        first_logprobs,
    }
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

/// Issue 21's acceptance for LLaVA: a conversation re-sends its image each turn; the image is
/// encoded once, and the second turn evaluates only what the first did not feed: the new turn,
/// and the reply from where its text, sent back, stops giving the tokens generated (a random
/// model's reply need not be valid UTF-8; the client then sends U+FFFD for its broken bytes).
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
    let folder = tokenizer_folder();
    let tokenizer = tokenizer::Tokenizer::from_hf_dir(folder.path()).unwrap();
    assert_eq!(reply, tokenizer.decode(generated, true).unwrap(), "{one}");
    assert_eq!(
        count(&one, "prompt_eval_count") + count(&one, "prompt_cached_count"),
        prompt_one.len(),
        "{one}"
    );
    assert_eq!(count(&one, "images_encoded"), 1, "{one}");
    // The other test may have left the text before the image cached (`<s>USER: `), never
    // anything past it: the image is new.
    assert!(
        count(&one, "prompt_cached_count") <= VOCABULARY.ids("<s>USER: ").len(),
        "{one}"
    );

    // Turn 2 repeats turn 1 with its image, the reply, and a new question.
    let follow_up = "And the colours?";
    let second = [
        first[0].clone(),
        json!({ "role": "assistant", "content": reply }),
        user(follow_up, &[]),
    ];
    let (_, two) = chat(&second, 6);
    let prompt_two = VOCABULARY.ids(&format!(
        "{}{reply}</s>USER: {follow_up} ASSISTANT:",
        one_turn_prompt(FIRST_QUESTION)
    ));
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
    assert!(
        shared > prompt_one.len(),
        "turn 2 holds turn 1's prompt and more"
    );
    assert_eq!(count(&two, "images_encoded"), 0, "{two}");
    assert_eq!(count(&two, "prompt_cached_count"), shared, "{two}");
    assert_eq!(
        count(&two, "prompt_eval_count"),
        prompt_two.len() - shared,
        "{two}"
    );

    // Another image in the same place: encoded, and nothing past the image's start reused.
    let (_, other) = chat(&[user(FIRST_QUESTION, &[&png(30, 70, 2)])], 6);
    assert_eq!(count(&other, "images_encoded"), 1, "{other}");
    assert!(
        count(&other, "prompt_cached_count") <= VOCABULARY.ids("<s>USER: ").len(),
        "no prefix past the first image is reused for another: {other}"
    );
}

/// What the server answers with an image is what the model computes directly, greedy, through
/// `/api/generate` and through OpenAI's `image_url` parts alike; `show` lists vision.
#[test]
fn the_answer_with_an_image_is_the_models_own() {
    let _serial = serial();
    let Reference {
        prompt,
        reply: expected,
        first_logprobs,
    } = direct().reference.clone();
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
    assert_first_logprobs(&reply, &first_logprobs);
    assert_eq!(
        count(&reply, "prompt_eval_count") + count(&reply, "prompt_cached_count"),
        prompt.len(),
        "{reply}"
    );
    assert_eq!(count(&reply, "images_encoded"), 1, "{reply}");
    let folder = tokenizer_folder();
    let tokenizer = tokenizer::Tokenizer::from_hf_dir(folder.path()).unwrap();
    let text = reply["response"].as_str().unwrap().to_string();
    assert_eq!(text, tokenizer.decode(&expected, true).unwrap(), "{reply}");

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

    let (_, show) = post(server(), "/api/show", json!({ "model": MODEL }));
    assert_eq!(
        show["capabilities"],
        json!(["completion", "vision", "tools"]),
        "{show}"
    );
}
