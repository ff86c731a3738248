//! Preprocessing parity with Hugging Face's image processors (transformers 5.24) on real,
//! encoded images: the fixtures under `tests/fixtures/hf_preprocess/` come from
//! `scripts/make_image_fixtures.py` (an RGBA PNG, a 4:2:0 JPEG and a lossy WebP, each through
//! `Gemma3ImageProcessor` and `CLIPImageProcessor` on both backends, torchvision — transformers'
//! default — and PIL; and `LlavaImageProcessor` at LLaVA 1.5's 336 on the PNG).
//!
//! Differences are reported in grey levels: |Δ| × std × 255, the size of the difference in the
//! `u8` pixels the processor normalized. Three stages are held apart, so that a difference is
//! pinned to its cause:
//!
//! 1. decoding: `media::decode_image` against Pillow's decode (with transformers' `convert_rgb`,
//!    alpha over white);
//! 2. resize and crop: `media::resize_to_fit` on Pillow's decoded pixels against the processor's
//!    pixels before rescaling — required exact, on both backends;
//! 3. the whole path: `media::decode_image` then `media::preprocess` against `pixel_values`.

use std::path::{Path, PathBuf};

use image::RgbImage;
use media::{
    Fit, ImageLimits, ImageProcessorConfig, Resample, ResizeBackend, decode_image, preprocess,
    resize_to_fit,
};
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf_preprocess")
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn manifest() -> Value {
    serde_json::from_slice(&read("manifest.json")).unwrap()
}

fn num(v: &Value, key: &str) -> u32 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} in {v}"))
        .try_into()
        .unwrap()
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_else(|| panic!("{key} in {v}"))
}

fn rgb(width: u32, height: u32, bytes: Vec<u8>) -> RgbImage {
    RgbImage::from_raw(width, height, bytes).expect("fixture size matches its manifest")
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The config `media` runs for one manifest case.
fn config(case: &Value) -> ImageProcessorConfig {
    let size = num(case, "size");
    let base = match text(case, "processor") {
        "gemma3" => ImageProcessorConfig::siglip(size),
        // LLaVA's processor, as llava-hf configures it (no padding to a square), is CLIP's.
        "clip" | "llava" => ImageProcessorConfig::clip(size),
        other => panic!("unknown processor {other}"),
    };
    let backend = match text(case, "backend") {
        "torchvision" => ResizeBackend::Torchvision,
        "pil" => ResizeBackend::Pil,
        other => panic!("unknown backend {other}"),
    };
    ImageProcessorConfig { backend, ..base }
}

/// Max |Δ| and the number of differing values between two `u8` buffers.
fn u8_diff(ours: &[u8], theirs: &[u8]) -> (u8, usize) {
    assert_eq!(ours.len(), theirs.len());
    ours.iter().zip(theirs).fold((0, 0), |(max, n), (a, b)| {
        let d = a.abs_diff(*b);
        (max.max(d), n + usize::from(d != 0))
    })
}

/// Max |Δ| in grey levels (|Δ| × std × 255, per channel) and the number of values whose
/// difference is at least half a grey level (an `f32` ulp is ~1e-5 grey levels).
fn grey_diff(ours: &[f32], theirs: &[f32], std: [f32; 3]) -> (f64, usize) {
    assert_eq!(ours.len(), theirs.len());
    let plane = ours.len() / 3;
    let mut max = 0.0f64;
    let mut differing = 0;
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        let grey = f64::from((a - b).abs()) * f64::from(std[i / plane]) * 255.0;
        max = max.max(grey);
        differing += usize::from(grey >= 0.5);
    }
    (max, differing)
}

fn hwc_to_planes(image: &RgbImage) -> Vec<u8> {
    let plane = image.as_raw().len() / 3;
    let mut out = vec![0u8; plane * 3];
    for (i, p) in image.pixels().enumerate() {
        for c in 0..3 {
            out[c * plane + i] = p[c];
        }
    }
    out
}

/// Stage 1: our decoder against Pillow's. PNG is lossless and our alpha-over-white blend is
/// PIL's `alpha_composite` formula; JPEG is decoded by libjpeg-turbo in both (the `image`
/// crate's zune-jpeg, used before, was up to 4 grey levels off on a quarter of the values);
/// WebP by libwebp in Pillow and `image-webp` here, measured identical on this fixture. All
/// three must be exact.
#[test]
fn decoding_matches_pillow() {
    let manifest = manifest();
    for image in manifest["images"].as_array().unwrap() {
        let name = text(image, "name");
        let ours = decode_image(&read(text(image, "file")), &ImageLimits::default()).unwrap();
        assert_eq!(
            ours.dimensions(),
            (num(image, "width"), num(image, "height")),
            "{name}"
        );
        let pillow = read(text(image, "decoded"));
        let (max, differing) = u8_diff(ours.as_raw(), &pillow);
        eprintln!(
            "{name}: decode vs Pillow: max {max} grey levels, {differing} of {} values differ",
            pillow.len()
        );
        assert_eq!((max, differing), (0, 0), "{name}: decodes as Pillow does");
    }
}

/// Stage 2: resize and crop from the same pixels are bit-exact, on both backends and every
/// processor, including Gemma 3's real 896 x 896 and LLaVA 1.5's 336 x 336 (both enlarging).
#[test]
fn resize_and_crop_match_hf_exactly() {
    let manifest = manifest();
    for case in manifest["cases"].as_array().unwrap() {
        let name = text(case, "name");
        let image = manifest["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == case["image"])
            .unwrap();
        let pillow = rgb(
            num(image, "width"),
            num(image, "height"),
            read(text(image, "decoded")),
        );
        let ours = resize_to_fit(&pillow, &config(case)).unwrap();
        assert_eq!(
            ours.dimensions(),
            (num(case, "width"), num(case, "height")),
            "{name}"
        );
        let theirs = match case.get("u8") {
            Some(file) => read(file.as_str().unwrap()),
            None => decode_image(&read(text(case, "png")), &ImageLimits::default())
                .unwrap()
                .into_raw(),
        };
        let (max, differing) = u8_diff(ours.as_raw(), &theirs);
        eprintln!("{name}: resize vs HF: max {max}, {differing} differ");
        assert_eq!((max, differing), (0, 0), "{name}");
    }
}

/// Normalisation from the same pixels: the torchvision backend's fused
/// `(v - 255 mean) / (255 std)` in f32 is reproduced bit for bit; the PIL backend rescales in
/// f64 and normalizes in f32 in two steps, a few f32 ulps away (well under 1e-3 grey levels).
#[test]
fn normalization_matches_hf() {
    let manifest = manifest();
    for case in manifest["cases"].as_array().unwrap() {
        let Some(f32_file) = case.get("f32") else {
            continue;
        };
        let name = text(case, "name");
        let theirs = f32s(&read(f32_file.as_str().unwrap()));
        let u8s = read(text(case, "u8"));
        let cfg = config(case);
        let resized = rgb(num(case, "width"), num(case, "height"), u8s);
        let ours = media::normalize(&resized, cfg.rescale_factor, cfg.image_mean, cfg.image_std);
        let (max, _) = grey_diff(&ours.data, &theirs, cfg.image_std);
        eprintln!("{name}: normalize vs HF: max {max:.2e} grey levels");

        match text(case, "backend") {
            "torchvision" => assert!(ours.data == theirs, "{name}: {max:e} grey levels"),
            _ => assert!(max < 1e-3, "{name}: {max:e} grey levels"),
        }
    }
}

/// Stage 3: bytes in, `pixel_values` out.
#[test]
fn matches_hf_end_to_end() {
    let manifest = manifest();
    for case in manifest["cases"].as_array().unwrap() {
        let Some(f32_file) = case.get("f32") else {
            continue;
        };
        let name = text(case, "name");
        let image = manifest["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == case["image"])
            .unwrap();
        let cfg = config(case);
        let decoded = decode_image(&read(text(image, "file")), &ImageLimits::default()).unwrap();
        let ours = preprocess(&decoded, &cfg).unwrap();
        let theirs = f32s(&read(f32_file.as_str().unwrap()));
        let (max, differing) = grey_diff(&ours.data, &theirs, cfg.image_std);
        // The same comparison on the pixels before normalisation, in whole grey levels.
        let ours_u8 = hwc_to_planes(&resize_to_fit(&decoded, &cfg).unwrap());
        let theirs_u8 = hwc_to_planes(&rgb(
            num(case, "width"),
            num(case, "height"),
            read(text(case, "u8")),
        ));
        let (max_u8, differing_u8) = u8_diff(&ours_u8, &theirs_u8);
        eprintln!(
            "{name}: end to end vs HF: max {max:.3} grey levels, {differing} of {} values differ \
             (u8: max {max_u8}, {differing_u8})",
            theirs.len()
        );
        // Every decode is Pillow's (stage 1): the torchvision backend bit for bit, the PIL
        // backend within its normalisation ulps.
        match text(case, "backend") {
            "torchvision" => assert!(ours.data == theirs, "{name}: {max} grey levels"),
            _ => assert!(max < 1e-3, "{name}: {max} grey levels"),
        }
    }
}

#[test]
fn configs_are_what_the_processors_use() {
    let manifest = manifest();
    for case in manifest["cases"].as_array().unwrap() {
        let cfg = config(case);
        let hf = &case["config"];
        let resample = match hf["resample"].as_u64() {
            Some(2) => Resample::Bilinear,
            Some(3) => Resample::Bicubic,
            other => panic!("resample {other:?}"),
        };
        assert_eq!(cfg.resample, resample);
        let crop = hf["do_center_crop"].as_bool().unwrap_or(false);
        assert_eq!(cfg.fit == Fit::CenterCrop, crop);
        let floats = |key: &str| -> Vec<f32> {
            hf[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect()
        };
        assert_eq!(cfg.image_mean.to_vec(), floats("image_mean"));
        assert_eq!(cfg.image_std.to_vec(), floats("image_std"));
        assert_eq!(cfg.rescale_factor, hf["rescale_factor"].as_f64().unwrap());
    }
}

// Qwen2-VL's dynamic-resolution processor (`Qwen2VLImageProcessor`, which Qwen2.5-VL keeps):
// smart_resize, a bicubic resize to the size it picks, normalisation, and patches.

/// The config `media` runs for one `qwen2_vl_cases` entry, read from the processor's own
/// config as `preprocessor_config.json` would hold it.
fn patch_config(case: &Value) -> media::PatchProcessorConfig {
    let hf = &case["config"];
    let int = |key: &str| hf[key].as_u64().unwrap_or_else(|| panic!("{key} in {hf}"));
    let floats = |key: &str| -> [f32; 3] {
        let v: Vec<f32> = hf[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        [v[0], v[1], v[2]]
    };
    assert_eq!(int("resample"), 3, "bicubic");
    media::PatchProcessorConfig {
        patch_size: int("patch_size") as u32,
        merge_size: int("merge_size") as u32,
        temporal_patch_size: int("temporal_patch_size") as u32,
        min_pixels: hf["size"]["shortest_edge"].as_u64().unwrap(),
        max_pixels: hf["size"]["longest_edge"].as_u64().unwrap(),
        resample: Resample::Bicubic,
        backend: match text(case, "backend") {
            "torchvision" => ResizeBackend::Torchvision,
            _ => ResizeBackend::Pil,
        },
        rescale_factor: hf["rescale_factor"].as_f64().unwrap(),
        image_mean: floats("image_mean"),
        image_std: floats("image_std"),
    }
}

fn image_of<'a>(manifest: &'a Value, case: &Value) -> &'a Value {
    manifest["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == case["image"])
        .unwrap()
}

/// The processor's pixels before rescaling, `H x W x 3`.
fn hf_u8(case: &Value) -> RgbImage {
    let bytes = match case.get("u8") {
        Some(file) => read(file.as_str().unwrap()),
        None => decode_image(&read(text(case, "png")), &ImageLimits::default())
            .unwrap()
            .into_raw(),
    };
    rgb(num(case, "width"), num(case, "height"), bytes)
}

/// sha256 of patches as little-endian f32, as the manifest records `pixel_values`.
fn patches_sha256(patches: &media::ImagePatches) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for v in &patches.data {
        hasher.update(v.to_le_bytes());
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn check_grid(case: &Value, patches: &media::ImagePatches) {
    let name = text(case, "name");
    let grid: Vec<u64> = case["image_grid_thw"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let ours = patches.grid;
    assert_eq!(
        grid,
        [u64::from(ours.t), u64::from(ours.h), u64::from(ours.w)],
        "{name}: image_grid_thw"
    );
    assert_eq!(
        patches.patch_len as u64,
        case["patch_len"].as_u64().unwrap(),
        "{name}"
    );
}

/// transformers' smart_resize on its table: every size, both factors, five budgets; a size it
/// gives with a zero side or over the budget is one `media` refuses.
#[test]
fn qwen2_vl_smart_resize_matches_transformers() {
    let manifest = manifest();
    let rows = manifest["qwen2_vl_smart_resize"].as_array().unwrap();
    assert!(rows.len() > 100);
    for row in rows {
        let n = |k: &str| row[k].as_u64().unwrap();
        let ours = media::smart_resize(
            n("height") as u32,
            n("width") as u32,
            n("factor") as u32,
            n("min_pixels"),
            n("max_pixels"),
        );
        let theirs = row["out"]
            .as_array()
            .map(|v| (v[0].as_u64().unwrap() as u32, v[1].as_u64().unwrap() as u32));
        match theirs {
            Some((h, w)) if h > 0 && w > 0 && u64::from(h) * u64::from(w) <= n("max_pixels") => {
                assert_eq!(ours.ok(), Some((h, w)), "{row}")
            }
            _ => assert!(ours.is_err(), "{row}: {ours:?}"),
        }
    }
}

/// From Pillow's pixels, the resize to the size smart_resize picks is bit-exact on both
/// backends, shrinking and (photo_webp's `_up` case) enlarging.
#[test]
fn qwen2_vl_resize_matches_hf_exactly() {
    let manifest = manifest();
    for case in manifest["qwen2_vl_cases"].as_array().unwrap() {
        let name = text(case, "name");
        let image = image_of(&manifest, case);
        let pillow = rgb(
            num(image, "width"),
            num(image, "height"),
            read(text(image, "decoded")),
        );
        let cfg = patch_config(case);
        let (w, h) = cfg.resized_size(pillow.width(), pillow.height()).unwrap();
        assert_eq!((w, h), (num(case, "width"), num(case, "height")), "{name}");
        let ours = resize_to_fit(
            &pillow,
            &ImageProcessorConfig {
                width: w,
                height: h,
                resample: cfg.resample,
                backend: cfg.backend,
                fit: Fit::Stretch,
                ..ImageProcessorConfig::clip(1)
            },
        )
        .unwrap();
        let (max, differing) = u8_diff(ours.as_raw(), hf_u8(case).as_raw());
        eprintln!("{name}: resize vs HF: max {max}, {differing} differ");
        assert_eq!((max, differing), (0, 0), "{name}");
    }
}

/// From the processor's own resized pixels, normalisation and patches: the torchvision
/// backend's `pixel_values` bit for bit (their sha256), the grid and row length exactly; the
/// PIL backend's normalised values within its few f32 ulps (as `normalization_matches_hf`).
#[test]
fn qwen2_vl_patches_match_hf() {
    let manifest = manifest();
    for case in manifest["qwen2_vl_cases"].as_array().unwrap() {
        let name = text(case, "name");
        let cfg = patch_config(case);
        let resized = hf_u8(case);
        let pixels = media::normalize(&resized, cfg.rescale_factor, cfg.image_mean, cfg.image_std);
        let patches = media::patchify(
            &pixels,
            cfg.patch_size,
            cfg.merge_size,
            cfg.temporal_patch_size,
        )
        .unwrap();
        check_grid(case, &patches);
        let hash = patches_sha256(&patches);
        if text(case, "backend") == "torchvision" {
            assert_eq!(hash, text(case, "pixel_values_sha256"), "{name}");
            eprintln!("{name}: pixel_values bit-exact");
        }
        if let Some(file) = case.get("f32") {
            let theirs = f32s(&read(file.as_str().unwrap()));
            let (max, _) = grey_diff(&pixels.data, &theirs, cfg.image_std);
            eprintln!("{name}: normalize vs HF: max {max:.2e} grey levels");
            assert!(max < 1e-3, "{name}: {max:e} grey levels");
        }
    }
}

/// Bytes in, patches out. Every format decodes as Pillow does (stage 1), so the torchvision
/// backend's `pixel_values` come out bit for bit and the PIL backend's pixels exactly.
#[test]
fn qwen2_vl_matches_hf_end_to_end() {
    let manifest = manifest();
    for case in manifest["qwen2_vl_cases"].as_array().unwrap() {
        let name = text(case, "name");
        let image = image_of(&manifest, case);
        let cfg = patch_config(case);
        let decoded = decode_image(&read(text(image, "file")), &ImageLimits::default()).unwrap();
        let patches = media::preprocess_patches(&decoded, &cfg).unwrap();
        check_grid(case, &patches);
        let (w, h) = cfg.resized_size(decoded.width(), decoded.height()).unwrap();
        let ours_u8 = resize_to_fit(
            &decoded,
            &ImageProcessorConfig {
                width: w,
                height: h,
                resample: cfg.resample,
                backend: cfg.backend,
                fit: Fit::Stretch,
                ..ImageProcessorConfig::clip(1)
            },
        )
        .unwrap();
        let (max_u8, differing_u8) = u8_diff(ours_u8.as_raw(), hf_u8(case).as_raw());
        let exact = patches_sha256(&patches) == text(case, "pixel_values_sha256");
        eprintln!(
            "{name}: end to end vs HF: u8 max {max_u8}, {differing_u8} of {} differ; \
             pixel_values bit-exact: {exact}",
            3 * w * h
        );
        match text(case, "backend") {
            "torchvision" => assert!(exact, "{name}"),
            _ => assert_eq!(max_u8, 0, "{name}"),
        }
    }
}
