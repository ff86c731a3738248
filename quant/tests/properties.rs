//! Properties over arbitrary inputs: block repacking agrees with dequantization for any block
//! bytes, the rope permutation is a bijection undone by its inverse, and no byte string makes
//! the parsers panic.

mod support;

use mlx::Dtype;
use proptest::prelude::*;
use quant::{GgmlType, GgufFile, SafetensorsFile, Tensor};

const MAPPED: [(GgmlType, usize); 7] = [
    (GgmlType::Q4_0, 18),
    (GgmlType::Q4_1, 20),
    (GgmlType::Q5_0, 22),
    (GgmlType::Q5_1, 24),
    (GgmlType::Q8_0, 34),
    (GgmlType::Q4K, 144),
    (GgmlType::Q5K, 176),
];

/// Block bytes whose f16 fields are finite (any bit pattern elsewhere).
fn finite_f16s(mut bytes: Vec<u8>, ty: GgmlType) -> Vec<u8> {
    let fields: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        _ => &[0, 2],
    };
    let size = MAPPED
        .iter()
        .find(|(t, _)| *t == ty)
        .map(|&(_, s)| s)
        .unwrap_or(1);
    for block in bytes.chunks_mut(size) {
        for &at in fields {
            // Clear the top exponent bit: no infinities or NaNs, magnitudes below 2.
            block[at + 1] &= 0b1011_1111;
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn mlx_affine_repacking_equals_ggml_dequantization(
        which in 0..MAPPED.len(),
        rows in 1usize..4,
        seed in any::<u64>(),
    ) {
        let (ty, block_bytes) = MAPPED[which];
        let per_block = if block_bytes > 34 { 256 } else { 32 };
        let mut rng = support::Rng::new(seed);
        let bytes = finite_f16s(rng.bytes(rows * block_bytes), ty);
        let shape = [rows as i32, per_block];
        let ggml = quant::dequantize("p", ty, &bytes).unwrap();
        let tensor = quant::gguf_tensor("p", ty, &shape, &bytes).unwrap();
        prop_assert!(tensor.is_quantized());
        let mlx = tensor.into_dense(Some(Dtype::F32)).unwrap().to_vec::<f32>().unwrap();
        prop_assert_eq!(mlx, ggml);
    }

    #[test]
    fn unpermute_undoes_permute(heads in 1usize..5, half in 1usize..5, cols in 1usize..4) {
        let rows = heads * half * 2;
        let values: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let array = mlx::Array::from_slice(&values, &[rows as i32, cols as i32]).unwrap();
        let tensor = Tensor::Dense(array);
        let permuted = quant::permute_qk_rows(&tensor, heads).unwrap();
        let back = quant::unpermute_qk_rows(&permuted, heads).unwrap();
        let back = back.into_dense(None).unwrap().to_vec::<f32>().unwrap();
        prop_assert_eq!(back, values.clone());
        // A real permutation: every row appears once.
        let mut seen = permuted.into_dense(None).unwrap().to_vec::<f32>().unwrap();
        seen.sort_by(f32::total_cmp);
        prop_assert_eq!(seen, values);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_parsers(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let dir = support::scratch();
        let mut gguf = b"GGUF\x03\0\0\0".to_vec();
        gguf.extend(&bytes);
        let path = dir.path().join("x.gguf");
        std::fs::write(&path, &gguf).unwrap();
        let _ = GgufFile::open(&path);
        let path = dir.path().join("x.safetensors");
        std::fs::write(&path, &bytes).unwrap();
        let _ = SafetensorsFile::open(&path);
    }
}
