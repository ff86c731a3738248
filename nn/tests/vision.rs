//! Gemma 3 with images against transformers on a tiny random `Gemma3ForConditionalGeneration`
//! (`scripts/make_fixtures.py gemma3_vision`): the SigLIP tower's patch features, the
//! projector's image tokens and the logits of a prompt holding two images, each stage alone;
//! and the same checkpoint loaded as a text model.
//!
//! Tolerance: 1e-4 absolute in f32, as in `parity.rs`. The references were checked against an
//! f64 copy of the same weights when the fixture was drawn (`f32_vs_f64_max_abs_diff` in
//! golden.json: at most 7.7e-6 on the logits, 1.3e-6 on the tower); the logits reach 30 (no
//! final soft-cap here, see `gemma3::Config::final_logit_softcapping`), and f32 summation order
//! between MLX's kernels and PyTorch's leaves errors of order 1e-5.

use std::path::{Path, PathBuf};

use kvcache::LayerCache;
use mlx::{Array, Dtype};
use nn::arch::gemma3_multimodal::{Config, Gemma3Multimodal};
use nn::{Batch, Model, Weights, build_model};
use quant::{SafetensorsFile, Tensor};

const TOLERANCE: f32 = 1e-4;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma3_vision")
}

fn json(file: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(fixture().join(file)).unwrap()).unwrap()
}

fn ids(golden: &serde_json::Value, key: &str) -> Vec<u32> {
    golden[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn reference(name: &str) -> Array {
    SafetensorsFile::open(&fixture().join("logits.safetensors"))
        .unwrap()
        .load(name)
        .unwrap()
}

/// How a multimodal checkpoint names its tensors.
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// As transformers 5.24 saved the fixture: `language_model.model.…`, `vision_tower.…`,
    /// `multi_modal_projector.…`.
    Saved,
    /// As Google published Gemma 3 (transformers 4): the tower under
    /// `vision_tower.vision_model.…`.
    Published,
    /// transformers 5's module names: `model.language_model.…`, `model.vision_tower.…`,
    /// `model.multi_modal_projector.…`, `lm_head`.
    Modules,
}

fn weights(layout: Layout) -> Weights {
    let file = SafetensorsFile::open(&fixture().join("model.safetensors")).unwrap();
    let renames: &[(&str, &str)] = match layout {
        Layout::Saved => &[],
        Layout::Published => &[("vision_tower.", "vision_tower.vision_model.")],
        Layout::Modules => &[
            ("language_model.model.", "model.language_model."),
            ("language_model.lm_head.", "lm_head."),
            ("vision_tower.", "model.vision_tower."),
            ("multi_modal_projector.", "model.multi_modal_projector."),
        ],
    };
    let rename = |name: &str| -> String {
        for (from, to) in renames {
            if let Some(rest) = name.strip_prefix(from) {
                return format!("{to}{rest}");
            }
        }
        name.to_string()
    };
    let tensors = file
        .entries()
        .keys()
        .map(|name| (rename(name), Tensor::Dense(file.load(name).unwrap())))
        .collect::<Vec<_>>();
    Weights::new(tensors, Dtype::F32)
}

fn load(config_file: &str, layout: Layout) -> Gemma3Multimodal {
    let config = Config::from_json(&json(config_file)).unwrap();
    let mut weights = weights(layout);
    let model = Gemma3Multimodal::new(config, &mut weights).unwrap();
    assert_eq!(
        weights.unused(),
        Vec::<&str>::new(),
        "weights the model never used"
    );
    mlx::eval(&model.parameters()).unwrap();
    model
}

/// The largest absolute difference, checked against [`TOLERANCE`].
fn compare(got: &Array, expected: &Array, what: &str) -> f32 {
    assert_eq!(got.shape(), expected.shape(), "{what}: shape");
    let got = got.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
    let expected = expected
        .astype(Dtype::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let (mut worst, mut at) = (0f32, 0);
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        let err = (g - e).abs();
        if err > worst || err.is_nan() {
            worst = err;
            at = i;
        }
    }
    eprintln!("{what}: max abs error {worst:e}");
    assert!(
        worst <= TOLERANCE,
        "{what}: max abs error {worst:e} at element {at} (got {}, expected {})",
        got[at],
        expected[at]
    );
    worst
}

fn rows(a: &Array, start: usize, stop: usize) -> Array {
    a.slice_axis(0, start as i32, stop as i32).unwrap()
}

fn logits_with_images(
    model: &Gemma3Multimodal,
    caches: &mut [Option<LayerCache>],
    ids: &[u32],
    position: usize,
    features: Option<&Array>,
) -> Array {
    let batch = Batch::single(ids, position).unwrap();
    let forward = model
        .forward_with_images(&batch, features, &mut [caches])
        .unwrap();
    let logits = model.language_model().unembed(&forward.hidden).unwrap();
    logits.reshape(&[ids.len() as i32, -1]).unwrap()
}

fn check(config_file: &str, layout: Layout) {
    let what = format!("{config_file}, {layout:?} names");
    let model = load(config_file, layout);
    let golden = json("golden.json");
    let prompt = ids(&golden, "prompt_ids");
    let pixels = reference("pixel_values");

    let tower = model.vision_tower().forward(&pixels).unwrap();
    compare(
        &tower,
        &reference("vision_hidden"),
        &format!("{what}: vision tower"),
    );
    let features = model.encode_images(&pixels).unwrap();
    compare(
        &features,
        &reference("image_features"),
        &format!("{what}: projected image features"),
    );

    let expected = reference("logits");
    let mut caches = model.language_model().new_caches().unwrap();
    let all = logits_with_images(&model, &mut caches, &prompt, 0, Some(&features));
    compare(
        &all,
        &expected,
        &format!("{what}: logits, one-shot prefill"),
    );

    // One image per chunk, each chunk wider than the sliding window (8), then the text after
    // the last image token by token.
    let image = model.config().image_token_index;
    let ends: Vec<usize> = (1..prompt.len())
        .filter(|&i| prompt[i - 1] == image && prompt[i] != image)
        .collect();
    let mut caches = model.language_model().new_caches().unwrap();
    let mut start = 0;
    for (k, &end) in ends.iter().enumerate() {
        let image_features = rows(&features, k, k + 1);
        let logits = logits_with_images(
            &model,
            &mut caches,
            &prompt[start..end],
            start,
            Some(&image_features),
        );
        compare(
            &logits,
            &rows(&expected, start, end),
            &format!("{what}: logits, chunk {start}..{end} with image {k}"),
        );
        start = end;
    }
    for position in start..prompt.len() {
        let logits = logits_with_images(
            &model,
            &mut caches,
            &prompt[position..position + 1],
            position,
            None,
        );
        compare(
            &logits,
            &rows(&expected, position, position + 1),
            &format!("{what}: logits, decode at {position}"),
        );
    }
}

#[test]
fn gemma3_vision_matches_transformers() {
    check("config.json", Layout::Saved);
    check("config.transformers4.json", Layout::Published);
    check("config.json", Layout::Modules);
}

#[test]
fn gemma3_vision_rows_of_a_batch_take_their_own_images() {
    let model = load("config.json", Layout::Saved);
    let golden = json("golden.json");
    let prompt = ids(&golden, "prompt_ids");
    let features = model.encode_images(&reference("pixel_values")).unwrap();
    // The prompt twice: row 0 with the images in order, row 1 with them swapped.
    let swapped = mlx::concatenate(&[rows(&features, 1, 2), rows(&features, 0, 1)], 0).unwrap();
    let both = mlx::concatenate(&[features.clone(), swapped.clone()], 0).unwrap();
    let batch = Batch::rows(&[(&prompt, 0), (&prompt, 0)]).unwrap();
    let mut first = model.language_model().new_caches().unwrap();
    let mut second = model.language_model().new_caches().unwrap();
    let forward = model
        .forward_with_images(&batch, Some(&both), &mut [&mut first, &mut second])
        .unwrap();
    let logits = model.language_model().unembed(&forward.hidden).unwrap();
    let n = prompt.len() as i32;
    let row = |r: i32| {
        logits
            .slice_axis(0, r, r + 1)
            .unwrap()
            .reshape(&[n, -1])
            .unwrap()
    };
    compare(&row(0), &reference("logits"), "batch row 0: logits");
    let mut caches = model.language_model().new_caches().unwrap();
    let alone = logits_with_images(&model, &mut caches, &prompt, 0, Some(&swapped));
    compare(&row(1), &alone, "batch row 1: logits against the row alone");
}

#[test]
fn gemma3_vision_checkpoint_loads_as_a_text_model() {
    let golden = json("golden.json");
    let prompt = ids(&golden, "text_prompt_ids");
    for (config_file, layout) in [
        ("config.json", Layout::Saved),
        ("config.transformers4.json", Layout::Published),
        ("config.json", Layout::Modules),
    ] {
        let mut weights = weights(layout);
        let model = build_model(&json(config_file), &mut weights).unwrap();
        assert_eq!(
            weights.unused(),
            Vec::<&str>::new(),
            "weights the text model never used"
        );
        let mut caches = model.new_caches().unwrap();
        let batch = Batch::single(&prompt, 0).unwrap();
        let forward = model.forward(&batch, &mut caches).unwrap();
        let logits = model.unembed(&forward.hidden).unwrap();
        compare(
            &logits.reshape(&[prompt.len() as i32, -1]).unwrap(),
            &reference("text_logits"),
            &format!("{config_file}, {layout:?} names: text-only load, text prompt"),
        );
    }
}

#[test]
fn gemma3_vision_refuses_inputs_that_do_not_fit() {
    let model = load("config.json", Layout::Saved);
    let golden = json("golden.json");
    let prompt = ids(&golden, "prompt_ids");
    let features = model.encode_images(&reference("pixel_values")).unwrap();
    let mut caches = model.language_model().new_caches().unwrap();
    let batch = Batch::single(&prompt, 0).unwrap();
    let one = rows(&features, 0, 1);
    let error = model
        .forward_with_images(&batch, Some(&one), &mut [&mut caches])
        .expect_err("8 image tokens with features for 4");
    assert!(
        error.to_string().contains("8 image tokens"),
        "unexpected error: {error}"
    );

    let small = Array::zeros(&[1, 3, 16, 16], Dtype::F32).unwrap();
    let error = model.encode_images(&small).expect_err("a 16×16 image");
    assert!(error.to_string().contains("[images, 3, 32, 32]"), "{error}");

    let mut config = json("config.json");
    config
        .as_object_mut()
        .unwrap()
        .remove("mm_tokens_per_image");
    let error = Config::from_json(&config).expect_err("no mm_tokens_per_image");
    assert!(error.to_string().contains("mm_tokens_per_image"), "{error}");
    let mut config = json("config.json");
    config["mm_tokens_per_image"] = 9.into();
    let error = Config::from_json(&config).expect_err("3×3 tokens of 4×4 patches");
    assert!(error.to_string().contains("mm_tokens_per_image"), "{error}");
    let mut config = json("config.json");
    config["vision_config"]["patch_size"] = 5.into();
    let error = Config::from_json(&config).expect_err("patches of 5 in 32");
    assert!(error.to_string().contains("patch_size"), "{error}");
    let mut config = json("config.json");
    config["vision_config"]["num_hidden_layers"] = (1u64 << 40).into();
    let error = Config::from_json(&config).expect_err("2^40 layers");
    assert!(error.to_string().contains("num_hidden_layers"), "{error}");
}
