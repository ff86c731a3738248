//! DFlash block drafters against mlx-vlm (issue 49).
//!
//! `nn/tests/fixtures/dflash/` holds a one-layer drafter drawn for the `llama` fixture (taps
//! at its layers 0 and 1, blocks of 4, mask token 500) and what mlx-vlm 0.7.10's own
//! `qwen3_dflash` drafter gives for two rounds over its context cache
//! (`scripts/make_dflash_fixture.py`), in f32: MLX's CPU computes no f64, so the reference is
//! as precise as the implementation under test; 1e-4 is the tolerance of every f32 parity test.

use std::path::{Path, PathBuf};

use mlx::{Array, Dtype};
use nn::arch::dflash::DFlash;
use nn::{Batch, Weights};
use quant::{SafetensorsFile, Tensor};

const TOLERANCE: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn config(name: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(fixture(name).join("config.json")).unwrap()).unwrap()
}

fn target() -> nn::load::Loaded {
    nn::load::load(&fixture("llama"), Some(Dtype::F32)).unwrap()
}

fn drafter(config: &serde_json::Value, target_config: &serde_json::Value) -> nn::Result<DFlash> {
    let file = SafetensorsFile::open(&fixture("dflash").join("model.safetensors")).unwrap();
    let tensors: Vec<(String, Tensor)> = file
        .entries()
        .keys()
        .map(|name| (name.clone(), Tensor::Dense(file.load(name).unwrap())))
        .collect();
    let mut weights = Weights::new(tensors, Dtype::F32);
    let drafter = DFlash::new(config, &mut weights, target_config)?;
    assert!(weights.unused().is_empty(), "{:?}", weights.unused());
    Ok(drafter)
}

fn assert_close(got: &[f32], expected: &[f32], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: lengths");
    let worst = got
        .iter()
        .zip(expected)
        .map(|(g, e)| (g - e).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= TOLERANCE, "{what}: worst difference {worst}");
}

#[test]
fn two_rounds_match_mlx_vlm() {
    let target = target();
    let model = target.model.as_ref();
    let drafter = drafter(&config("dflash"), &target.config_json).unwrap();
    assert_eq!(drafter.taps(), [0, 1]);
    assert_eq!((drafter.block_size(), drafter.mask_token()), (4, 500));
    let reference =
        SafetensorsFile::open(&fixture("dflash").join("reference.safetensors")).unwrap();
    let mut caches = drafter.new_caches();
    for round in ["1", "2"] {
        let context: Array = reference.load(&format!("context{round}")).unwrap();
        let block: Vec<i32> = reference
            .load(&format!("block{round}"))
            .unwrap()
            .to_vec()
            .unwrap();
        let expected: Vec<f32> = reference
            .load(&format!("logits{round}"))
            .unwrap()
            .to_vec()
            .unwrap();
        let hidden = drafter
            .draft(model, block[0] as u32, Some(&context), &mut caches)
            .unwrap();
        let logits: Vec<f32> = model.unembed(&hidden).unwrap().to_vec().unwrap();
        assert_close(&logits, &expected, &format!("round {round}"));
    }
    // A round with no new context drafts over what the caches hold.
    let again = drafter.draft(model, 7, None, &mut caches).unwrap();
    assert_eq!(again.shape(), [1, 3, 64]);
}

/// A tapped target offers its layers' outputs side by side, in the drafter's order; a forward
/// through fewer layers (a layer-skip draft) offers none.
#[test]
fn a_tapped_target_offers_its_layers_outputs() {
    let mut target = target();
    target.model.tap_layers(&[1, 0]).unwrap();
    let model = target.model.as_ref();
    let mut caches = model.new_caches().unwrap();
    let prompt = [5, 17, 200, 42];
    let forward = model
        .forward(&Batch::single(&prompt, 0).unwrap(), &mut caches)
        .unwrap();
    let conditioning = forward.conditioning.expect("taps offered");
    assert_eq!(conditioning.shape(), [1, 4, 128]);
    // The second half is layer 0's output: the first layer alone gives it.
    let mut fresh = model.new_caches().unwrap();
    let first = model
        .forward_rows_through(&Batch::single(&prompt, 0).unwrap(), &mut [&mut fresh], 1)
        .unwrap();
    assert!(first.conditioning.is_none());
    let mut plain = nn::load::load(&fixture("llama"), Some(Dtype::F32))
        .unwrap()
        .model;
    plain.tap_layers(&[0]).unwrap();
    let mut fresh = plain.new_caches().unwrap();
    let layer0: Vec<f32> = plain
        .forward(&Batch::single(&prompt, 0).unwrap(), &mut fresh)
        .unwrap()
        .conditioning
        .unwrap()
        .to_vec()
        .unwrap();
    let second: Vec<f32> = conditioning
        .slice_axis(-1, 64, 128)
        .unwrap()
        .to_vec()
        .unwrap();
    assert_close(&second, &layer0, "layer 0's output");
    let error = target.model.tap_layers(&[2]).unwrap_err().to_string();
    assert!(error.contains("layer 2"), "{error}");
}

#[test]
fn a_drafter_that_does_not_fit_its_target_is_refused_by_what_differs() {
    let target_config = config("llama");
    for (pointer, value, expected) in [
        (
            "/dflash_config/target_layer_ids",
            serde_json::json!([0, 5]),
            "layer 5, and the target has 2",
        ),
        (
            "/dflash_config/mask_token_id",
            serde_json::json!(600),
            "mask token 600 is outside",
        ),
        ("/block_size", serde_json::json!(1), "drafts nothing"),
    ] {
        let mut config = config("dflash");
        *config.pointer_mut(pointer).unwrap() = value;
        let error = drafter(&config, &target_config).err().unwrap().to_string();
        assert!(error.contains(expected), "{expected}: {error}");
    }
    let mut wider = target_config.clone();
    wider["hidden_size"] = 96.into();
    let error = drafter(&config("dflash"), &wider)
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("64 wide and the target 96"), "{error}");
}
