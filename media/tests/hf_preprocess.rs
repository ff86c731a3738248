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
/// PIL's `alpha_composite` formula, so it must be exact. Lossy formats are decoded by other
/// code: JPEG by libjpeg-turbo in Pillow and by zune-jpeg in the `image` crate, which round
/// the IDCT, chroma upsampling or colour conversion differently (measured: up to 4 grey levels
/// on 12,990 of 51,360 values; which step is not yet pinned down); WebP by libwebp and by
/// `image-webp`, measured identical on this fixture.
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
        match text(image, "format") {
            "png" => assert_eq!((max, differing), (0, 0), "{name}: PNG decodes exactly"),
            "webp" => assert_eq!((max, differing), (0, 0), "{name}: measured exact"),
            _ => assert!(
                max <= DECODE_MAX_GREY,
                "{name}: decoders {max} grey levels apart"
            ),
        }
    }
}

/// The largest decoder difference measured on the JPEG fixture (see `decoding_matches_pillow`).
const DECODE_MAX_GREY: u8 = 4;

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
        // Lossless PNG and WebP (whose lossy decode matched libwebp's exactly, stage 1): the
        // torchvision backend bit for bit, the PIL backend within its normalisation ulps.
        // JPEG: stage 2 is exact from Pillow's pixels, so everything here is the decoders'
        // doing (zune-jpeg in the `image` crate against libjpeg-turbo, up to 4 grey levels
        // apart on a quarter of the decoded values); after the resize it is up to 2 grey levels (bilinear) or 3 (bicubic),
        // above issue 21's one-level target. That gap is open, not allowed: this bound only
        // keeps it from growing unnoticed.
        match (text(image, "format"), text(case, "backend")) {
            ("jpg", _) => assert!(
                max_u8 <= JPEG_END_TO_END_MAX_GREY,
                "{name}: {max} grey levels"
            ),
            (_, "torchvision") => assert!(ours.data == theirs, "{name}: {max} grey levels"),
            _ => assert!(max < 1e-3, "{name}: {max} grey levels"),
        }
    }
}

/// The largest end-to-end difference measured on the JPEG fixture (see `matches_hf_end_to_end`).
const JPEG_END_TO_END_MAX_GREY: u8 = 3;

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
