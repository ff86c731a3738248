//! How long Whisper takes over one 30 s window: the encoder and cross-attention projections
//! (once per window), then the decoder for a transcript of `TOKENS` tokens (a forced prompt of
//! four, then one token a step over the self-attention cache, each step's logits read back as
//! greedy decoding does), with random weights of two sizes built here:
//!
//! - `tiny`: the `whisper` fixture's shape (d_model 32, 2+2 layers, 2 heads, FFN 64, 382
//!   tokens) with Whisper's full 1500 positions;
//! - `base`: whisper-base (d_model 512, 6+6 layers, 8 heads, FFN 2048, 51865 tokens).
//!
//! ```sh
//! cargo run --release --example whisper_decode -p mlxkit-nn
//! ```
//!
//! Each figure is the median of five runs after one warm-up, MLX's evaluation forced inside
//! the timed region.

use std::time::{Duration, Instant};

use mlx::{Array, Dtype};
use nn::Weights;
use nn::audio::whisper_model::Whisper;
use quant::Tensor;
use serde_json::json;

/// Tokens decoded per window: about what 30 s of speech transcribes to.
const TOKENS: usize = 100;

struct Shape {
    name: &'static str,
    d: i32,
    layers: usize,
    heads: usize,
    ffn: i32,
    vocab: i32,
}

/// Uniform weights in ±0.05 (LayerNorm scales around 1), named as a Whisper checkpoint's.
fn random_weights(s: &Shape) -> Result<Weights, Box<dyn std::error::Error>> {
    let (d, f) = (s.d, s.ffn);
    let mut shapes: Vec<(String, Vec<i32>)> = vec![
        ("model.encoder.conv1.weight".into(), vec![d, 80, 3]),
        ("model.encoder.conv1.bias".into(), vec![d]),
        ("model.encoder.conv2.weight".into(), vec![d, d, 3]),
        ("model.encoder.conv2.bias".into(), vec![d]),
        ("model.encoder.embed_positions.weight".into(), vec![1500, d]),
        ("model.decoder.embed_tokens.weight".into(), vec![s.vocab, d]),
        ("model.decoder.embed_positions.weight".into(), vec![448, d]),
    ];
    for part in ["encoder", "decoder"] {
        shapes.push((format!("model.{part}.layer_norm.weight"), vec![d]));
        shapes.push((format!("model.{part}.layer_norm.bias"), vec![d]));
        let (norms, attns): (&[&str], &[&str]) = if part == "encoder" {
            (
                &["self_attn_layer_norm", "final_layer_norm"],
                &["self_attn"],
            )
        } else {
            (
                &[
                    "self_attn_layer_norm",
                    "encoder_attn_layer_norm",
                    "final_layer_norm",
                ],
                &["self_attn", "encoder_attn"],
            )
        };
        for i in 0..s.layers {
            let p = format!("model.{part}.layers.{i}");
            for norm in norms {
                shapes.push((format!("{p}.{norm}.weight"), vec![d]));
                shapes.push((format!("{p}.{norm}.bias"), vec![d]));
            }
            for attn in attns {
                for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                    shapes.push((format!("{p}.{attn}.{proj}.weight"), vec![d, d]));
                    if proj != "k_proj" {
                        shapes.push((format!("{p}.{attn}.{proj}.bias"), vec![d]));
                    }
                }
            }
            shapes.push((format!("{p}.fc1.weight"), vec![f, d]));
            shapes.push((format!("{p}.fc1.bias"), vec![f]));
            shapes.push((format!("{p}.fc2.weight"), vec![d, f]));
            shapes.push((format!("{p}.fc2.bias"), vec![d]));
        }
    }
    let mut key = mlx::random::key(0)?;
    let mut tensors = Vec::with_capacity(shapes.len());
    for (name, shape) in shapes {
        let split = mlx::random::split(&key, 2)?;
        key = split[0].clone();
        let noise = mlx::random::uniform(&shape, Dtype::F32, &split[1])?
            .subtract(0.5)?
            .multiply(0.1)?;
        let value = if name.contains("norm.weight") {
            noise.add(1.0)?
        } else {
            noise
        };
        mlx::eval([&value])?;
        tensors.push((name, Tensor::Dense(value)));
    }
    Ok(Weights::new(tensors, Dtype::F32))
}

fn median(mut runs: Vec<Duration>) -> Duration {
    runs.sort();
    runs[runs.len() / 2]
}

fn time(
    mut f: impl FnMut() -> Result<(), Box<dyn std::error::Error>>,
) -> Result<Duration, Box<dyn std::error::Error>> {
    f()?;
    let mut runs = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        f()?;
        runs.push(start.elapsed());
    }
    Ok(median(runs))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let shapes = [
        Shape {
            name: "tiny",
            d: 32,
            layers: 2,
            heads: 2,
            ffn: 64,
            vocab: 382,
        },
        Shape {
            name: "base",
            d: 512,
            layers: 6,
            heads: 8,
            ffn: 2048,
            vocab: 51865,
        },
    ];
    let features = mlx::random::uniform(&[1, 80, 3000], Dtype::F32, &mlx::random::key(1)?)?;
    for s in &shapes {
        let config = json!({
            "model_type": "whisper", "vocab_size": s.vocab, "num_mel_bins": 80,
            "d_model": s.d, "encoder_layers": s.layers, "decoder_layers": s.layers,
            "encoder_attention_heads": s.heads, "decoder_attention_heads": s.heads,
            "encoder_ffn_dim": s.ffn, "decoder_ffn_dim": s.ffn,
            "max_source_positions": 1500, "max_target_positions": 448,
        });
        let mut weights = random_weights(s)?;
        let model = Whisper::new(&config, &mut weights)?;
        mlx::eval(&model.parameters())?;
        let encode = time(|| {
            model.encode(&features)?;
            Ok(())
        })?;
        let cross = model.encode(&features)?;
        let decode = time(|| {
            let mut cache = model.decoder().new_cache();
            let mut input = Array::from_slice(&[1i32, 2, 3, 4], &[1, 4])?;
            for step in 0..TOKENS {
                let logits = model.decoder().forward(&input, &cross, &mut cache)?;
                let last = logits.dim(1)?;
                let next = logits.slice_axis(1, last - 1, last)?.argmax(-1, false)?;
                mlx::eval([&next])?;
                // A fixed token stream, so every run does the same work whatever the weights.
                input = Array::from_slice(&[(5 + step % 200) as i32], &[1, 1])?;
            }
            Ok(())
        })?;
        println!(
            "{:5} encode 30 s {:8.1} ms | decode {TOKENS} tokens {:8.1} ms ({:.2} ms/token) | window total {:8.1} ms",
            s.name,
            encode.as_secs_f64() * 1e3,
            decode.as_secs_f64() * 1e3,
            decode.as_secs_f64() * 1e3 / TOKENS as f64,
            (encode + decode).as_secs_f64() * 1e3,
        );
    }
    Ok(())
}
