//! FP8 sources (committed by `scripts/make_quantized_sources.py` from the tiny Llama fixture):
//! HF fine-grained FP8 with partial 48x48 edge blocks, and compressed-tensors FP8 with a scale
//! per row. Each weight must decode to exactly the f32 value the reference dequantizer wrote
//! (one E4M3 value times one f32 scale: a single rounding, the same on both sides).

use std::path::{Path, PathBuf};

use mlx::Dtype;
use quant::create::{Action, Plan, Precision, Source, Stored, Target};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn fp8_weights_decode_to_the_reference_bits() {
    for name in ["fp8_block", "fp8_channel"] {
        let dir = fixture(name);
        let checkpoint = quant::Checkpoint::open(&dir).unwrap();
        let reference = mlx::load_safetensors(&dir.join("reference.safetensors")).unwrap();
        assert_eq!(
            reference.len(),
            14,
            "{name}: 7 projections in each of 2 layers"
        );
        for (tensor, expected) in &reference {
            let got = checkpoint.tensor(tensor).unwrap().into_dense(None).unwrap();
            assert_eq!(got.dtype(), Dtype::F32);
            assert_eq!(got.shape(), expected.shape(), "{name} {tensor}");
            let got: Vec<u32> = got
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            let want: Vec<u32> = expected
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert_eq!(got, want, "{name} {tensor}");
        }
        // The scales are folded into their weights, not tensors of their own.
        let names = checkpoint.names();
        assert!(
            names.iter().all(|n| !n.contains("weight_scale")),
            "{name}: {names:?}"
        );
    }
}

#[test]
fn fp8_sources_plan_to_mxfp8_by_default() {
    for name in ["fp8_block", "fp8_channel"] {
        let checkpoint = quant::Checkpoint::open(&fixture(name)).unwrap();
        let source = Source::read(&checkpoint).unwrap();
        assert_eq!(source.precision, Precision::Fp8(Dtype::F32), "{name}");
        let target = source.default_target();
        assert_eq!(target, Some(Target::Mxfp8), "{name}");
        let plan = Plan::new(&source, Target::Mxfp8);
        let q_proj = plan
            .tensors
            .iter()
            .find(|t| t.name == "model.layers.0.self_attn.q_proj.weight")
            .unwrap();
        assert_eq!(q_proj.stored, Stored::Fp8);
        assert_eq!(q_proj.action, Action::Requantize(Target::Mxfp8.base()));
    }
}

#[test]
fn other_quantized_sources_are_refused_by_their_method() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("fp8_channel").join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("fp8_channel").join("config.json")).unwrap())
            .unwrap();
    config["quantization_config"]["format"] = "pack-quantized".into();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let checkpoint = quant::Checkpoint::open(dir.path()).unwrap();
    let err = Source::read(&checkpoint).unwrap_err().to_string();
    assert!(err.contains("compressed-tensors (pack-quantized)"), "{err}");
}
