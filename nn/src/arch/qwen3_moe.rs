//! Qwen3-MoE: Qwen3's attention (per-head RMS norms of queries and keys before rotation) with
//! a mixture of SwiGLU experts in place of the MLP. A softmax router picks
//! `num_experts_per_tok` of the `num_experts` experts for each token, their weights
//! renormalized to sum to one when `norm_topk_prob` is set. The layers `mlp_only_layers` lists,
//! and all but every `decoder_sparse_step`-th, keep a dense MLP. Layers that `layer_types`
//! marks `sliding_attention` attend only to the last `sliding_window` positions.
//!
//! References: transformers' `models/qwen3_moe/modeling_qwen3_moe.py` (5.24); Qwen Team,
//! "Qwen3 Technical Report" (2025).

use kvcache::{LayerCache, LogicalMask};
use mlx::Array;
use serde_json::Value;

use crate::activation::Activation;
use crate::attention::{Attention, AttentionParts};
use crate::cached_attention::{BatchPositions, attend_cached, check_cache_sets};
use crate::config::{Fields, dim, limits, missing, model_type, read_rope, tie_word_embeddings};
use crate::embedding::Embedding;
use crate::linear::Linear;
use crate::mlp::Mlp;
use crate::model::{Batch, Forward, LayerState, Model, ModelSpec, check_depth};
use crate::moe::{Moe, RouterScoring, StackedExperts};
use crate::pipeline_parallel::{PipelineStage, run_decoder};
use crate::rms_norm::RmsNorm;
use crate::rope::{Rope, RopeConfig};
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The hyperparameters of a Qwen3-MoE model.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `model_type`.
    pub model_type: String,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size`: the width of the dense MLPs.
    pub intermediate_size: usize,
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f32,
    /// `max_position_embeddings` (4,096 when absent).
    pub max_position_embeddings: usize,
    /// `tie_word_embeddings`; `None` when silent (no `lm_head` then means tied).
    pub tie_word_embeddings: Option<bool>,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `num_key_value_heads`.
    pub num_key_value_heads: usize,
    /// `head_dim` (default `hidden_size / num_attention_heads`).
    pub head_dim: usize,
    /// The rotary embedding: `rope_parameters`, or `rope_theta` and `rope_scaling`.
    pub rope: RopeConfig,
    /// `hidden_act`.
    pub hidden_act: String,
    /// `layer_types` and `sliding_window`: each layer's window, `None` where it attends to
    /// everything before it.
    pub layer_windows: Vec<Option<usize>>,
    /// `num_experts` (transformers 5: `num_local_experts`).
    pub num_experts: usize,
    /// `num_experts_per_tok`.
    pub num_experts_per_tok: usize,
    /// `moe_intermediate_size`: each expert's width.
    pub moe_intermediate_size: usize,
    /// `norm_topk_prob`.
    pub norm_topk_prob: bool,
    /// `decoder_sparse_step` and `mlp_only_layers`: whether each layer routes to experts.
    pub sparse_layers: Vec<bool>,
}

impl Config {
    /// Reads the config.
    pub fn from_json(config: &Value) -> Result<Config> {
        let f = Fields::text_section(config);
        let model_type = model_type(config)?;
        let hidden_size = f.required_bounded("hidden_size", limits::HIDDEN)?;
        let num_hidden_layers = f.required_bounded("num_hidden_layers", limits::LAYERS)?;
        let (heads, kv_heads) = f.attention_heads()?;
        let head_dim = match f.bounded("head_dim", limits::HIDDEN)? {
            Some(d) => d,
            None if hidden_size % heads == 0 => hidden_size / heads,
            None => return Err(missing("head_dim")),
        };
        let sliding = f
            .layer_types(num_hidden_layers)?
            .unwrap_or_else(|| vec![false; num_hidden_layers]);
        let layer_windows = f.layer_windows(&sliding)?;
        let num_experts = match f.bounded("num_experts", limits::EXPERTS)? {
            Some(n) => Some(n),
            None => f.bounded("num_local_experts", limits::EXPERTS)?,
        }
        .filter(|&n| n > 0)
        .ok_or_else(|| missing("num_experts"))?;
        let num_experts_per_tok = f.required_usize("num_experts_per_tok")?;
        if num_experts_per_tok == 0 || num_experts_per_tok > num_experts {
            return Err(Error::Config(format!(
                "`num_experts_per_tok` = {num_experts_per_tok} must be between 1 and the \
                 {num_experts} experts"
            )));
        }
        let moe_intermediate_size =
            f.required_bounded("moe_intermediate_size", limits::INTERMEDIATE)?;
        let norm_topk_prob = f.bool("norm_topk_prob")?.unwrap_or(false);
        let sparse_layers = read_sparse_layers(&f, num_hidden_layers)?;
        Ok(Config {
            model_type,
            hidden_size,
            vocab_size: f.required_bounded("vocab_size", limits::VOCAB)?,
            intermediate_size: f.required_bounded("intermediate_size", limits::INTERMEDIATE)?,
            rms_norm_eps: f
                .f64("rms_norm_eps")?
                .ok_or_else(|| missing("rms_norm_eps"))? as f32,
            max_position_embeddings: f
                .bounded("max_position_embeddings", limits::POSITIONS)?
                .unwrap_or(4096),
            tie_word_embeddings: tie_word_embeddings(config)?,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rope: read_rope(&f, dim(head_dim, "head_dim")?)?.0,
            hidden_act: f.str("hidden_act").unwrap_or("silu").to_string(),
            layer_windows,
            num_experts,
            num_experts_per_tok,
            moe_intermediate_size,
            norm_topk_prob,
            sparse_layers,
        })
    }

    /// What the engine needs to know of the model.
    pub fn spec(&self) -> ModelSpec {
        ModelSpec {
            model_type: self.model_type.clone(),
            vocab_size: self.vocab_size,
            context_length: self.max_position_embeddings,
            layers: self
                .layer_windows
                .iter()
                .map(|&window| LayerState::Attention {
                    kv_heads: self.num_key_value_heads,
                    head_dim: self.head_dim,
                    window,
                })
                .collect(),
        }
    }
}

/// `decoder_sparse_step` and `mlp_only_layers`: whether each layer routes to experts (every
/// `step`-th layer that is not listed) or keeps a dense MLP.
fn read_sparse_layers(f: &Fields<'_>, layers: usize) -> Result<Vec<bool>> {
    let mlp_only_layers: Vec<usize> = match f.get("mlp_only_layers") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .ok_or_else(|| Error::Config("`mlp_only_layers` must be a list".into()))?
            .iter()
            .map(|x| {
                x.as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| Error::Config("`mlp_only_layers` must hold integers".into()))
            })
            .collect::<Result<_>>()?,
    };
    let step = f.usize("decoder_sparse_step")?.unwrap_or(1).max(1);
    Ok((0..layers)
        .map(|i| !mlp_only_layers.contains(&i) && (i + 1).is_multiple_of(step))
        .collect())
}

/// A layer's `mlp`.
enum FeedForward {
    /// A dense MLP (`gate_proj`, `up_proj`, `down_proj`).
    Dense(Mlp),
    /// Router `gate` and `experts.{gate_proj, up_proj, down_proj}`, stacked or one per expert.
    Sparse(Moe),
}

/// One decoder layer: pre-norm attention and a pre-norm feed-forward block, each added to the
/// residual stream.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: FeedForward,
    sliding_window: Option<usize>,
}

impl DecoderLayer {
    /// Layer `index` of the model over `h`, its caches in `caches`.
    fn forward(
        &self,
        h: &Array,
        caches: &mut [&mut [Option<LayerCache>]],
        index: usize,
        batch: &Batch,
        positions: &BatchPositions,
    ) -> Result<Array> {
        let x = self.input_layernorm.forward(h)?;
        let projected = self.self_attn.project(&x, positions.rope())?;
        let logical = match self.sliding_window {
            Some(window) => LogicalMask::SlidingWindow(window),
            None => LogicalMask::Causal,
        };
        let attended = attend_cached(
            &self.self_attn,
            &projected,
            caches,
            index,
            &batch.positions,
            logical,
        )?;
        let h = h.add(&attended)?;
        let x = self.post_attention_layernorm.forward(&h)?;
        let ff = match &self.mlp {
            FeedForward::Dense(mlp) => mlp.forward(&x)?,
            FeedForward::Sparse(moe) => moe.forward(&x)?,
        };
        Ok(h.add(&ff)?)
    }
}

/// A Qwen3-MoE model.
pub struct Qwen3Moe {
    spec: ModelSpec,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    /// This rank's range of the layers when they are split across a pipeline: `layers` holds
    /// only those, from the range's start on.
    stage: Option<PipelineStage>,
}

impl Qwen3Moe {
    /// Builds the model from transformers-named weights.
    pub fn new(config: Config, weights: &mut Weights) -> Result<Qwen3Moe> {
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

        let stage = weights.pipeline_stage().cloned();
        let mut layers = Vec::with_capacity(config.layer_windows.len());
        for (i, &sliding_window) in config.layer_windows.iter().enumerate() {
            let p = format!("model.layers.{i}");
            if weights.is_another_stages(i, &format!("{p}.")) {
                continue;
            }
            let mlp = if config.sparse_layers[i] {
                FeedForward::Sparse(experts(&config, weights, &format!("{p}.mlp"), activation)?)
            } else {
                FeedForward::Dense(Mlp::load(
                    weights,
                    &format!("{p}.mlp"),
                    inter,
                    hidden,
                    activation,
                )?)
            };
            layers.push(DecoderLayer {
                input_layernorm: norm(weights, &format!("{p}.input_layernorm.weight"))?,
                self_attn: attention(&config, weights, &format!("{p}.self_attn"), &rope)?,
                post_attention_layernorm: norm(
                    weights,
                    &format!("{p}.post_attention_layernorm.weight"),
                )?,
                mlp,
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
        let mut spec = config.spec();
        if let Some(stage) = &stage {
            stage.keep_own_caches(&mut spec);
        }
        Ok(Qwen3Moe {
            spec,
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
            stage,
        })
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
    .with_qk_norms(norm(weights, "q_norm")?, norm(weights, "k_norm")?)
    .build())
}

/// The experts block (`mlp`): a softmax router over the experts, the best
/// `num_experts_per_tok` of them run on each token.
fn experts(c: &Config, weights: &mut Weights, p: &str, activation: Activation) -> Result<Moe> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let experts = dim(c.num_experts, "num_experts")?;
    let inter = dim(c.moe_intermediate_size, "moe_intermediate_size")?;
    let router = weights.linear(&format!("{p}.gate"), experts, hidden)?;
    let experts_at = format!("{p}.experts");
    let stacked = |weights: &mut Weights, which: &str, out: i32, inp: i32| {
        StackedExperts::load(weights, &experts_at, which, c.num_experts, out, inp)
    };
    Moe::new(
        router,
        stacked(weights, "gate_proj", inter, hidden)?,
        stacked(weights, "up_proj", inter, hidden)?,
        stacked(weights, "down_proj", hidden, inter)?,
        c.num_experts_per_tok,
        c.norm_topk_prob,
        RouterScoring::Softmax,
        activation,
    )
}

impl Model for Qwen3Moe {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    fn forward_rows(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        self.forward_rows_through(batch, caches, self.spec.layers.len())
    }

    fn forward_rows_through(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
        layers: usize,
    ) -> Result<Forward> {
        check_depth(layers, self.spec.layers.len())?;
        check_cache_sets(batch, caches, self.spec.layers.len())?;
        let positions = BatchPositions::new(batch)?;
        let h = self.embed_tokens.forward(&batch.tokens)?;
        let hidden = run_decoder(
            self.stage.as_ref(),
            h,
            &self.layers,
            layers,
            self.spec.layers.len(),
            |layer, h, i| layer.forward(&h, caches, i, batch, &positions),
            |h| self.norm.forward(h),
        )?;
        Ok(Forward {
            hidden,
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
            match &layer.mlp {
                FeedForward::Dense(mlp) => mlp.collect_arrays(&mut out),
                FeedForward::Sparse(moe) => moe.collect_arrays(&mut out),
            }
        }
        self.norm.collect_arrays(&mut out);
        self.lm_head.collect_arrays(&mut out);
        out
    }
}
