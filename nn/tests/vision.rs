//! Gemma 3 with images against transformers on a tiny random `Gemma3ForConditionalGeneration`
//! (`scripts/make_fixtures.py gemma3_vision`): the SigLIP tower's patch features, the
//! projector's image tokens and the logits of a prompt holding two images, each stage alone;
//! and the same checkpoint loaded as a text model. LLaVA likewise (module `llava`, its own
//! fixture).
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

/// LLaVA against transformers on a tiny random `LlavaForConditionalGeneration`
/// (`scripts/make_fixtures.py llava`): a 3-layer CLIP tower over 56×56 images in 14×14
/// patches, features after its second layer without the class token (16 per image), a GELU
/// projector, the llama fixture's decoder; a prompt holding two images.
///
/// Tolerance: 1e-4 absolute in f32, as above. The f64 copy of the same weights moved the
/// references by at most 2.3e-5 on the logits (which reach 19), 4.0e-6 on the tower's hidden
/// states and 2.1e-6 on the image features (`f32_vs_f64_max_abs_diff` in golden.json).
mod llava {
    use std::path::{Path, PathBuf};

    use kvcache::LayerCache;
    use mlx::{Array, Dtype};
    use nn::arch::llava::{Config, FeatureSelect, Llava};
    use nn::vision::clip::{self, VisionModel};
    use nn::{Batch, ImagePreprocessing, Weights, build_model, registry};
    use quant::{SafetensorsFile, Tensor};

    use super::{compare, ids, rows};

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llava")
    }

    fn json(file: &str) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(fixture().join(file)).unwrap()).unwrap()
    }

    fn reference(name: &str) -> Array {
        SafetensorsFile::open(&fixture().join("logits.safetensors"))
            .unwrap()
            .load(name)
            .unwrap()
    }

    /// How a LLaVA checkpoint names its tensors.
    #[derive(Debug, Clone, Copy)]
    enum Layout {
        /// As transformers 5.24 saved the fixture: `language_model.model.…`,
        /// `language_model.lm_head`, `vision_tower.…`, `multi_modal_projector.…`.
        Saved,
        /// As llava-hf publishes LLaVA 1.5: the tower under `vision_tower.vision_model.…`.
        Published,
        /// transformers 5's module names: `model.language_model.…`, `model.vision_tower.…`,
        /// `model.multi_modal_projector.…`, `lm_head`.
        Modules,
        /// As mlx-vlm converts llava-hf's: those names, the patch kernel channels-last.
        Mlx,
    }

    fn weights(layout: Layout) -> Weights {
        let file = SafetensorsFile::open(&fixture().join("model.safetensors")).unwrap();
        let renames: &[(&str, &str)] = match layout {
            Layout::Saved => &[],
            Layout::Published | Layout::Mlx => &[("vision_tower.", "vision_tower.vision_model.")],
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
            .map(|name| {
                let mut array = file.load(name).unwrap();
                if matches!(layout, Layout::Mlx) && name.ends_with("patch_embedding.weight") {
                    array = array.transpose(&[0, 2, 3, 1]).unwrap();
                }
                (rename(name), Tensor::Dense(array))
            })
            .collect::<Vec<_>>();
        Weights::new(tensors, Dtype::F32)
    }

    fn load(config_file: &str, layout: Layout) -> Llava {
        let config = Config::from_json(&json(config_file)).unwrap();
        let mut weights = weights(layout);
        let model = Llava::new(config, &mut weights, nn::registry::build_text_model).unwrap();
        assert_eq!(
            weights.unused(),
            Vec::<&str>::new(),
            "weights the model never used"
        );
        mlx::eval(&model.parameters()).unwrap();
        model
    }

    fn logits_with_images(
        model: &Llava,
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
        let what = format!("llava {config_file}, {layout:?} names");
        let model = load(config_file, layout);
        let golden = json("golden.json");
        let prompt = ids(&golden, "prompt_ids");
        let pixels = reference("pixel_values");
        assert_eq!(
            model.vision_tower().depth(),
            2,
            "the third layer is never read"
        );

        let states = model.vision_tower().hidden_states(&pixels).unwrap();
        let expected_states = reference("vision_hidden_states");
        for (i, state) in states.iter().enumerate() {
            compare(
                state,
                &rows(&expected_states, i, i + 1).squeeze(&[0]).unwrap(),
                &format!("{what}: vision tower hidden state {i}"),
            );
        }
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

        // One image per chunk, then the text after the last image token by token.
        let image = model.config().image_token_index;
        let ends: Vec<usize> = (1..prompt.len())
            .filter(|&i| prompt[i - 1] == image && prompt[i] != image)
            .collect();
        let mut caches = model.language_model().new_caches().unwrap();
        let mut start = 0;
        for (k, &end) in ends.iter().enumerate() {
            let logits = logits_with_images(
                &model,
                &mut caches,
                &prompt[start..end],
                start,
                Some(&rows(&features, k, k + 1)),
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
    fn llava_matches_transformers() {
        check("config.json", Layout::Saved);
        check("config.transformers4.json", Layout::Published);
        check("config.json", Layout::Modules);
        check("config.json", Layout::Mlx);
    }

    /// Every hidden state of the tower, the last layer's too (which LLaVA never reads), and
    /// with the class token: what "full" and other feature layers would take.
    #[test]
    fn clip_tower_matches_transformers_at_every_layer() {
        let config = clip::Config::from_json(&json("config.json")["vision_config"]).unwrap();
        assert_eq!(config.hidden_act, "quick_gelu");
        let mut weights = weights(Layout::Saved);
        let tower = VisionModel::new(config, &mut weights, "vision_tower", 3).unwrap();
        let states = tower.hidden_states(&reference("pixel_values")).unwrap();
        let expected = reference("vision_hidden_states");
        assert_eq!(states.len(), 4);
        for (i, state) in states.iter().enumerate() {
            compare(
                state,
                &rows(&expected, i, i + 1).squeeze(&[0]).unwrap(),
                &format!("clip tower hidden state {i}"),
            );
        }
    }

    #[test]
    fn llava_checkpoint_loads_through_the_registry() {
        let config = json("config.json");
        let input = registry::image_input(&config).unwrap().unwrap();
        assert_eq!(
            (input.image_size, input.tokens_per_image, input.image_token),
            (56, 16, 511)
        );
        assert_eq!((input.start_token, input.end_token), (None, None));
        assert_eq!(input.preprocessing, ImagePreprocessing::Clip);
        let spec = registry::describe(&config).unwrap();
        assert_eq!((spec.model_type.as_str(), spec.vocab_size), ("llama", 512));
        // Its parameters are every tensor it holds: the text model's, the tower through its
        // second layer and the projector, biases included.
        let file = SafetensorsFile::open(&fixture().join("model.safetensors")).unwrap();
        let stored: u64 = file
            .entries()
            .keys()
            .map(|name| file.load(name).unwrap().size() as u64)
            .sum();
        let checkpoint = quant::Checkpoint::open(&fixture()).unwrap();
        assert_eq!(checkpoint.parameters().unwrap(), stored);

        // Built by the registry, its text side is the text model's own: the text prompt's
        // logits match transformers' without images.
        let golden = json("golden.json");
        let prompt = ids(&golden, "text_prompt_ids");
        let mut weights = weights(Layout::Saved);
        let model = build_model(&config, &mut weights).unwrap();
        assert_eq!(weights.unused(), Vec::<&str>::new());
        let vision = model.vision().expect("a LLaVA reads images");
        assert_eq!(vision.image_input(), input);
        let mut caches = model.new_caches().unwrap();
        let forward = model
            .forward(&Batch::single(&prompt, 0).unwrap(), &mut caches)
            .unwrap();
        let logits = model.unembed(&forward.hidden).unwrap();
        compare(
            &logits.reshape(&[prompt.len() as i32, -1]).unwrap(),
            &reference("text_logits"),
            "llava through the registry: text prompt",
        );
        // And with images, through the Vision side.
        let prompt = ids(&golden, "prompt_ids");
        let features = vision.encode_images(&reference("pixel_values")).unwrap();
        let mut caches = model.new_caches().unwrap();
        let forward = vision
            .forward_rows_with_images(
                &Batch::single(&prompt, 0).unwrap(),
                Some(&features),
                &mut [&mut caches],
            )
            .unwrap();
        let logits = model.unembed(&forward.hidden).unwrap();
        compare(
            &logits.reshape(&[prompt.len() as i32, -1]).unwrap(),
            &reference("logits"),
            "llava through the registry: image prompt",
        );
    }

    #[test]
    fn llava_config_spellings_and_refusals() {
        let mut config = json("config.json");
        config["vision_feature_select_strategy"] = "full".into();
        let full = Config::from_json(&config).unwrap();
        assert_eq!(full.vision_feature_select_strategy, FeatureSelect::Full);
        assert_eq!(full.tokens_per_image(), 17);
        let object = config.as_object_mut().unwrap();
        for key in [
            "vision_feature_select_strategy",
            "vision_feature_layer",
            "projector_hidden_act",
            "multimodal_projector_bias",
        ] {
            object.remove(key);
        }
        object.insert("image_token_id".into(), 511.into());
        object.remove("image_token_index");
        let defaults = Config::from_json(&config).unwrap();
        assert_eq!(defaults, Config::from_json(&json("config.json")).unwrap());

        let mut config = json("config.json");
        config["vision_feature_layer"] = serde_json::json!([-3, -1]);
        assert_eq!(
            Config::from_json(&config).unwrap().vision_feature_layer,
            vec![1, 3]
        );
        for bad in [
            serde_json::json!(-5),
            serde_json::json!(4),
            serde_json::json!([]),
        ] {
            config["vision_feature_layer"] = bad.clone();
            let error = Config::from_json(&config).expect_err("a layer the tower lacks");
            assert!(
                error.to_string().contains("vision_feature_layer"),
                "{bad}: {error}"
            );
        }
        let mut config = json("config.json");
        config["vision_feature_select_strategy"] = "pooled".into();
        let error = Config::from_json(&config).expect_err("an unknown strategy");
        assert!(error.to_string().contains("pooled"), "{error}");
        let mut config = json("config.json");
        config["vision_config"]["patch_size"] = 5.into();
        let error = Config::from_json(&config).expect_err("patches of 5 in 56");
        assert!(error.to_string().contains("patch_size"), "{error}");
        // 65536² one-pixel patches would be 2^32 image tokens per image.
        let mut config = json("config.json");
        config["vision_config"]["image_size"] = 65536.into();
        config["vision_config"]["patch_size"] = 1.into();
        let error = Config::from_json(&config).expect_err("2^32 tokens per image");
        assert!(error.to_string().contains("image tokens"), "{error}");

        let model = load("config.json", Layout::Saved);
        let prompt = ids(&json("golden.json"), "prompt_ids");
        let features = model.encode_images(&reference("pixel_values")).unwrap();
        let mut caches = model.language_model().new_caches().unwrap();
        let error = model
            .forward_with_images(
                &Batch::single(&prompt, 0).unwrap(),
                Some(&rows(&features, 0, 1)),
                &mut [&mut caches],
            )
            .expect_err("32 image tokens with features for 16");
        assert!(error.to_string().contains("32 image tokens"), "{error}");
        let small = Array::zeros(&[1, 3, 28, 28], Dtype::F32).unwrap();
        let error = model.encode_images(&small).expect_err("a 28×28 image");
        assert!(error.to_string().contains("[images, 3, 56, 56]"), "{error}");
    }
}

/// Qwen2.5-VL against transformers on a tiny random `Qwen2_5_VLForConditionalGeneration`
/// (`scripts/make_fixtures.py qwen2_5_vl`): two images of different sizes (8x12 and 6x10
/// patches of 4 pixels, the second's windows partial at its edges) through a 3-block tower
/// (block 1 over whole images, blocks 0 and 2 in windows), in a 61-token prompt with three
/// text tokens after it. Same tolerance as above; the fixture's f64 copy moved the f32
/// references by at most 1.6e-5 (logits) and 2.7e-6 (tower).
mod qwen2_5_vl {
    use super::{compare, rows};
    use std::path::{Path, PathBuf};

    use kvcache::LayerCache;
    use mlx::{Array, Dtype};
    use nn::arch::qwen2_5_vl::{Config, Qwen25Vl, rope_index};
    use nn::{Batch, ImageGrid, Model, Vision, Weights, build_model};
    use quant::{SafetensorsFile, Tensor};

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen2_5_vl")
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

    fn grids(golden: &serde_json::Value) -> Vec<ImageGrid> {
        golden["image_grid_thw"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                let n = |i: usize| g[i].as_u64().unwrap() as usize;
                ImageGrid {
                    t: n(0),
                    h: n(1),
                    w: n(2),
                }
            })
            .collect()
    }

    fn reference(name: &str) -> Array {
        SafetensorsFile::open(&fixture().join("logits.safetensors"))
            .unwrap()
            .load(name)
            .unwrap()
    }

    /// The saved names (`visual.…`, `model.…`), or transformers 5's module names
    /// (`model.visual.…`, `model.language_model.…`).
    fn weights(modules: bool) -> Weights {
        let file = SafetensorsFile::open(&fixture().join("model.safetensors")).unwrap();
        let rename = |name: &str| -> String {
            match name.split_once('.') {
                Some(("visual", rest)) if modules => format!("model.visual.{rest}"),
                Some(("model", rest)) if modules => format!("model.language_model.{rest}"),
                _ => name.to_string(),
            }
        };
        let tensors = file
            .entries()
            .keys()
            .map(|name| (rename(name), Tensor::Dense(file.load(name).unwrap())))
            .collect::<Vec<_>>();
        Weights::new(tensors, Dtype::F32)
    }

    fn load(modules: bool) -> Qwen25Vl {
        let config = Config::from_json(&json("config.json")).unwrap();
        let mut weights = weights(modules);
        let model = Qwen25Vl::new(config, &mut weights).unwrap();
        assert_eq!(weights.unused(), Vec::<&str>::new(), "unused weights");
        mlx::eval(&model.parameters()).unwrap();
        model
    }

    fn logits_of(
        model: &Qwen25Vl,
        caches: &mut [Option<LayerCache>],
        ids: &[u32],
        position: usize,
        delta: i64,
        images: Option<(&Array, &[ImageGrid])>,
    ) -> Array {
        let batch = Batch::single(ids, position)
            .unwrap()
            .with_rope_deltas(vec![delta])
            .unwrap();
        let forward = match images {
            Some((features, grids)) => model
                .forward_with_images(&batch, Some(features), grids, &mut [caches])
                .unwrap(),
            None => model.forward_rows(&batch, &mut [caches]).unwrap(),
        };
        let logits = model.unembed(&forward.hidden).unwrap();
        logits.reshape(&[ids.len() as i32, -1]).unwrap()
    }

    #[test]
    fn tower_and_positions_match_transformers() {
        let model = load(false);
        let golden = json("golden.json");
        let grids = grids(&golden);
        let out = model
            .visual()
            .forward(&reference("pixel_values"), &grids)
            .unwrap();
        compare(
            &out.last_hidden_state,
            &reference("vision_hidden"),
            "qwen2_5_vl: tower blocks, window order",
        );
        compare(
            &out.merged,
            &reference("image_features"),
            "qwen2_5_vl: merged image features",
        );

        let prompt = ids(&golden, "prompt_ids");
        let full: Vec<u32> = prompt
            .iter()
            .chain(&ids(&golden, "extra_ids"))
            .copied()
            .collect();
        let image = model.config().image_token_id;
        let (positions, _) = rope_index(&full, image, &grids, 2, 0).unwrap();
        let expected = reference("position_ids").to_vec::<f32>().unwrap();
        let n = full.len();
        for (i, p) in positions.iter().enumerate() {
            for axis in 0..3 {
                assert_eq!(
                    p[axis] as f32,
                    expected[axis * n + i],
                    "token {i} axis {axis}"
                );
            }
        }
        let delta = model.rope_delta(&prompt, &grids).unwrap();
        assert_eq!(
            delta as f32,
            reference("rope_deltas").to_vec::<f32>().unwrap()[0]
        );
        // 4x6 tokens at 6 positions, 3x5 at 5: 39 image tokens at 11 positions.
        assert_eq!(delta, -28);
    }

    #[test]
    fn logits_with_images_match_transformers() {
        let golden = json("golden.json");
        let grids = grids(&golden);
        let prompt = ids(&golden, "prompt_ids");
        let extra = ids(&golden, "extra_ids");
        let full: Vec<u32> = prompt.iter().chain(&extra).copied().collect();
        let expected = reference("logits");
        for modules in [false, true] {
            let what = if modules {
                "module names"
            } else {
                "saved names"
            };
            let model = load(modules);
            let features = model
                .encode_images(&reference("pixel_values"), &grids)
                .unwrap();
            let mut caches = model.new_caches().unwrap();
            let all = logits_of(&model, &mut caches, &full, 0, 0, Some((&features, &grids)));
            compare(&all, &expected, &format!("qwen2_5_vl, {what}: one pass"));

            // One image per chunk (the first chunk also holds the text before it), the text
            // after the last image, then the extra tokens one by one at cache offset + delta.
            let image = model.config().image_token_id;
            let ends = [32, 55, prompt.len()];
            let mut caches = model.new_caches().unwrap();
            let (mut start, mut feature_row, mut grid_at) = (0, 0usize, 0usize);
            for &end in &ends {
                let chunk = &prompt[start..end];
                let tokens = chunk.iter().filter(|&&t| t == image).count();
                let delta = model
                    .rope_delta(&prompt[..start], &grids[..grid_at])
                    .unwrap();
                let logits = if tokens == 0 {
                    logits_of(&model, &mut caches, chunk, start, delta, None)
                } else {
                    let f = rows(&features, feature_row, feature_row + tokens);
                    let g = &grids[grid_at..grid_at + 1];
                    logits_of(&model, &mut caches, chunk, start, delta, Some((&f, g)))
                };
                compare(
                    &logits,
                    &rows(&expected, start, end),
                    &format!("qwen2_5_vl, {what}: chunk {start}..{end}"),
                );
                feature_row += tokens;
                grid_at += usize::from(tokens > 0);
                start = end;
            }
            let delta = model.rope_delta(&prompt, &grids).unwrap();
            for (k, &token) in extra.iter().enumerate() {
                let position = prompt.len() + k;
                let logits = logits_of(&model, &mut caches, &[token], position, delta, None);
                compare(
                    &logits,
                    &rows(&expected, position, position + 1),
                    &format!("qwen2_5_vl, {what}: decode at {position} (delta {delta})"),
                );
            }
        }
    }

    /// A decode batch of a sequence after images (delta -28) and a text-only one (delta 0):
    /// each row at its own rotary position.
    #[test]
    fn rows_of_a_decode_batch_keep_their_own_deltas() {
        let model = load(false);
        let golden = json("golden.json");
        let grids = grids(&golden);
        let prompt = ids(&golden, "prompt_ids");
        let extra = ids(&golden, "extra_ids");
        let text = ids(&golden, "text_prompt_ids");
        let features = model
            .encode_images(&reference("pixel_values"), &grids)
            .unwrap();
        let mut image_caches = model.new_caches().unwrap();
        logits_of(
            &model,
            &mut image_caches,
            &prompt,
            0,
            0,
            Some((&features, &grids)),
        );
        let mut text_caches = model.new_caches().unwrap();
        let last = text.len() - 1;
        logits_of(&model, &mut text_caches, &text[..last], 0, 0, None);
        let delta = model.rope_delta(&prompt, &grids).unwrap();
        let batch = Batch::rows(&[(&extra[..1], prompt.len()), (&text[last..], last)])
            .unwrap()
            .with_rope_deltas(vec![delta, 0])
            .unwrap();
        let forward = model
            .forward_rows(&batch, &mut [&mut image_caches, &mut text_caches])
            .unwrap();
        let logits = model
            .unembed(&forward.hidden)
            .unwrap()
            .reshape(&[2, -1])
            .unwrap();
        let p = prompt.len();
        compare(
            &rows(&logits, 0, 1),
            &rows(&reference("logits"), p, p + 1),
            "qwen2_5_vl: batch row after images",
        );
        compare(
            &rows(&logits, 1, 2),
            &rows(&reference("text_logits"), last, last + 1),
            "qwen2_5_vl: batch row of text",
        );
    }

    /// Through the registry: it reads images (the capability known without loading, the
    /// same as the built model's), and a text prompt's logits are transformers'.
    #[test]
    fn checkpoint_answers_text_through_the_registry() {
        let golden = json("golden.json");
        let text = ids(&golden, "text_prompt_ids");
        let config = json("config.json");
        let input = nn::registry::image_input(&config).unwrap().expect("vision");
        assert_eq!(input.image_token, 511);
        assert_eq!((input.start_token, input.end_token), (Some(508), Some(509)));
        assert_eq!(input.preprocessing, nn::ImagePreprocessing::Patches);
        assert_eq!(nn::registry::describe(&config).unwrap().vocab_size, 512);
        let mut weights = weights(false);
        let model = build_model(&config, &mut weights).unwrap();
        let vision = model.vision().expect("a Qwen2.5-VL reads images");
        assert_eq!(vision.image_input(), input);
        assert_eq!(vision.patch_input().map(|p| p.merge_size), Some(2));
        let mut caches = model.new_caches().unwrap();
        let forward = model
            .forward(&Batch::single(&text, 0).unwrap(), &mut caches)
            .unwrap();
        let logits = model.unembed(&forward.hidden).unwrap();
        compare(
            &logits.reshape(&[text.len() as i32, -1]).unwrap(),
            &reference("text_logits"),
            "qwen2_5_vl: text prompt through the registry",
        );
    }

    #[test]
    fn mismatched_images_and_configs_are_refused() {
        let model = load(false);
        let golden = json("golden.json");
        let grids = grids(&golden);
        let prompt = ids(&golden, "prompt_ids");
        let pixels = reference("pixel_values");
        let features = model.encode_images(&pixels, &grids).unwrap();
        let mut caches = model.new_caches().unwrap();
        let batch = Batch::single(&prompt, 0).unwrap();
        let error = model
            .forward_with_images(&batch, Some(&features), &grids[..1], &mut [&mut caches])
            .expect_err("two images' tokens, one grid");
        assert!(error.to_string().contains("grid"), "{error}");
        let error = model
            .forward_with_images(
                &batch,
                Some(&rows(&features, 0, 24)),
                &grids,
                &mut [&mut caches],
            )
            .expect_err("39 image tokens, 24 feature rows");
        assert!(error.to_string().contains("39 image tokens"), "{error}");
        let error = model
            .visual()
            .forward(&pixels, &grids[..1])
            .expect_err("156 patch rows for a 96-patch grid");
        assert!(error.to_string().contains("image patches"), "{error}");
        let odd = [ImageGrid { t: 1, h: 3, w: 52 }];
        let error = model.visual().forward(&pixels, &odd).expect_err("odd rows");
        assert!(error.to_string().contains("2x2 blocks"), "{error}");
        let error = model
            .encode_images(&Array::zeros(&[1, 3, 8, 8], Dtype::F32).unwrap(), &grids)
            .expect_err("pixels, not patches");
        assert!(error.to_string().contains("image patches"), "{error}");

        let mut config = json("config.json");
        config["text_config"]["rope_parameters"]["mrope_section"] = serde_json::json!([2, 3, 4]);
        let error = Config::from_json(&config).expect_err("sections of 9 frequencies");
        assert!(error.to_string().contains("mrope_section"), "{error}");
        let mut config = json("config.json");
        config["vision_config"]["window_size"] = 12.into();
        let error = Config::from_json(&config).expect_err("windows of 1.5 blocks");
        assert!(error.to_string().contains("window_size"), "{error}");
        let mut config = json("config.json");
        config["vision_config"]["fullatt_block_indexes"] = serde_json::json!([3]);
        let error = Config::from_json(&config).expect_err("block 3 of 3");
        assert!(
            error.to_string().contains("fullatt_block_indexes"),
            "{error}"
        );
    }

    /// The released checkpoints' spelling: text fields at the top level, `rope_theta` and
    /// `rope_scaling: {type: mrope}`, the tower's channels as `in_chans`.
    #[test]
    fn released_config_spelling_reads_the_same() {
        let saved = json("config.json");
        let mut old = serde_json::Map::new();
        for (k, v) in saved.as_object().unwrap() {
            if k != "text_config" && k != "vision_config" {
                old.insert(k.clone(), v.clone());
            }
        }
        for (k, v) in saved["text_config"].as_object().unwrap() {
            if k != "rope_parameters" && k != "model_type" {
                old.insert(k.clone(), v.clone());
            }
        }
        let rope = &saved["text_config"]["rope_parameters"];
        old.insert("rope_theta".into(), rope["rope_theta"].clone());
        old.insert(
            "rope_scaling".into(),
            serde_json::json!({"type": "mrope", "mrope_section": rope["mrope_section"]}),
        );
        let mut vision = saved["vision_config"].clone();
        let channels = vision
            .as_object_mut()
            .unwrap()
            .remove("in_channels")
            .unwrap();
        vision["in_chans"] = channels;
        old.insert("vision_config".into(), vision);
        let old = serde_json::Value::Object(old);
        let a = Config::from_json(&saved).unwrap();
        let b = Config::from_json(&old).unwrap();
        assert_eq!(a.vision, b.vision);
        assert_eq!(a.mrope_section, b.mrope_section);
        assert_eq!(a.text.rope, b.text.rope);
        assert_eq!(a.text.hidden_size, b.text.hidden_size);
    }
}
