//! Gemma 3's pan and scan against transformers 5.24's `Gemma3ImageProcessorPil` with
//! `do_pan_and_scan` (fixtures from `scripts/make_pan_and_scan_fixtures.py`): the same crops,
//! and each crop's pixel values as the processor gives them, after the same decode, resize and
//! normalisation, within the PIL backend's normalisation ulps (as `hf_preprocess.rs` holds the
//! whole images to: under 1e-3 grey levels).

use std::path::{Path, PathBuf};

use media::{
    CropRect, ImageLimits, ImageProcessorConfig, PanAndScan, ResizeBackend, crop, decode_image,
    preprocess,
};
use serde_json::Value;

fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pan_and_scan")
}

fn read(path: PathBuf) -> Vec<u8> {
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn crops_and_pixels_match_gemma3s_processor() {
    let manifest: Value = serde_json::from_slice(&read(folder().join("manifest.json"))).unwrap();
    let size = manifest["size"].as_u64().unwrap() as u32;
    let config = ImageProcessorConfig {
        backend: ResizeBackend::Pil,
        ..ImageProcessorConfig::siglip(size)
    };
    let cases = manifest["cases"].as_array().unwrap();
    assert!(cases.iter().any(|c| c["num_crops"] == 0));
    assert!(cases.iter().any(|c| c["num_crops"] == 3));
    for case in cases {
        let image = case["image"].as_str().unwrap();
        let name = format!("{image} {}", case["case"]);
        let source = match image {
            "strip.png" => folder().join(image),
            _ => folder().join("../hf_preprocess").join(image),
        };
        let rgb = decode_image(&read(source), &ImageLimits::default()).unwrap();
        let cfg = &case["config"];
        let pan = PanAndScan {
            min_crop_size: cfg["pan_and_scan_min_crop_size"].as_u64().unwrap() as u32,
            max_num_crops: cfg["pan_and_scan_max_num_crops"].as_u64().unwrap() as u32,
            min_ratio_to_activate: cfg["pan_and_scan_min_ratio_to_activate"].as_f64().unwrap(),
        };
        let crops = pan.crops(rgb.width(), rgb.height());
        let want: Vec<CropRect> = case["crops"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let n = |i: usize| r[i].as_u64().unwrap() as u32;
                CropRect {
                    x: n(0),
                    y: n(1),
                    width: n(2),
                    height: n(3),
                }
            })
            .collect();
        assert_eq!(crops, want, "{name}");

        let theirs: Vec<f32> = read(folder().join(case["f32"].as_str().unwrap()))
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let plane = (3 * size * size) as usize;
        assert_eq!(theirs.len(), plane * (1 + crops.len()), "{name}");
        let images = std::iter::once(rgb.clone()).chain(crops.iter().map(|&r| crop(&rgb, r)));
        for (k, image) in images.enumerate() {
            let ours = preprocess(&image, &config).unwrap();
            let max = ours
                .data
                .iter()
                .zip(&theirs[k * plane..(k + 1) * plane])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            // |Δ| × std × 255: the difference in grey levels.
            let grey = max * 0.5 * 255.0;
            eprintln!("{name} image {k}: max {grey:.2e} grey levels");
            assert!(grey < 1e-3, "{name} image {k}: {grey} grey levels");
        }
    }
}
