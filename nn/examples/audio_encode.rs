//! How long 30 s of audio takes to encode: `media::log_mel` (Whisper's 80-bin features of a
//! 30 s clip) and a Whisper encoder over its 3000 frames, with random weights of two sizes
//! built here (nothing is read from disk):
//!
//! - `tiny`: the `whisper_encoder` fixture's shape (d_model 64, 2 layers, 4 heads, FFN 128)
//!   with Whisper's full 1500 positions;
//! - `base`: whisper-base's encoder (d_model 512, 6 layers, 8 heads, FFN 2048);
//! - `large` (only with `--large`): whisper-large-v3's and Qwen2-Audio-7B's encoder (d_model
//!   1280, 32 layers, 20 heads, FFN 5120, 128 bins), 2.5 GB of f32 weights.
//!
//! ```sh
//! cargo run --release --example audio_encode -p mlxkit-nn [-- --large]
//! ```
//!
//! Each figure is the median of five runs after one warm-up, with MLX's evaluation forced
//! inside the timed region.

use std::time::{Duration, Instant};

use mlx::{Array, Dtype};
use nn::Weights;
use nn::audio::whisper::{Config, Encoder};
use quant::Tensor;

fn config(d_model: usize, layers: usize, heads: usize, ffn: usize, bins: usize) -> Config {
    Config {
        num_mel_bins: bins,
        d_model,
        encoder_layers: layers,
        encoder_attention_heads: heads,
        encoder_ffn_dim: ffn,
        max_source_positions: 1500,
        activation_function: "gelu".into(),
    }
}

/// Uniform weights in ±0.05 (LayerNorm scales around 1) named as a Whisper checkpoint's
/// encoder, `model.encoder.…`.
fn random_weights(c: &Config) -> Result<Weights, Box<dyn std::error::Error>> {
    let (d, f, m) = (
        c.d_model as i32,
        c.encoder_ffn_dim as i32,
        c.num_mel_bins as i32,
    );
    let mut shapes: Vec<(String, Vec<i32>)> = vec![
        ("conv1.weight".into(), vec![d, m, 3]),
        ("conv1.bias".into(), vec![d]),
        ("conv2.weight".into(), vec![d, d, 3]),
        ("conv2.bias".into(), vec![d]),
        ("embed_positions.weight".into(), vec![1500, d]),
        ("layer_norm.weight".into(), vec![d]),
        ("layer_norm.bias".into(), vec![d]),
    ];
    for i in 0..c.encoder_layers {
        let p = format!("layers.{i}");
        for norm in ["self_attn_layer_norm", "final_layer_norm"] {
            shapes.push((format!("{p}.{norm}.weight"), vec![d]));
            shapes.push((format!("{p}.{norm}.bias"), vec![d]));
        }
        for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
            shapes.push((format!("{p}.self_attn.{proj}.weight"), vec![d, d]));
            if proj != "k_proj" {
                shapes.push((format!("{p}.self_attn.{proj}.bias"), vec![d]));
            }
        }
        shapes.push((format!("{p}.fc1.weight"), vec![f, d]));
        shapes.push((format!("{p}.fc1.bias"), vec![f]));
        shapes.push((format!("{p}.fc2.weight"), vec![d, f]));
        shapes.push((format!("{p}.fc2.bias"), vec![d]));
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
        tensors.push((format!("model.encoder.{name}"), Tensor::Dense(value)));
    }
    Ok(Weights::new(tensors, Dtype::F32))
}

fn median(mut runs: Vec<Duration>) -> Duration {
    runs.sort();
    runs[runs.len() / 2]
}

fn time<T>(
    mut f: impl FnMut() -> Result<T, Box<dyn std::error::Error>>,
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
    // 30 s of a gliding tone with noise at 16 kHz.
    let samples: Vec<f32> = (0..480_000)
        .map(|i| {
            let t = i as f32 / 16_000.0;
            0.3 * (2.0 * std::f32::consts::PI * (200.0 + 50.0 * t) * t).sin()
                + 0.01 * (((i as u64 * 7919) % 1000) as f32 / 500.0 - 1.0)
        })
        .collect();
    let clip = media::AudioClip {
        samples,
        sample_rate: 16_000,
    };
    let limits = media::AudioLimits::default();

    // The machine's f32 matrix speed, for scale: one of whisper-base's FFN products.
    let key = mlx::random::key(1)?;
    let a = mlx::random::uniform(&[1500, 512], Dtype::F32, &key)?;
    let b = mlx::random::uniform(&[512, 2048], Dtype::F32, &key)?;
    mlx::eval([&a, &b])?;
    let matmul = time(|| {
        let out = a.matmul(&b)?;
        mlx::eval([&out])?;
        Ok(out)
    })?;
    let flops = 2.0 * 1500.0 * 512.0 * 2048.0;
    println!(
        "f32 matmul 1500x512 by 512x2048: {matmul:.1?} ({:.0} GFLOP/s)",
        flops / matmul.as_secs_f64() / 1e9
    );

    let mut sizes = vec![
        ("tiny", config(64, 2, 4, 128, 80)),
        ("base", config(512, 6, 8, 2048, 80)),
    ];
    if std::env::args().any(|a| a == "--large") {
        sizes.push(("large", config(1280, 32, 20, 5120, 128)));
    }
    for (name, c) in sizes {
        let bins = c.num_mel_bins;
        let mel_config = media::LogMelConfig::whisper(bins);
        let features = time(|| Ok(media::log_mel(&clip, &mel_config, &limits)?))?;
        let mel = media::log_mel(&clip, &mel_config, &limits)?;
        let input = Array::from_slice(&mel.features, &[1, bins as i32, 3000])?;

        let mut weights = random_weights(&c)?;
        let encoder = Encoder::new(c.clone(), &mut weights, "model.encoder")?;
        mlx::eval(&encoder.parameters())?;
        let encode = time(|| {
            let out = encoder.forward(&input)?;
            mlx::eval([&out])?;
            Ok(out)
        })?;
        // The convolutions over all 3000 frames with a single position through the layers:
        // what the stem costs alone.
        let stem = time(|| {
            let out = encoder.hidden_states(&input, 1)?;
            mlx::eval([&out])?;
            Ok(out)
        })?;
        println!(
            "{name:>5} (d_model {}, {} layers, {} bins): log-mel of 30 s {features:.1?}, \
             encoder over 3000 frames {encode:.1?} (convolutions {stem:.1?})",
            c.d_model, c.encoder_layers, bins
        );
    }
    Ok(())
}
