//! Errors raised while evaluating, not only while building the graph, come back as errors.

use std::io::Write;

use mlx::Array;

/// A minimal safetensors file with one f32 tensor of `n` elements.
fn safetensors_bytes(name: &str, n: usize) -> Vec<u8> {
    let header = format!(
        r#"{{"{name}":{{"dtype":"F32","shape":[{n}],"data_offsets":[0,{}]}}}}"#,
        n * 4
    );
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    for i in 0..n {
        bytes.extend_from_slice(&(i as f32).to_le_bytes());
    }
    bytes
}

#[test]
fn loading_a_file_that_shrank_before_eval_is_an_error() {
    let dir = std::env::temp_dir().join(format!("mlx-eval-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.safetensors");
    let n = 1 << 16;
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&safetensors_bytes("w", n))
        .unwrap();

    let loaded = mlx::load_safetensors(&path).unwrap();
    assert_eq!(loaded.len(), 1);
    assert_eq!(loaded[0].0, "w");
    let w: &Array = &loaded[0].1;
    assert_eq!(w.shape(), vec![n as i32]);
    let values = w.to_vec::<f32>().unwrap();
    assert_eq!(values[12345], 12345.0);

    // Load again lazily, then cut the file short: the read happens inside eval.
    let lazy = mlx::load_safetensors(&path).unwrap();
    let sum = lazy[0].1.sum(&[0], false).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(100)
        .unwrap();
    let result = sum.eval();
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        result.is_err(),
        "reading past the end of a shrunk file must fail, got {result:?}"
    );

    // The process and MLX remain usable.
    let ok = Array::from_slice(&[1.0f32, 2.0], &[2])
        .unwrap()
        .sum(&[0], false)
        .unwrap();
    assert_eq!(ok.item::<f32>().unwrap(), 3.0);
}

#[test]
fn a_truncated_file_is_an_error_at_load() {
    let dir = std::env::temp_dir().join(format!("mlx-truncated-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.safetensors");
    let bytes = safetensors_bytes("t", 64);
    std::fs::write(&path, &bytes[..20]).unwrap();
    let result = mlx::load_safetensors(&path);
    std::fs::remove_dir_all(&dir).ok();
    assert!(result.is_err());
}
