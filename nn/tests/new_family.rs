//! What adding a family takes: `house_llama`, a renamed copy of the Llama decoder written
//! outside the crate, registered at run time and run on the Llama fixture's weights.
//!
//! This one file is the whole family: its blocks, its `Model`, and its registration
//! ([`registry::register`]). It writes no cache layout (the default reads it from the spec),
//! no attention literal (the parts' builder fills the defaults) and no parameter formula (the
//! count comes from the checkpoint's tensors). A family inside the crate takes three files:
//! `arch/<name>.rs`, its `mod` line in `arch/mod.rs` and its entry in `registry.rs`; a fourth,
//! `quant/src/gguf_config.rs`, names it for GGUF files (issue 47, point 4).

use std::path::Path;
use std::sync::Once;

use kvcache::{LayerCache, LogicalMask};
use mlx::{Array, Dtype};
use nn::activation::Activation;
use nn::arch::llama::Config;
use nn::attention::{Attention, AttentionParts};
use nn::cached_attention::{BatchPositions, attend_cached, check_cache_sets};
use nn::embedding::Embedding;
use nn::linear::Linear;
use nn::mlp::Mlp;
use nn::model::check_depth;
use nn::registry::{self, Architecture};
use nn::rms_norm::RmsNorm;
use nn::rope::Rope;
use nn::{Batch, Forward, Model, ModelSpec, Result, Weights};
use quant::SafetensorsFile;

/// The bound `parity.rs` holds every family's f32 logits to.
const TOLERANCE: f32 = 1e-4;

/// A size from the config as MLX takes it.
fn dim(value: usize, name: &str) -> Result<i32> {
    i32::try_from(value).map_err(|_| nn::Error::Config(format!("`{name}` is too large")))
}

/// One decoder layer: pre-norm attention and a pre-norm MLP, each added to the residual stream.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

/// The model: `model.embed_tokens`, `model.layers.{i}`, `model.norm`, `lm_head`.
struct HouseLlama {
    spec: ModelSpec,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl HouseLlama {
    fn new(config: Config, weights: &mut Weights) -> Result<HouseLlama> {
        let hidden = dim(config.hidden_size, "hidden_size")?;
        let vocab = dim(config.vocab_size, "vocab_size")?;
        let inter = dim(config.intermediate_size, "intermediate_size")?;
        let eps = config.rms_norm_eps;
        let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(weights.dense(name, &[hidden])?, eps))
        };
        let activation = Activation::from_name(&config.hidden_act)?;
        let embed_name = "model.embed_tokens.weight";
        let embed_tokens =
            Embedding::new(weights.weight(embed_name)?).with_packed(weights.packed(embed_name)?);
        let rope = Rope::new(&config.rope)?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("model.layers.{i}");
            layers.push(DecoderLayer {
                input_layernorm: norm(weights, &format!("{p}.input_layernorm.weight"))?,
                self_attn: attention(&config, weights, &format!("{p}.self_attn"), &rope)?,
                post_attention_layernorm: norm(
                    weights,
                    &format!("{p}.post_attention_layernorm.weight"),
                )?,
                mlp: Mlp::load(weights, &format!("{p}.mlp"), inter, hidden, activation)?,
            });
        }
        let final_norm = norm(weights, "model.norm.weight")?;
        let lm_head = embed_tokens.output_head(
            weights,
            config.tie_word_embeddings,
            "lm_head",
            vocab,
            hidden,
        )?;
        Ok(HouseLlama {
            spec: config.spec(),
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
        })
    }
}

/// `self_attn`: grouped-query attention over rotated queries and keys.
fn attention(c: &Config, weights: &mut Weights, p: &str, rope: &Rope) -> Result<Attention> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let heads = dim(c.num_attention_heads, "num_attention_heads")?;
    let kv_heads = dim(c.num_key_value_heads, "num_key_value_heads")?;
    let head_dim = dim(c.head_dim, "head_dim")?;
    Ok(AttentionParts::new(
        weights.linear(&format!("{p}.q_proj"), heads * head_dim, hidden)?,
        weights.linear(&format!("{p}.k_proj"), kv_heads * head_dim, hidden)?,
        weights.linear(&format!("{p}.v_proj"), kv_heads * head_dim, hidden)?,
        weights.linear(&format!("{p}.o_proj"), hidden, heads * head_dim)?,
        heads,
        kv_heads,
        head_dim,
    )
    .with_rope(rope.clone())
    .build())
}

impl Model for HouseLlama {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    fn forward_rows(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        self.forward_rows_through(batch, caches, self.layers.len())
    }

    fn forward_rows_through(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
        layers: usize,
    ) -> Result<Forward> {
        check_depth(layers, self.layers.len())?;
        check_cache_sets(batch, caches, self.layers.len())?;
        let positions = BatchPositions::new(batch)?;
        let mut h = self.embed_tokens.forward(&batch.tokens)?;
        for (i, layer) in self.layers.iter().enumerate().take(layers) {
            let x = layer.input_layernorm.forward(&h)?;
            let projected = layer.self_attn.project(&x, positions.rope())?;
            let attended = attend_cached(
                &layer.self_attn,
                &projected,
                caches,
                i,
                &batch.positions,
                LogicalMask::Causal,
            )?;
            h = h.add(&attended)?;
            let ff = layer
                .mlp
                .forward(&layer.post_attention_layernorm.forward(&h)?)?;
            h = h.add(&ff)?;
        }
        Ok(Forward {
            hidden: self.norm.forward(&h)?,
            conditioning: None,
        })
    }

    fn unembed(&self, hidden: &Array) -> Result<Array> {
        self.lm_head.forward(hidden)
    }

    fn parameters(&self) -> Vec<Array> {
        let mut out = Vec::new();
        self.embed_tokens.collect_arrays(&mut out);
        for layer in &self.layers {
            layer.input_layernorm.collect_arrays(&mut out);
            layer.self_attn.collect_arrays(&mut out);
            layer.post_attention_layernorm.collect_arrays(&mut out);
            layer.mlp.collect_arrays(&mut out);
        }
        self.norm.collect_arrays(&mut out);
        self.lm_head.collect_arrays(&mut out);
        out
    }
}

/// The family's registration: its name, its spec, its builder.
fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        registry::register(Architecture {
            names: &["house_llama"],
            describe: |config| Ok(Config::from_json(config)?.spec()),
            build: |config, weights| {
                Ok(Box::new(HouseLlama::new(
                    Config::from_json(config)?,
                    weights,
                )?))
            },
        })
        .unwrap();
    });
}

/// The logits of the fixture's prompt from the model loaded from `dir`, and the count of its
/// parameters.
fn logits(dir: &Path, prompt: &[u32]) -> (Vec<f32>, u64) {
    let loaded = nn::load::load(dir, Some(Dtype::F32)).unwrap();
    let model = loaded.model;
    let mut caches = model.new_caches().unwrap();
    let forward = model
        .forward(&Batch::single(prompt, 0).unwrap(), &mut caches)
        .unwrap();
    let logits = model.unembed(&forward.hidden).unwrap();
    (logits.to_vec::<f32>().unwrap(), loaded.parameters)
}

#[test]
fn a_renamed_copy_registered_outside_the_crate_matches_the_original() {
    register();
    let original = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama");
    // The fixture under the new family's name: its config's `model_type` renamed.
    let renamed = tempfile::tempdir().unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(original.join("config.json")).unwrap()).unwrap();
    config["model_type"] = "house_llama".into();
    config["architectures"] = serde_json::json!(["HouseLlamaForCausalLM"]);
    std::fs::write(renamed.path().join("config.json"), config.to_string()).unwrap();
    std::fs::copy(
        original.join("model.safetensors"),
        renamed.path().join("model.safetensors"),
    )
    .unwrap();
    assert_eq!(
        registry::describe(&config).unwrap().model_type,
        "house_llama"
    );

    let golden: serde_json::Value =
        serde_json::from_slice(&std::fs::read(original.join("golden.json")).unwrap()).unwrap();
    let prompt: Vec<u32> = golden["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let expected = SafetensorsFile::open(&original.join("logits.safetensors"))
        .unwrap()
        .load("logits")
        .unwrap()
        .astype(Dtype::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();

    let (copy, copy_parameters) = logits(renamed.path(), &prompt);
    let (llama, llama_parameters) = logits(&original, &prompt);
    assert_eq!(copy.len(), expected.len());
    let worst = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    assert!(
        worst(&copy, &expected) < TOLERANCE,
        "{}",
        worst(&copy, &expected)
    );
    // The same blocks in the same order compute the same numbers as the original.
    assert_eq!(worst(&copy, &llama), 0.0);
    assert_eq!(copy_parameters, llama_parameters);
}

#[test]
fn a_taken_name_is_refused() {
    register();
    for names in [&["llama"] as &'static [&'static str], &["house_llama"]] {
        let err = registry::register(Architecture {
            names,
            describe: |config| Ok(Config::from_json(config)?.spec()),
            build: |config, weights| {
                Ok(Box::new(HouseLlama::new(
                    Config::from_json(config)?,
                    weights,
                )?))
            },
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("already registered"), "{err}");
    }
}
