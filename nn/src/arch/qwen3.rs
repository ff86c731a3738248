//! Qwen3: Qwen2's decoder with per-head RMS norms of queries and keys before rotation
//! (`q_norm`, `k_norm`) and without Qwen2's projection biases (`attention_bias`: the checkpoint
//! decides). Layers that `layer_types` marks `sliding_attention` attend only to the last
//! `sliding_window` positions.
//!
//! References: transformers' `models/qwen3/modeling_qwen3.py` (5.24); Qwen Team, "Qwen3
//! Technical Report" (2025).

use kvcache::{LayerCache, LogicalMask};
use mlx::Array;

use crate::Result;
use crate::activation::Activation;
use crate::attention::{Attention, AttentionParts};
use crate::cached_attention::{BatchPositions, attend_cached, check_cache_sets};
use crate::config::dim;
use crate::embedding::Embedding;
use crate::linear::Linear;
use crate::mlp::Mlp;
use crate::model::{Batch, Forward, InputEmbeddings, Model, ModelSpec, check_depth};
use crate::rms_norm::RmsNorm;
use crate::rope::Rope;
use crate::taps::Taps;
use crate::weights::{Weights, check_matrix};

/// The hyperparameters of a Qwen3 model: `Qwen3Config` has `Qwen2Config`'s keys (its
/// `attention_bias` defaults to no biases, which Qwen2's reader also allows), so it is read
/// by the same reader.
pub use crate::arch::qwen2::Config;

/// One decoder layer: pre-norm attention and a pre-norm MLP, each added to the residual
/// stream.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
    sliding_window: Option<usize>,
}

/// A Qwen3 model.
pub struct Qwen3 {
    spec: ModelSpec,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    /// The layers whose outputs a forward offers a block drafter ([`Model::tap_layers`]).
    taps: Taps,
}

impl Qwen3 {
    /// Builds the model from transformers-named weights.
    pub fn new(config: Config, weights: &mut Weights) -> Result<Qwen3> {
        let hidden = dim(config.hidden_size, "hidden_size")?;
        let vocab = dim(config.vocab_size, "vocab_size")?;
        let inter = dim(config.intermediate_size, "intermediate_size")?;
        let eps = config.rms_norm_eps;
        let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(weights.dense(name, &[hidden])?, eps))
        };
        let activation = Activation::from_name(&config.hidden_act)?;
        let embed_name = "model.embed_tokens.weight";
        let embed_weight = weights.table(embed_name)?;
        check_matrix(embed_name, &embed_weight, vocab, hidden)?;
        let embed_tokens = Embedding::new(embed_weight).with_packed(weights.packed(embed_name)?);
        let rope = Rope::new(&config.rope)?;

        let mut layers = Vec::with_capacity(config.layer_windows.len());
        for (i, &sliding_window) in config.layer_windows.iter().enumerate() {
            let p = format!("model.layers.{i}");
            layers.push(DecoderLayer {
                input_layernorm: norm(weights, &format!("{p}.input_layernorm.weight"))?,
                self_attn: attention(&config, weights, &format!("{p}.self_attn"), &rope)?,
                post_attention_layernorm: norm(
                    weights,
                    &format!("{p}.post_attention_layernorm.weight"),
                )?,
                mlp: Mlp::load(weights, &format!("{p}.mlp"), inter, hidden, activation)?,
                sliding_window,
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
        Ok(Qwen3 {
            spec: config.spec(),
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
            taps: Taps::default(),
        })
    }

    /// The first `layers` layers and the final norm over `h`, the batch's input embeddings.
    fn run_layers(
        &self,
        mut h: Array,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
        layers: usize,
    ) -> Result<Forward> {
        check_depth(layers, self.layers.len())?;
        check_cache_sets(batch, caches, self.layers.len())?;
        let positions = BatchPositions::new(batch)?;
        let mut tapped = self.taps.record();
        for (i, layer) in self.layers.iter().enumerate().take(layers) {
            let x = layer.input_layernorm.forward(&h)?;
            let projected = layer.self_attn.project(&x, positions.rope())?;
            let logical = match layer.sliding_window {
                Some(window) => LogicalMask::SlidingWindow(window),
                None => LogicalMask::Causal,
            };
            let attended = attend_cached(
                &layer.self_attn,
                &projected,
                caches,
                i,
                &batch.positions,
                logical,
            )?;
            h = h.add(&attended)?;
            let ff = layer
                .mlp
                .forward(&layer.post_attention_layernorm.forward(&h)?)?;
            h = h.add(&ff)?;
            tapped.layer(i, &h);
        }
        Ok(Forward {
            hidden: self.norm.forward(&h)?,
            conditioning: tapped.conditioning()?,
        })
    }
}

impl InputEmbeddings for Qwen3 {
    fn embed(&self, tokens: &Array) -> Result<Array> {
        self.embed_tokens.forward(tokens)
    }

    fn forward_rows_embedded(
        &self,
        embedded: &Array,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        self.run_layers(embedded.clone(), batch, caches, self.layers.len())
    }
}

/// The attention block (`self_attn`): grouped-query attention over queries and keys normed per
/// head, then rotated.
fn attention(c: &Config, weights: &mut Weights, p: &str, rope: &Rope) -> Result<Attention> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let heads = dim(c.num_attention_heads, "num_attention_heads")?;
    let kv_heads = dim(c.num_key_value_heads, "num_key_value_heads")?;
    let head_dim = dim(c.head_dim, "head_dim")?;
    let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
        let weight = weights.dense(&format!("{p}.{name}.weight"), &[head_dim])?;
        Ok(RmsNorm::new(weight, c.rms_norm_eps))
    };
    Ok(
        AttentionParts::load(weights, p, hidden, (heads, kv_heads, head_dim))?
            .with_rope(rope.clone())
            .with_qk_norms(norm(weights, "q_norm")?, norm(weights, "k_norm")?)
            .build(),
    )
}

impl Model for Qwen3 {
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
        let embedded = self.embed_tokens.forward(&batch.tokens)?;
        self.run_layers(embedded, batch, caches, layers)
    }

    fn unembed(&self, hidden: &Array) -> Result<Array> {
        self.lm_head.forward(hidden)
    }

    fn input_embeddings(&self) -> Option<&dyn InputEmbeddings> {
        Some(self)
    }

    fn tap_layers(&mut self, layers: &[usize]) -> Result<()> {
        self.taps.set(layers, self.layers.len())
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
