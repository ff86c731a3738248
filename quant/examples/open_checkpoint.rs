//! Reading a checkpoint: `Checkpoint::open` on an mlx-lm style 4-bit directory, its HF config
//! and tensor names, a dense tensor and a quantized one, and a matmul straight from the packed
//! weights compared with the full-precision original.
//!
//! ```sh
//! cargo run --example open_checkpoint   # from quant
//! ```
//!
//! Real checkpoints come from disk; this example writes a tiny one (a `config.json` and a
//! `model.safetensors`) into a temporary directory first, so it needs no download. GGUF files
//! open through the same `Checkpoint::open` and look the same from there on.

use std::path::Path;

use mlx::quantized::{QuantSpec, quantize};
use mlx::{Array, Dtype, random};
use quant::{Checkpoint, Format};
use serde_json::{Map, Value, json};

const HIDDEN: i32 = 64;
const FFN: i32 = 16;
const VOCAB: i32 = 32;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The original weights, in f32, centred on zero.
    let embed = random::uniform(&[VOCAB, HIDDEN], Dtype::F32, &random::key(1)?)?.subtract(0.5)?;
    let down = random::uniform(&[FFN, HIDDEN], Dtype::F32, &random::key(2)?)?.subtract(0.5)?;

    // What mlx-lm's converter writes for `down_proj` at 4 bits: packed words, scales, biases.
    let spec = QuantSpec::affine(32, 4);
    let packed = quantize(&down, spec)?;
    let biases = packed
        .biases
        .as_ref()
        .ok_or("affine quantization has biases")?;
    let dir = tempfile::tempdir()?;
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "num_hidden_layers": 1,
        "vocab_size": VOCAB,
        "quantization": {"group_size": spec.group_size, "bits": spec.bits},
    });
    std::fs::write(dir.path().join("config.json"), config.to_string())?;
    write_safetensors(
        &dir.path().join("model.safetensors"),
        &[
            ("model.embed_tokens.weight", &embed),
            ("model.layers.0.mlp.down_proj.weight", &packed.weights),
            ("model.layers.0.mlp.down_proj.scales", &packed.scales),
            ("model.layers.0.mlp.down_proj.biases", biases),
        ],
    )?;

    let checkpoint = Checkpoint::open(dir.path())?;
    assert_eq!(checkpoint.format(), Format::Safetensors);
    println!(
        "opened a {} checkpoint with {} layer(s)",
        checkpoint.config()["model_type"].as_str().unwrap_or("?"),
        checkpoint.config()["num_hidden_layers"]
    );
    // Names are logical: the `.scales` and `.biases` companions fold into their weight.
    for name in checkpoint.names() {
        let tensor = checkpoint.tensor(&name)?;
        println!(
            "  {name}: shape {:?}, quantized {}",
            tensor.shape(),
            tensor.is_quantized()
        );
    }

    // The quantized weight multiplies activations without being dequantized first.
    let weight = checkpoint.tensor("model.layers.0.mlp.down_proj.weight")?;
    let q = weight
        .as_quantized()
        .ok_or("down_proj should load quantized")?;
    let x = random::uniform(&[1, HIDDEN], Dtype::F32, &random::key(3)?)?;
    let from_packed = q.matmul(&x, true)?;
    let exact = x.matmul(&down.transpose(&[1, 0])?)?;
    let dense = weight.into_dense(Some(Dtype::F32))?;
    println!(
        "x @ down_projᵀ: max |4-bit - f32| = {:.4} (outputs up to {:.2}); weights off by at most {:.4}",
        max_abs(&from_packed.subtract(&exact)?)?,
        max_abs(&exact)?,
        max_abs(&dense.subtract(&down)?)?
    );
    Ok(())
}

fn max_abs(a: &Array) -> Result<f32, mlx::Error> {
    a.abs()?.reshape(&[-1])?.max(&[0], false)?.item::<f32>()
}

/// A safetensors file: an 8-byte header length, a JSON header naming each tensor's dtype,
/// shape and byte range, then the bytes.
fn write_safetensors(
    path: &Path,
    tensors: &[(&str, &Array)],
) -> Result<(), Box<dyn std::error::Error>> {
    let mut header = Map::new();
    let mut data = Vec::new();
    for (name, array) in tensors {
        let dtype = match array.dtype() {
            Dtype::F32 => "F32",
            Dtype::U32 => "U32",
            other => return Err(format!("{name}: no safetensors name for {other:?} here").into()),
        };
        let bytes = array.to_bytes()?;
        let start = data.len();
        data.extend_from_slice(&bytes);
        header.insert(
            name.to_string(),
            json!({"dtype": dtype, "shape": array.shape(), "data_offsets": [start, data.len()]}),
        );
    }
    let header = Value::Object(header).to_string();
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&data);
    std::fs::write(path, file)?;
    Ok(())
}
