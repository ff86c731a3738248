//! `create --quantize` round trips on the tiny fixtures: each model is planned and written by
//! `quant::create` into an mlx-lm folder for every target, loaded back, and its logits compared
//! twice — with a dense model holding the dequantized weights (the folder must load exactly
//! what was quantized), and with the original (the quantization error itself, which must grow
//! with coarser types).

use std::path::{Path, PathBuf};

use mlx::Dtype;
use nn::Batch;
use quant::Tensor;
use quant::create::{Plan, Source, Target, write_folder};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

const TOKENS: [u32; 8] = [1, 5, 17, 42, 99, 3, 250, 7];

fn logits(dir: &Path) -> Vec<f32> {
    let loaded = nn::load::load(dir, Some(Dtype::F32)).unwrap();
    let model = loaded.model.as_ref();
    let mut caches = model.new_caches().unwrap();
    let out = model
        .forward(&Batch::single(&TOKENS, 0).unwrap(), &mut caches)
        .unwrap();
    let logits = model.unembed(&out.hidden).unwrap();
    logits.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Quantizes fixture `name` to `target` into `dir`.
fn quantize(name: &str, target: Target, dir: &Path) -> Plan {
    let checkpoint = quant::Checkpoint::open(&fixture(name)).unwrap();
    let plan = Plan::new(&Source::read(&checkpoint).unwrap(), target);
    write_folder(&checkpoint, &plan, dir, &mut |_, _, _| {}).unwrap();
    plan
}

/// The folder at `from` with every tensor dequantized to f32, and no quantization section.
fn dequantized_copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    let checkpoint = quant::Checkpoint::open(from).unwrap();
    let mut writer = quant::SafetensorsWriter::create(&to.join("model.safetensors")).unwrap();
    for name in checkpoint.names() {
        let dense = checkpoint
            .tensor(&name)
            .unwrap()
            .into_dense(Some(Dtype::F32))
            .unwrap();
        writer.add(&name, &dense).unwrap();
    }
    writer.finish().unwrap();
    let mut config = checkpoint.config().clone();
    let object = config.as_object_mut().unwrap();
    object.remove("quantization");
    object.remove("quantization_config");
    std::fs::write(to.join("config.json"), config.to_string()).unwrap();
}

/// Families with plain, untied-head, MoE, hybrid (convolution, recurrent) and Gemma 4's
/// (per-layer table, layer scalars, layers without keys) layouts.
const FAMILIES: [&str; 7] = [
    "llama",
    "llama_untied",
    "qwen3",
    "gemma3",
    "qwen3_moe",
    "qwen3_5",
    "gemma4",
];

#[test]
fn every_target_loads_exactly_what_it_quantized() {
    for family in FAMILIES {
        let original = logits(&fixture(family));
        let mut errors = Vec::new();
        for target in Target::ALL {
            let scratch = tempfile::tempdir().unwrap();
            let quantized_dir = scratch.path().join("q");
            let plan = quantize(family, target, &quantized_dir);
            assert!(
                !plan.layouts().is_empty(),
                "{family} {target}: nothing was quantized"
            );
            let quantized = logits(&quantized_dir);
            let dense_dir = scratch.path().join("dense");
            dequantized_copy(&quantized_dir, &dense_dir);
            let reference = logits(&dense_dir);
            // Same weights, read quantized or dense: only the summation order differs (the
            // packed CPU kernel against a dense product), ~1e-7 relative per sum, grown through
            // the layers and, in the hybrid, its recurrent state: measured up to 7.2e-6 of the
            // largest logit (qwen3_5, int8). A folder read with a wrong layout is off by whole
            // units.
            let load_error = max_abs_diff(&quantized, &reference);
            let scale = reference.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            assert!(
                load_error <= 2e-5 * scale,
                "{family} {target}: quantized folder loads {load_error} away from its own dequantized weights"
            );
            errors.push((target, max_abs_diff(&quantized, &original)));
        }
        let error = |t: Target| errors.iter().find(|(e, _)| *e == t).unwrap().1;
        eprintln!("{family}: max |Δlogit| against the original: {errors:?}");
        // Quantization really happened, and 8 bits per weight err less than 4.
        for (target, e) in &errors {
            assert!(*e > 0.0, "{family} {target}: no quantization error at all");
        }
        assert!(
            error(Target::Int8) < error(Target::Int4),
            "{family}: {errors:?}"
        );
        assert!(
            error(Target::Mxfp8) < error(Target::Mxfp4),
            "{family}: {errors:?}"
        );
    }
}

#[test]
fn the_int4_plan_of_an_untied_model_follows_the_policy() {
    let checkpoint = quant::Checkpoint::open(&fixture("llama_untied")).unwrap();
    let plan = Plan::new(&Source::read(&checkpoint).unwrap(), Target::Int4);
    insta::assert_snapshot!(plan.to_string());
}

#[test]
fn moe_experts_are_written_stacked_each_projection_in_its_own_precision() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("q");
    let plan = quantize("qwen3_moe", Target::Int4, &dir);
    insta::assert_snapshot!(plan.to_string());
    let written = quant::Checkpoint::open(&dir).unwrap();
    let names = written.names();
    assert!(
        !names.iter().any(|n| n.contains(".experts.0.")),
        "per-expert tensors were written: {names:?}"
    );
    let source = quant::Checkpoint::open(&fixture("qwen3_moe")).unwrap();
    let experts = source
        .names()
        .iter()
        .filter(|n| {
            n.starts_with("model.layers.0.mlp.experts.") && n.ends_with(".gate_proj.weight")
        })
        .count() as i32;
    assert!(experts > 1);
    // gate and up in the int4 base, down promoted to int8: mixed precision per projection.
    for (projection, bits) in [("gate_proj", 4), ("up_proj", 4), ("down_proj", 8)] {
        let name = format!("model.layers.0.mlp.experts.{projection}.weight");
        let Tensor::Quantized(q) = written.tensor(&name).unwrap() else {
            panic!("{name} is not quantized");
        };
        assert_eq!(q.spec.bits, bits, "{name}");
        assert_eq!(q.weights.shape()[0], experts, "{name}");
        // Expert e of the stack is expert e of the source, quantized on its own.
        let last = format!(
            "model.layers.0.mlp.experts.{}.{projection}.weight",
            experts - 1
        );
        let alone = mlx::quantized::quantize(
            &source
                .tensor(&last)
                .unwrap()
                .into_dense(Some(Dtype::F32))
                .unwrap(),
            q.spec,
        )
        .unwrap();
        let slice = q
            .weights
            .slice_axis(0, experts - 1, experts)
            .unwrap()
            .squeeze(&[0])
            .unwrap();
        assert_eq!(
            slice.to_vec::<u32>().unwrap(),
            alone.weights.to_vec::<u32>().unwrap(),
            "{name}"
        );
    }
}

/// Every family whose checkpoint stores one matrix per expert reads the stacks `create`
/// writes: the stacked folder gives the logits of its own weights read dense (tolerance as in
/// `every_target_loads_exactly_what_it_quantized`).
#[test]
fn every_moe_family_loads_its_stacked_experts() {
    for family in [
        "mixtral",
        "deepseek_v3",
        "glm4_moe_lite",
        "nemotron_h_moe",
        "qwen3_5_moe",
        "qwen3_next",
    ] {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("q");
        let plan = quantize(family, Target::Int8, &dir);
        assert!(
            plan.tensors.iter().any(|t| !t.members.is_empty()),
            "{family}: no experts were stacked"
        );
        let names = quant::Checkpoint::open(&dir).unwrap().names();
        assert!(
            !names.iter().any(|n| n.contains(".experts.0.")),
            "{family}: per-expert tensors were written"
        );
        let dense_dir = scratch.path().join("dense");
        dequantized_copy(&dir, &dense_dir);
        let reference = logits(&dense_dir);
        let error = max_abs_diff(&logits(&dir), &reference);
        let scale = reference.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        assert!(error <= 2e-5 * scale, "{family}: {error} (scale {scale})");
    }
}

/// The tiny Llama with its projections replaced by the FP8 fixture's reference dequantization,
/// written dense into `dir`.
fn fp8_reference_folder(source: &str, dir: &Path) {
    let quant_fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../quant/tests/fixtures");
    let reference =
        mlx::load_safetensors(&quant_fixtures.join(source).join("reference.safetensors")).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let llama = quant::Checkpoint::open(&fixture("llama")).unwrap();
    let mut writer = quant::SafetensorsWriter::create(&dir.join("model.safetensors")).unwrap();
    for name in llama.names() {
        let tensor = match reference.iter().find(|(n, _)| *n == name) {
            Some((_, array)) => array.clone(),
            None => llama.tensor(&name).unwrap().into_dense(None).unwrap(),
        };
        writer.add(&name, &tensor).unwrap();
    }
    writer.finish().unwrap();
    std::fs::copy(
        fixture("llama").join("config.json"),
        dir.join("config.json"),
    )
    .unwrap();
}

#[test]
fn fp8_and_nvfp4_sources_load_as_their_reference_and_create_their_mlx_layout() {
    let quant_fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../quant/tests/fixtures");
    for (source, default) in [
        ("fp8_block", Target::Mxfp8),
        ("fp8_channel", Target::Mxfp8),
        ("nvfp4_modelopt", Target::Nvfp4),
        ("nvfp4_compressed", Target::Nvfp4),
    ] {
        let scratch = tempfile::tempdir().unwrap();
        let reference_dir = scratch.path().join("reference");
        fp8_reference_folder(source, &reference_dir);
        let reference = logits(&reference_dir);
        // Read in place, the FP8 folder is its reference weights exactly: same logits.
        let fp8_dir = quant_fixtures.join(source);
        assert_eq!(logits(&fp8_dir), reference, "{source}");

        let checkpoint = quant::Checkpoint::open(&fp8_dir).unwrap();
        let plan_source = Source::read(&checkpoint).unwrap();
        let target = plan_source.default_target().unwrap();
        assert_eq!(target, default, "{source}");
        let plan = Plan::new(&plan_source, target);
        let quantized_dir = scratch.path().join("q");
        write_folder(&checkpoint, &plan, &quantized_dir, &mut |_, _, _| {}).unwrap();
        let quantized = logits(&quantized_dir);
        let dense_dir = scratch.path().join("dense");
        dequantized_copy(&quantized_dir, &dense_dir);
        let scale = reference.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        let load_error = max_abs_diff(&quantized, &logits(&dense_dir));
        assert!(load_error <= 2e-5 * scale, "{source}: {load_error}");
        eprintln!(
            "{source}: {target} moves logits by {} (max |logit| {scale})",
            max_abs_diff(&quantized, &reference)
        );
    }
}

/// `create` converts a GGUF file once into MLX's layouts (`Plan::as_loaded`): every GGUF copy of
/// a fixture, written that way, loads into the model the GGUF file loads into — the same
/// logits, not close ones, since every tensor is written as the GGUF loader produced it and
/// the translated config goes with it. Fixtures are found by their `model.gguf`, so a family
/// that gains a GGUF copy is covered here too.
#[test]
fn converted_gguf_copies_load_as_their_gguf_files_do() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            e.path()
                .join("model.gguf")
                .exists()
                .then(|| e.file_name().to_string_lossy().into_owned())
        })
        .collect();
    names.sort();
    assert!(names.len() >= 22, "GGUF copies found: {names:?}");
    for name in &names {
        let gguf = fixture(name).join("model.gguf");
        let checkpoint = quant::Checkpoint::open(&gguf).unwrap();
        let plan = Plan::as_loaded(&Source::read(&checkpoint).unwrap());
        assert!(
            plan.tensors
                .iter()
                .all(|t| t.action == quant::create::Action::Keep),
            "{name}: a conversion quantizes nothing"
        );
        let dir = tempfile::tempdir().unwrap();
        write_folder(&checkpoint, &plan, dir.path(), &mut |_, _, _| {}).unwrap();
        let (expected, got) = (logits(&gguf), logits(dir.path()));
        assert_eq!(
            max_abs_diff(&got, &expected),
            0.0,
            "{name}: the converted folder computes other logits"
        );
    }
}
