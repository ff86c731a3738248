//! FP8 and NVFP4 sources (committed by `scripts/make_quantized_sources.py` from the tiny Llama
//! fixture): HF fine-grained FP8 with partial 48x48 edge blocks, compressed-tensors FP8 with a
//! scale per row, and NVFP4 in ModelOpt's and compressed-tensors' layouts. Each weight must
//! decode to exactly the f32 value the reference dequantizer wrote: the same f32 operations in
//! the same order on both sides (the script's are exact in double, then rounded once).

use std::path::{Path, PathBuf};

use mlx::Dtype;
use quant::create::{Action, Plan, Precision, Source, Stored, Target};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn weights_decode_to_the_reference_bits() {
    for name in [
        "fp8_block",
        "fp8_channel",
        "nvfp4_modelopt",
        "nvfp4_compressed",
    ] {
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
            names
                .iter()
                .all(|n| !n.contains("_scale") && !n.contains("weight_packed")),
            "{name}: {names:?}"
        );
        for (tensor, _) in &reference {
            assert!(names.contains(tensor), "{name}: {tensor} not listed");
        }
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

#[test]
fn nvfp4_sources_plan_to_nvfp4_and_say_why_they_are_requantized() {
    for name in ["nvfp4_modelopt", "nvfp4_compressed"] {
        let checkpoint = quant::Checkpoint::open(&fixture(name)).unwrap();
        let source = Source::read(&checkpoint).unwrap();
        assert_eq!(source.precision, Precision::Nvfp4(Dtype::F32), "{name}");
        assert_eq!(source.default_target(), Some(Target::Nvfp4), "{name}");
        let plan = Plan::new(&source, Target::Nvfp4);
        let q_proj = plan
            .tensors
            .iter()
            .find(|t| t.name == "model.layers.0.self_attn.q_proj.weight")
            .unwrap();
        assert_eq!(q_proj.shape, vec![64, 64]);
        assert_eq!(q_proj.stored, Stored::Nvfp4);
        assert_eq!(q_proj.action, Action::Requantize(Target::Nvfp4.base()));
        assert!(
            q_proj
                .reason
                .as_deref()
                .unwrap()
                .contains("per-tensor scale")
        );
    }
}

/// With a per-tensor scale of 1, ModelOpt's bytes are MLX's `nvfp4` layout and pass through:
/// MLX's own dequantization of them equals the reference decoding.
#[test]
fn a_unit_scale_nvfp4_weight_passes_through_in_mlx_layout() {
    let dir = tempfile::tempdir().unwrap();
    let source = fixture("nvfp4_modelopt");
    std::fs::copy(source.join("config.json"), dir.path().join("config.json")).unwrap();
    let mut tensors = mlx::load_safetensors(&source.join("model.safetensors")).unwrap();
    for (name, array) in tensors.iter_mut() {
        if name.ends_with("weight_scale_2") {
            *array = mlx::Array::from_slice(&[1.0f32], &[]).unwrap();
        }
    }
    // load_safetensors reads E4M3 scales as MLX's own fp8-less bytes: write them back by hand.
    let raw = quant::SafetensorsFile::open(&source.join("model.safetensors")).unwrap();
    let mut writer =
        quant::SafetensorsWriter::create(&dir.path().join("model.safetensors")).unwrap();
    let mut e4m3 = Vec::new();
    for (name, array) in &tensors {
        if raw.entries()[name].e4m3 {
            e4m3.push(name.clone());
        }
        writer.add(name, array).unwrap();
    }
    writer.finish().unwrap();
    mark_e4m3(&dir.path().join("model.safetensors"), &e4m3);

    let checkpoint = quant::Checkpoint::open(dir.path()).unwrap();
    let name = "model.layers.1.mlp.down_proj.weight";
    let stored = checkpoint.stored_as(name).unwrap();
    assert_eq!(stored, Stored::Mlx(Target::Nvfp4.base()));
    let quant::Tensor::Quantized(q) = checkpoint.tensor(name).unwrap() else {
        panic!("{name} did not pass through quantized");
    };
    let mlx_values = q
        .dequantize(Some(Dtype::F32))
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let module = name.trim_end_matches(".weight");
    let packed = raw.load(name).unwrap().to_vec::<u8>().unwrap();
    let scales = raw
        .load(&format!("{module}.weight_scale"))
        .unwrap()
        .to_vec::<u8>()
        .unwrap();
    let expected = quant::dequantize_nvfp4(
        name,
        &packed,
        &q.dequantize(None).unwrap().shape(),
        &scales,
        quant::Nvfp4Global::Times(1.0),
    )
    .unwrap()
    .to_vec::<f32>()
    .unwrap();
    assert_eq!(mlx_values, expected);
}

/// Rewrites the dtype of `names` in a safetensors header from U8 to F8_E4M3 (same size).
fn mark_e4m3(path: &Path, names: &[String]) {
    let bytes = std::fs::read(path).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    for name in names {
        header[name]["dtype"] = "F8_E4M3".into();
    }
    let mut text = header.to_string().into_bytes();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + len..]);
    std::fs::write(path, out).unwrap();
}
