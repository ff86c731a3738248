//! Every GGUF tensor type round-tripped through hand-built files: Rust dequantization against
//! the f64 reference, and the MLX-quantized repacking against the same reference.

mod support;

use half::{bf16, f16};
use mlx::Dtype;
use quant::{GgmlType, GgufFile, MetaValue, Tensor};
use support::gguf_writer::GgufWriter;
use support::{BLOCK_TYPES, Rng, assert_close_to_reference, random_blocks, reference, type_id};

const ROWS: u64 = 3;

/// A GGUF file with one `[ROWS, cols]` tensor of each block type, rows long enough for two
/// blocks of that type, and plain F32/F16/BF16 tensors.
fn build_file(
    seed: u64,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    Vec<(String, Vec<u8>)>,
) {
    let mut rng = Rng::new(seed);
    let mut writer =
        GgufWriter::default().meta("general.architecture", MetaValue::String("test".into()));
    let mut blocks = Vec::new();
    for type_name in BLOCK_TYPES {
        let cols = 2 * support::block_elements(type_name) as u64;
        let n_blocks = (ROWS * cols) as usize / support::block_elements(type_name);
        let data = random_blocks(type_name, n_blocks, &mut rng);
        writer = writer.tensor(type_name, &[cols, ROWS], type_id(type_name), data.clone());
        blocks.push((type_name.to_string(), data));
    }
    let floats: Vec<f32> = (0..64).map(|_| rng.uniform(-2.0, 2.0)).collect();
    writer = writer
        .tensor(
            "F32",
            &[32, 2],
            0,
            floats.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
        .tensor(
            "F16",
            &[32, 2],
            1,
            floats
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect(),
        )
        .tensor(
            "BF16",
            &[32, 2],
            30,
            floats
                .iter()
                .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                .collect(),
        );
    let dir = support::scratch();
    let path = dir.path().join("types.gguf");
    std::fs::write(&path, writer.build()).unwrap();
    (dir, path, blocks)
}

#[test]
fn rust_dequantization_matches_the_reference_for_every_block_type() {
    for seed in 0..4 {
        let (_dir, path, blocks) = build_file(seed);
        let file = GgufFile::open(&path).unwrap();
        for (type_name, data) in &blocks {
            let info = file.tensor_info(type_name).unwrap();
            assert_eq!(info.ggml_type.to_string(), *type_name);
            let bytes = file.tensor_bytes(info).unwrap();
            assert_eq!(
                bytes,
                data.as_slice(),
                "{type_name}: data read back differs"
            );
            let values = quant::dequantize(type_name, info.ggml_type, bytes).unwrap();
            assert_close_to_reference(type_name, &values, &reference::dequantize(type_name, data));
        }
    }
}

#[test]
fn block_types_load_as_mlx_tensors_equal_to_the_reference() {
    let (_dir, path, blocks) = build_file(7);
    let file = GgufFile::open(&path).unwrap();
    for (type_name, data) in &blocks {
        let info = file.tensor_info(type_name).unwrap();
        let tensor = quant::gguf_tensor(
            type_name,
            info.ggml_type,
            &info.shape,
            file.tensor_bytes(info).unwrap(),
        )
        .unwrap();
        let cols = 2 * support::block_elements(type_name) as i32;
        assert_eq!(tensor.shape(), vec![ROWS as i32, cols], "{type_name}");
        assert_eq!(
            tensor.is_quantized(),
            quant::maps_to_mlx_affine(info.ggml_type),
            "{type_name}"
        );
        if let Tensor::Quantized(q) = &tensor {
            assert_eq!(q.spec.group_size, 32, "{type_name}");
            assert_eq!(q.scales.dtype(), Dtype::F32);
        }
        let values = tensor
            .into_dense(Some(Dtype::F32))
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert_close_to_reference(type_name, &values, &reference::dequantize(type_name, data));
    }
}

#[test]
fn legacy_types_dequantized_by_mlx_equal_ggml_exactly() {
    // Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K: every product d·q is exact in f32, so MLX's
    // `scale·q + bias` and GGML's own loops must agree bit for bit.
    let (_dir, path, _) = build_file(11);
    let file = GgufFile::open(&path).unwrap();
    for type_name in ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K"] {
        let info = file.tensor_info(type_name).unwrap();
        let bytes = file.tensor_bytes(info).unwrap();
        let ggml = quant::dequantize(type_name, info.ggml_type, bytes).unwrap();
        let tensor = quant::gguf_tensor(type_name, info.ggml_type, &info.shape, bytes).unwrap();
        let Tensor::Quantized(q) = tensor else {
            panic!("{type_name} did not load quantized");
        };
        let mlx = q
            .dequantize(Some(Dtype::F32))
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(mlx, ggml, "{type_name}");
    }
}

#[test]
fn quantized_matmul_reads_repacked_weights_correctly() {
    // Every mapped type, 4-, 5- and 8-bit: MLX's quantized matmul kernels (not only its
    // dequantize) must read the repacked words as intended.
    let (_dir, path, _) = build_file(3);
    let file = GgufFile::open(&path).unwrap();
    for type_name in ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K"] {
        let info = file.tensor_info(type_name).unwrap();
        let bytes = file.tensor_bytes(info).unwrap();
        let tensor = quant::gguf_tensor(type_name, info.ggml_type, &info.shape, bytes).unwrap();
        let cols = info.shape[1];
        let mut rng = Rng::new(17);
        let xs: Vec<f32> = (0..2 * cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let x = mlx::Array::from_slice(&xs, &[2, cols]).unwrap();
        let quantized = tensor.as_quantized().unwrap().matmul(&x, true).unwrap();
        let dense = tensor.clone().into_dense(None).unwrap();
        let expected = x.matmul(&dense.transpose(&[1, 0]).unwrap()).unwrap();
        let (a, b) = (
            quantized.to_vec::<f32>().unwrap(),
            expected.to_vec::<f32>().unwrap(),
        );
        assert_eq!(a.len(), 2 * ROWS as usize);
        for (a, b) in a.iter().zip(&b) {
            assert!(
                (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                "{type_name}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn plain_types_pass_through() {
    let (_dir, path, _) = build_file(5);
    let file = GgufFile::open(&path).unwrap();
    let f32_info = file.tensor_info("F32").unwrap();
    let reference =
        quant::dequantize("F32", GgmlType::F32, file.tensor_bytes(f32_info).unwrap()).unwrap();
    for (name, dtype) in [
        ("F32", Dtype::F32),
        ("F16", Dtype::F16),
        ("BF16", Dtype::Bf16),
    ] {
        let info = file.tensor_info(name).unwrap();
        assert_eq!(info.shape, vec![2, 32]);
        let tensor = quant::gguf_tensor(
            name,
            info.ggml_type,
            &info.shape,
            file.tensor_bytes(info).unwrap(),
        )
        .unwrap();
        let array = tensor.as_dense().unwrap();
        assert_eq!(array.dtype(), dtype);
        let values = array.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
        let rust =
            quant::dequantize(name, info.ggml_type, file.tensor_bytes(info).unwrap()).unwrap();
        assert_eq!(values, rust, "{name}");
        let tolerance = if name == "F32" { 0.0 } else { 1e-2 };
        for (v, r) in values.iter().zip(&reference) {
            assert!(
                (v - r).abs() <= tolerance * r.abs().max(1.0),
                "{name}: {v} vs {r}"
            );
        }
    }
}

#[test]
fn version_2_and_custom_alignment_read_the_same() {
    let mut rng = Rng::new(9);
    let data = random_blocks("Q8_0", 4, &mut rng);
    for (version, alignment) in [(2, 32), (3, 64), (3, 4096)] {
        let mut writer = GgufWriter {
            version,
            alignment,
            ..GgufWriter::default()
        };
        if alignment != 32 {
            writer = writer.meta("general.alignment", MetaValue::U32(alignment as u32));
        }
        writer = writer.tensor("a", &[32, 2], 8, data[..68].to_vec()).tensor(
            "b",
            &[32, 2],
            8,
            data[68..].to_vec(),
        );
        let dir = support::scratch();
        let path = dir.path().join("v.gguf");
        std::fs::write(&path, writer.build()).unwrap();
        let file = GgufFile::open(&path).unwrap();
        assert_eq!(file.version(), version);
        let b = file.tensor_info("b").unwrap();
        assert_eq!(b.offset % alignment, 0);
        assert_eq!(file.tensor_bytes(b).unwrap(), &data[68..]);
    }
}

#[test]
fn sixteen_wide_k_quants_have_a_packed_form_the_cpu_kernel_reads() {
    // Q2_K, Q3_K and Q6_K load dense; their packed form (8-bit integers in 16-element groups)
    // is what decode steps read through mlxkit's packed CPU kernel, so a product with it must
    // equal the product with the dense values. 2 rows of x take the packed kernel.
    let (_dir, path, _) = build_file(5);
    let file = GgufFile::open(&path).unwrap();
    for type_name in BLOCK_TYPES {
        let info = file.tensor_info(type_name).unwrap();
        let bytes = file.tensor_bytes(info).unwrap();
        let packed = quant::gguf_packed_16(type_name, info.ggml_type, &info.shape, bytes).unwrap();
        let Some(packed) = packed else {
            assert!(quant::maps_to_mlx_affine(info.ggml_type), "{type_name}");
            continue;
        };
        assert_eq!(
            (packed.spec.group_size, packed.spec.bits),
            (16, 8),
            "{type_name}"
        );
        assert!(packed.spec.has_packed_cpu_matvec(), "{type_name}");
        let dense = quant::gguf_tensor(type_name, info.ggml_type, &info.shape, bytes)
            .unwrap()
            .into_dense(Some(Dtype::F32))
            .unwrap();
        let cols = info.shape[1];
        let mut rng = Rng::new(19);
        let xs: Vec<f32> = (0..2 * cols).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let x = mlx::Array::from_slice(&xs, &[2, cols]).unwrap();
        let got = packed.matmul(&x, true).unwrap().to_vec::<f32>().unwrap();
        let expected = x
            .matmul(&dense.transpose(&[1, 0]).unwrap())
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(got.len(), 2 * ROWS as usize);
        // Sums of 512 products in another order: f32 rounding, relative to the magnitude.
        for (a, b) in got.iter().zip(&expected) {
            assert!(
                (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                "{type_name}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn sixteen_wide_k_quants_written_packed_read_back_as_the_gguf_loads_them() {
    // `create` writes a converted GGUF's Q2_K, Q3_K and Q6_K matrices in their packed form; a
    // folder holding one must load the very values the GGUF file loads (equal, not close: the
    // dequantization is one fused multiply-add, which these types' values make exact) and
    // hand the packed form back for the decode kernel.
    let (_dir, path, _) = build_file(11);
    let file = GgufFile::open(&path).unwrap();
    for type_name in ["Q2_K", "Q3_K", "Q6_K"] {
        let info = file.tensor_info(type_name).unwrap();
        let bytes = file.tensor_bytes(info).unwrap();
        let packed = quant::gguf_packed_16(type_name, info.ggml_type, &info.shape, bytes)
            .unwrap()
            .unwrap();
        assert_eq!(packed.spec, quant::PACKED_16);
        let expected = quant::gguf_tensor(type_name, info.ggml_type, &info.shape, bytes)
            .unwrap()
            .into_dense(None)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();

        let folder = support::scratch();
        let mut writer =
            quant::SafetensorsWriter::create(&folder.path().join("model.safetensors")).unwrap();
        writer.add("m.weight", &packed.weights).unwrap();
        writer.add("m.scales", &packed.scales).unwrap();
        writer
            .add("m.biases", packed.biases.as_ref().unwrap())
            .unwrap();
        writer.finish().unwrap();
        let config = serde_json::json!({
            "model_type": "test",
            "quantization": {"group_size": 16, "bits": 8, "mode": "affine"},
        });
        std::fs::write(folder.path().join("config.json"), config.to_string()).unwrap();

        let checkpoint = quant::Checkpoint::open(folder.path()).unwrap();
        let Tensor::Dense(dense) = checkpoint.tensor("m.weight").unwrap() else {
            panic!("{type_name}: the 16-element layout must load dense");
        };
        assert_eq!(dense.shape(), info.shape, "{type_name}");
        let got = dense.to_vec::<f32>().unwrap();
        // Equal as numbers; a zero may differ in sign (GGML's `(q − 4)·d` with a negative `d`
        // gives −0 where the multiply-add gives +0), which no product or sum can tell apart.
        let differing: Vec<(f32, f32)> = got
            .iter()
            .zip(&expected)
            .filter(|(a, b)| a != b)
            .map(|(a, b)| (*a, *b))
            .take(4)
            .collect();
        assert!(
            differing.is_empty(),
            "{type_name}: values differ from the GGUF's: {differing:?}"
        );
        let again = checkpoint.packed_16("m.weight").unwrap().unwrap();
        assert_eq!(
            again.weights.to_vec::<u32>().unwrap(),
            packed.weights.to_vec::<u32>().unwrap(),
            "{type_name}"
        );
        assert_eq!(
            checkpoint.stored_as("m.weight").unwrap(),
            quant::create::Stored::Mlx(quant::PACKED_16)
        );
    }
}
