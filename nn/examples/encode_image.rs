//! How long a SigLIP vision tower takes to encode one image, on random weights of a real
//! model's size: what a user waits for per image before its tokens are even prefilled.
//!
//! ```sh
//! cargo run --release -p mlxkit-nn --example encode_image -- [PRESET|config.json] [RUNS]
//! ```
//!
//! `PRESET` is `gemma3` (Gemma 3 4B–27B's tower: 896-pixel images, 14-pixel patches, 4,096
//! patches, 27 layers of width 1,152) or `tiny` (the `gemma3_vision` test fixture's); a path
//! reads the `vision_config` of a transformers `config.json`. Weights are uniform in ±0.02 (the
//! time does not depend on their values). Prints each run's time after one warm-up run.

use std::time::Instant;

use mlx::{Array, Dtype};
use nn::vision::siglip::{Config, VisionModel};
use quant::Tensor;
use serde_json::{Value, json};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let which = args.get(1).map_or("gemma3", String::as_str);
    let runs: usize = args.get(2).map_or(Ok(3), |s| s.parse())?;
    let vision_config = match which {
        "gemma3" => json!({
            "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
            "num_attention_heads": 16, "image_size": 896, "patch_size": 14,
            "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6, "vision_use_head": false,
        }),
        "tiny" => json!({
            "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "image_size": 32, "patch_size": 8,
            "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-5, "vision_use_head": false,
        }),
        path => {
            let config: Value = serde_json::from_slice(&std::fs::read(path)?)?;
            config
                .get("vision_config")
                .cloned()
                .ok_or("the config has no vision_config")?
        }
    };
    let config = Config::from_json(&vision_config)?;
    let model = random_tower(config.clone())?;
    let side = config.image_size as i32;
    let pixels = mlx::random::uniform(&[1, 3, side, side], Dtype::F32, &mlx::random::key(7)?)?;
    println!(
        "SigLIP {which}: {} patches, {} layers of width {}, {} threads",
        config.num_patches(),
        config.num_hidden_layers,
        config.hidden_size,
        mlx::cpu_threads()
    );
    for run in 0..=runs {
        let start = Instant::now();
        let features = model.forward(&pixels)?;
        features.eval()?;
        let label = if run == 0 { "warm-up" } else { "run" };
        println!(
            "{label} {run}: {:.3} s per image",
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The tower with every transformers-named tensor drawn uniformly in ±0.02.
fn random_tower(config: Config) -> Result<VisionModel, Box<dyn std::error::Error>> {
    let hidden = config.hidden_size as i32;
    let inter = config.intermediate_size as i32;
    let patch = config.patch_size as i32;
    let patches = config.num_patches() as i32;
    let mut shapes: Vec<(String, Vec<i32>)> = vec![
        (
            "embeddings.patch_embedding.weight".into(),
            vec![hidden, 3, patch, patch],
        ),
        ("embeddings.patch_embedding.bias".into(), vec![hidden]),
        (
            "embeddings.position_embedding.weight".into(),
            vec![patches, hidden],
        ),
        ("post_layernorm.weight".into(), vec![hidden]),
        ("post_layernorm.bias".into(), vec![hidden]),
    ];
    for i in 0..config.num_hidden_layers {
        let p = format!("encoder.layers.{i}");
        for norm in ["layer_norm1", "layer_norm2"] {
            shapes.push((format!("{p}.{norm}.weight"), vec![hidden]));
            shapes.push((format!("{p}.{norm}.bias"), vec![hidden]));
        }
        for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
            shapes.push((format!("{p}.self_attn.{proj}.weight"), vec![hidden, hidden]));
            shapes.push((format!("{p}.self_attn.{proj}.bias"), vec![hidden]));
        }
        shapes.push((format!("{p}.mlp.fc1.weight"), vec![inter, hidden]));
        shapes.push((format!("{p}.mlp.fc1.bias"), vec![inter]));
        shapes.push((format!("{p}.mlp.fc2.weight"), vec![hidden, inter]));
        shapes.push((format!("{p}.mlp.fc2.bias"), vec![hidden]));
    }
    let keys = mlx::random::split(&mlx::random::key(0)?, shapes.len() as i32)?;
    let mut tensors = Vec::with_capacity(shapes.len());
    for ((name, shape), key) in shapes.into_iter().zip(keys) {
        let values: Array = mlx::random::uniform(&shape, Dtype::F32, &key)?
            .subtract(0.5f32)?
            .multiply(0.04f32)?;
        tensors.push((format!("vision.{name}"), Tensor::Dense(values)));
    }
    let mut weights = nn::Weights::new(tensors, Dtype::F32);
    let model = VisionModel::new(config, &mut weights, "vision")?;
    mlx::eval(&model.parameters())?;
    Ok(model)
}
