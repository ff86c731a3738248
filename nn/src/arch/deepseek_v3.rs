//! DeepSeek-V3 and GLM-4-MoE-Lite: multi-head latent attention and a sparse mixture of
//! experts with sigmoid routing over groups of experts.
//!
//! **Multi-head latent attention** (DeepSeek-AI, "DeepSeek-V2", 2024) compresses keys and
//! values into one latent vector per token (`kv_lora_rank` wide, normed) plus one small shared
//! rotary key (`qk_rope_head_dim`). Each head's key is `W_UK · latent` beside the shared rotary
//! key, its value `W_UV · latent` (`kv_b_proj` stacks both). Here the up-projections are
//! *absorbed*: a head's query is mapped into the latent space once (`q_nope · W_UK`), all heads
//! attend to the one cached latent (with the rotary parts side by side), and the attended latent
//! is mapped out through `W_UV`. The cache then holds `kv_lora_rank + qk_rope_head_dim` numbers
//! per token instead of `heads · (qk_head_dim + v_head_dim)`, and the result equals the expanded
//! form up to rounding. (The cached values are the latent padded with zeros to the keys' width,
//! so every attention kernel applies; the zero tail is cut from the output.)
//!
//! The **router** scores experts with sigmoids; a per-expert bias steers only which experts are
//! chosen, among the best `topk_group` of `n_group` groups; the chosen unbiased scores are
//! renormalized and scaled by `routed_scaling_factor`. Shared experts run for every token. The
//! first `first_k_dense_replace` layers (GLM: `mlp_layer_types`) keep a dense MLP.
//!
//! References: transformers' `models/deepseek_v3/modeling_deepseek_v3.py` and
//! `models/glm4_moe_lite` (5.24); DeepSeek-AI, "DeepSeek-V3 Technical Report" (2024).
//!
//! The released checkpoints append a **multi-token-prediction layer** after the decoder's
//! (`num_nextn_predict_layers`, the layer `model.layers.{num_hidden_layers}`). The first is
//! read as the model's draft head ([`MtpHead`] with [`HeadNames::next_n`]): a decoder layer of
//! this kind, dense or sparse as its tensors say; any further ones are set aside.

use kvcache::{LayerCache, LogicalMask};
use mlx::Array;
use serde_json::Value;

use crate::activation::Activation;
use crate::cached_attention::{BatchPositions, attend_cached_heads, check_cache_sets};
use crate::config::{Fields, dim, limits, missing, read_rope};
use crate::embedding::Embedding;
use crate::linear::{Linear, Tensor};
use crate::mlp::Mlp;
use crate::model::{Batch, DraftHead, Forward, LayerState, Model, ModelSpec, check_depth};
use crate::moe::{Moe, RouterOptions, RouterScoring, SharedExpert, StackedExperts};
use crate::mtp_head::{HeadLayer, HeadNames, MtpHead};
use crate::rms_norm::RmsNorm;
use crate::rope::{Rope, RopeConfig, RopeScaling};
use crate::sdpa::ScaledDotProduct;
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The epsilon of the norms inside attention (`q_a_layernorm`, `kv_a_layernorm`): the
/// reference builds them with its default, whatever `rms_norm_eps` says (GLM-4-MoE-Lite's is
/// 1e-5; with it there, every logit moves by ~5e-5).
const LATENT_NORM_EPS: f32 = 1e-6;

/// The hyperparameters of a DeepSeek-V3 or GLM-4-MoE-Lite model.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `model_type`.
    pub model_type: String,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size`: the dense layers' MLP width.
    pub intermediate_size: usize,
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f32,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `tie_word_embeddings`; `None` when silent (no `lm_head` then means tied).
    pub tie_word_embeddings: Option<bool>,
    /// `hidden_act`.
    pub hidden_act: String,
    /// Which layers are sparse: from `first_k_dense_replace` or `mlp_layer_types`.
    pub sparse_layers: Vec<bool>,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `q_lora_rank`: queries through a low-rank bottleneck, when set.
    pub q_lora_rank: Option<usize>,
    /// `kv_lora_rank`: the latent's width.
    pub kv_lora_rank: usize,
    /// `qk_nope_head_dim`.
    pub qk_nope_head_dim: usize,
    /// `qk_rope_head_dim`.
    pub qk_rope_head_dim: usize,
    /// `v_head_dim`.
    pub v_head_dim: usize,
    /// The rotary embedding over `qk_rope_head_dim` features (pairwise when
    /// `rope_interleave`).
    pub rope: RopeConfig,
    /// `attention_bias`: biases on the `_a` projections and `o_proj`.
    pub attention_bias: bool,
    /// `n_routed_experts`.
    pub n_routed_experts: usize,
    /// `num_experts_per_tok`.
    pub num_experts_per_tok: usize,
    /// `moe_intermediate_size`.
    pub moe_intermediate_size: usize,
    /// `n_shared_experts`.
    pub n_shared_experts: usize,
    /// `n_group` and `topk_group`.
    pub groups: (usize, usize),
    /// `norm_topk_prob`.
    pub norm_topk_prob: bool,
    /// `routed_scaling_factor`.
    pub routed_scaling_factor: f32,
}

impl Config {
    /// Reads the config.
    pub fn from_json(config: &Value) -> Result<Config> {
        let f = Fields::text_section(config);
        let model_type = f
            .str("model_type")
            .ok_or_else(|| missing("model_type"))?
            .to_string();
        let layers = f.required_bounded("num_hidden_layers", limits::LAYERS)?;
        let heads = f.required_bounded("num_attention_heads", limits::HEADS)?;
        if heads == 0 {
            return Err(Error::Config(
                "`num_attention_heads` must be positive".into(),
            ));
        }
        let rope_dim = f.required_bounded("qk_rope_head_dim", limits::HIDDEN)?;
        let mut rope = read_rope(&f, dim(rope_dim, "qk_rope_head_dim")?)?.0;
        rope.traditional = f.bool("rope_interleave")?.unwrap_or(true);
        let sparse_layers = match f.get("mlp_layer_types") {
            Some(types) => {
                let list = types
                    .as_array()
                    .ok_or_else(|| Error::Config("`mlp_layer_types` must be a list".into()))?;
                if list.len() != layers {
                    return Err(Error::Config(format!(
                        "`mlp_layer_types` lists {} layers, the model has {layers}",
                        list.len()
                    )));
                }
                list.iter()
                    .map(|t| match t.as_str() {
                        Some("sparse") => Ok(true),
                        Some("dense") => Ok(false),
                        _ => Err(Error::Config(format!("unsupported MLP layer type {t}"))),
                    })
                    .collect::<Result<_>>()?
            }
            None => {
                // GLM's reference default: the first layer dense; DeepSeek's: the first three.
                let default = if model_type.starts_with("glm") { 1 } else { 3 };
                let dense = f.usize("first_k_dense_replace")?.unwrap_or(default);
                (0..layers).map(|i| i >= dense).collect()
            }
        };
        let experts = match f.bounded("n_routed_experts", limits::EXPERTS)? {
            Some(n) => n,
            None => f
                .bounded("num_local_experts", limits::EXPERTS)?
                .ok_or_else(|| missing("n_routed_experts"))?,
        };
        // DeepSeek-V3's own config states its routing as `scoring_func`; a GGUF file can say
        // softmax, which is DeepSeek-V2's routing, not this one.
        if let Some(scoring) = f.get("scoring_func")
            && scoring.as_str() != Some("sigmoid")
        {
            return Err(Error::Config(format!(
                "`scoring_func` {scoring} is not supported: this model scores experts by sigmoid"
            )));
        }
        let top_k = f.required_usize("num_experts_per_tok")?;
        if experts == 0 || top_k == 0 || top_k > experts {
            return Err(Error::Config(format!(
                "`num_experts_per_tok` = {top_k} must be between 1 and the {experts} experts"
            )));
        }
        Ok(Config {
            model_type,
            hidden_size: f.required_bounded("hidden_size", limits::HIDDEN)?,
            intermediate_size: f.required_bounded("intermediate_size", limits::INTERMEDIATE)?,
            vocab_size: f.required_bounded("vocab_size", limits::VOCAB)?,
            rms_norm_eps: f
                .f64("rms_norm_eps")?
                .ok_or_else(|| missing("rms_norm_eps"))? as f32,
            max_position_embeddings: f
                .bounded("max_position_embeddings", limits::POSITIONS)?
                .ok_or_else(|| missing("max_position_embeddings"))?,
            tie_word_embeddings: f.bool("tie_word_embeddings")?,
            hidden_act: f.str("hidden_act").unwrap_or("silu").to_string(),
            sparse_layers,
            num_attention_heads: heads,
            q_lora_rank: f.bounded("q_lora_rank", limits::HIDDEN)?,
            kv_lora_rank: f.required_bounded("kv_lora_rank", limits::HIDDEN)?,
            qk_nope_head_dim: f.required_bounded("qk_nope_head_dim", limits::HIDDEN)?,
            qk_rope_head_dim: rope_dim,
            v_head_dim: f.required_bounded("v_head_dim", limits::HIDDEN)?,
            rope,
            attention_bias: f.bool("attention_bias")?.unwrap_or(false),
            n_routed_experts: experts,
            num_experts_per_tok: top_k,
            moe_intermediate_size: f
                .required_bounded("moe_intermediate_size", limits::INTERMEDIATE)?,
            n_shared_experts: f.bounded("n_shared_experts", 64)?.unwrap_or(0),
            groups: (
                f.bounded("n_group", limits::EXPERTS)?.unwrap_or(1),
                f.bounded("topk_group", limits::EXPERTS)?.unwrap_or(1),
            ),
            norm_topk_prob: f.bool("norm_topk_prob")?.unwrap_or(true),
            routed_scaling_factor: f.f64("routed_scaling_factor")?.unwrap_or(1.0) as f32,
        })
    }

    /// Width of a cached token: the latent beside the shared rotary key.
    fn latent_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// The attention scale: `qk_head_dim^-½`, times YaRN's `mscale²` when the rotary embedding
    /// is stretched with `mscale_all_dim` (the reference's temperature correction).
    fn attention_scale(&self) -> f32 {
        let base = ((self.qk_nope_head_dim + self.qk_rope_head_dim) as f64).powf(-0.5);
        let mscale = match self.rope.scaling {
            RopeScaling::Yarn {
                factor,
                mscale_all_dim,
                ..
            } if mscale_all_dim != 0.0 && factor > 1.0 => 0.1 * mscale_all_dim * factor.ln() + 1.0,
            _ => 1.0,
        };
        (base * mscale * mscale) as f32
    }

    /// What the engine needs to know of the model.
    pub fn spec(&self) -> ModelSpec {
        ModelSpec {
            model_type: self.model_type.clone(),
            vocab_size: self.vocab_size,
            context_length: self.max_position_embeddings,
            layers: vec![self.latent_state(); self.sparse_layers.len()],
        }
    }

    /// A layer's cache: keys and values each hold the latent width (values padded with
    /// zeros).
    fn latent_state(&self) -> LayerState {
        LayerState::Attention {
            kv_heads: 1,
            head_dim: self.latent_width(),
            window: None,
        }
    }
}

/// How queries are projected.
enum QueryProjection {
    /// `q_proj`.
    Direct(Linear),
    /// `q_a_proj` → `q_a_layernorm` → `q_b_proj`.
    LowRank {
        q_a_proj: Linear,
        q_a_layernorm: RmsNorm,
        q_b_proj: Linear,
    },
}

/// Multi-head latent attention (`self_attn`), with `kv_b_proj` split and absorbed at load.
struct LatentAttention {
    queries: QueryProjection,
    kv_a_proj_with_mqa: Linear,
    kv_a_layernorm: RmsNorm,
    /// `W_UK` per head, transposed for the query side: `[heads, qk_nope_head_dim, kv_lora_rank]`.
    absorb_keys: Array,
    /// `W_UV` per head, transposed for the output side: `[heads, kv_lora_rank, v_head_dim]`.
    absorb_values: Array,
    o_proj: Linear,
    rope: Rope,
    kernel: ScaledDotProduct,
    heads: i32,
    nope: i32,
    rope_dim: i32,
    rank: i32,
    value_dim: i32,
}

impl LatentAttention {
    fn new(c: &Config, weights: &mut Weights, p: &str, rope: &Rope) -> Result<LatentAttention> {
        let hidden = dim(c.hidden_size, "hidden_size")?;
        let heads = dim(c.num_attention_heads, "num_attention_heads")?;
        let nope = dim(c.qk_nope_head_dim, "qk_nope_head_dim")?;
        let rope_dim = dim(c.qk_rope_head_dim, "qk_rope_head_dim")?;
        let rank = dim(c.kv_lora_rank, "kv_lora_rank")?;
        let value_dim = dim(c.v_head_dim, "v_head_dim")?;
        let biased = |weights: &mut Weights, name: &str, out: i32, inp: i32| {
            weights.projection(&format!("{p}.{name}"), out, inp, c.attention_bias)
        };
        let queries = match c.q_lora_rank {
            Some(q_rank) => {
                let q_rank = dim(q_rank, "q_lora_rank")?;
                QueryProjection::LowRank {
                    q_a_proj: biased(weights, "q_a_proj", q_rank, hidden)?,
                    q_a_layernorm: RmsNorm::new(
                        weights.dense(&format!("{p}.q_a_layernorm.weight"), &[q_rank])?,
                        LATENT_NORM_EPS,
                    ),
                    q_b_proj: weights.matrix(
                        &format!("{p}.q_b_proj"),
                        heads * (nope + rope_dim),
                        q_rank,
                    )?,
                }
            }
            None => QueryProjection::Direct(weights.matrix(
                &format!("{p}.q_proj"),
                heads * (nope + rope_dim),
                hidden,
            )?),
        };
        // The up-projections absorbed into queries (`[heads, nope, rank]`) and into the
        // attended latents (`[heads, rank, value]`): from transformers' one `kv_b_proj`
        // (`[heads · (nope + value), rank]`), or from the two halves a GGUF file keeps apart
        // (llama.cpp's converter splits it, keys transposed).
        let (absorb_keys, absorb_values) = if weights.contains(&format!("{p}.kv_b_proj.weight")) {
            let kv_b = weights
                .dense(
                    &format!("{p}.kv_b_proj.weight"),
                    &[heads * (nope + value_dim), rank],
                )?
                .reshape(&[heads, nope + value_dim, rank])?;
            (
                kv_b.slice_axis(1, 0, nope)?,
                kv_b.slice_axis(1, nope, nope + value_dim)?,
            )
        } else {
            (
                weights
                    .dense(&format!("{p}.k_b_proj.weight"), &[heads, rank, nope])?
                    .swap_axes(1, 2)?,
                weights.dense(&format!("{p}.v_b_proj.weight"), &[heads, value_dim, rank])?,
            )
        };
        Ok(LatentAttention {
            queries,
            kv_a_proj_with_mqa: biased(weights, "kv_a_proj_with_mqa", rank + rope_dim, hidden)?,
            kv_a_layernorm: RmsNorm::new(
                weights.dense(&format!("{p}.kv_a_layernorm.weight"), &[rank])?,
                LATENT_NORM_EPS,
            ),
            absorb_keys,
            absorb_values: absorb_values.swap_axes(1, 2)?,
            o_proj: biased(weights, "o_proj", hidden, heads * value_dim)?,
            rope: rope.clone(),
            kernel: ScaledDotProduct {
                scale: c.attention_scale(),
                logit_softcap: None,
                sinks: None,
            },
            heads,
            nope,
            rope_dim,
            rank,
            value_dim,
        })
    }

    fn collect_arrays(&self, out: &mut Vec<Array>) {
        match &self.queries {
            QueryProjection::Direct(q) => q.collect_arrays(out),
            QueryProjection::LowRank {
                q_a_proj,
                q_a_layernorm,
                q_b_proj,
            } => {
                q_a_proj.collect_arrays(out);
                q_a_layernorm.collect_arrays(out);
                q_b_proj.collect_arrays(out);
            }
        }
        self.kv_a_proj_with_mqa.collect_arrays(out);
        self.kv_a_layernorm.collect_arrays(out);
        out.extend([self.absorb_keys.clone(), self.absorb_values.clone()]);
        self.o_proj.collect_arrays(out);
    }

    fn forward(
        &self,
        x: &Array,
        caches: &mut [&mut [Option<LayerCache>]],
        layer: usize,
        batch: &Batch,
        positions: &BatchPositions,
    ) -> Result<Array> {
        let shape = x.shape();
        let (b, l) = (shape[0], shape[1]);
        let q = match &self.queries {
            QueryProjection::Direct(q_proj) => q_proj.forward(x)?,
            QueryProjection::LowRank {
                q_a_proj,
                q_a_layernorm,
                q_b_proj,
            } => q_b_proj.forward(&q_a_layernorm.forward(&q_a_proj.forward(x)?)?)?,
        }
        .reshape(&[b, l, self.heads, self.nope + self.rope_dim])?
        .transpose(&[0, 2, 1, 3])?;
        let q_nope = q.slice_axis(-1, 0, self.nope)?;
        let q_rope = self.rope.forward(
            &q.slice_axis(-1, self.nope, self.nope + self.rope_dim)?,
            positions.rope(),
        )?;
        // Each head's query in the latent space: [b, heads, l, rank].
        let q_latent = q_nope.matmul(&self.absorb_keys.expand_dims(&[0])?)?;
        let queries = mlx::concatenate(&[q_latent, q_rope], -1)?;

        let compressed = self.kv_a_proj_with_mqa.forward(x)?;
        let latent = self
            .kv_a_layernorm
            .forward(&compressed.slice_axis(-1, 0, self.rank)?)?
            .expand_dims(&[1])?;
        let k_rope = self.rope.forward(
            &compressed
                .slice_axis(-1, self.rank, self.rank + self.rope_dim)?
                .expand_dims(&[1])?,
            positions.rope(),
        )?;
        let keys = mlx::concatenate(&[latent.clone(), k_rope], -1)?;
        let padding = Array::zeros(&[b, 1, l, self.rope_dim], latent.dtype())?;
        let values = mlx::concatenate(&[latent, padding], -1)?;

        let attended = attend_cached_heads(
            &self.kernel,
            &queries,
            (&keys, &values),
            caches,
            layer,
            &batch.positions,
            LogicalMask::Causal,
        )?
        .slice_axis(-1, 0, self.rank)?;
        // Out of the latent space per head: [b, heads, l, v_head_dim].
        let heads = attended.matmul(&self.absorb_values.expand_dims(&[0])?)?;
        let merged =
            heads
                .transpose(&[0, 2, 1, 3])?
                .reshape(&[b, l, self.heads * self.value_dim])?;
        self.o_proj.forward(&merged)
    }
}

/// A layer's feed-forward block (`mlp`).
enum FeedForward {
    Dense(Mlp),
    Sparse(Moe),
}

/// One decoder layer: pre-norm attention and pre-norm feed-forward.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: LatentAttention,
    post_attention_layernorm: RmsNorm,
    mlp: FeedForward,
}

/// A DeepSeek-V3 or GLM-4-MoE-Lite model.
pub struct DeepseekV3 {
    spec: ModelSpec,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    mtp: Option<MtpHead<DecoderLayer>>,
}

impl DeepseekV3 {
    /// Builds the model from transformers-named weights.
    pub fn new(config: Config, weights: &mut Weights) -> Result<DeepseekV3> {
        let hidden = dim(config.hidden_size, "hidden_size")?;
        let vocab = dim(config.vocab_size, "vocab_size")?;
        let eps = config.rms_norm_eps;
        let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(weights.dense(name, &[hidden])?, eps))
        };
        let embed_name = "model.embed_tokens.weight";
        let embed_weight = weights.table(embed_name)?;
        check_matrix(embed_name, &embed_weight, vocab, hidden)?;
        let embed_tokens = Embedding::new(embed_weight).with_packed(weights.packed(embed_name)?);
        let activation = Activation::from_name(&config.hidden_act)?;
        let rope = Rope::new(&config.rope)?;

        let layer = |weights: &mut Weights, p: &str, sparse: bool| -> Result<DecoderLayer> {
            let mlp = if sparse {
                FeedForward::Sparse(sparse_block(
                    &config,
                    weights,
                    &format!("{p}.mlp"),
                    activation,
                )?)
            } else {
                let inter = dim(config.intermediate_size, "intermediate_size")?;
                FeedForward::Dense(Mlp::load(
                    weights,
                    &format!("{p}.mlp"),
                    inter,
                    hidden,
                    activation,
                )?)
            };
            Ok(DecoderLayer {
                input_layernorm: norm(weights, &format!("{p}.input_layernorm.weight"))?,
                self_attn: LatentAttention::new(
                    &config,
                    weights,
                    &format!("{p}.self_attn"),
                    &rope,
                )?,
                post_attention_layernorm: norm(
                    weights,
                    &format!("{p}.post_attention_layernorm.weight"),
                )?,
                mlp,
            })
        };
        let mut layers = Vec::with_capacity(config.sparse_layers.len());
        for (i, &sparse) in config.sparse_layers.iter().enumerate() {
            layers.push(layer(weights, &format!("model.layers.{i}"), sparse)?);
        }

        let decoder_layers = config.sparse_layers.len();
        let names = HeadNames::next_n(decoder_layers);
        let mtp = if names.present(weights) {
            // The head's layer is sparse where its checkpoint has a router: DeepSeek-V3's and
            // GLM's heads follow the dense prefix, so they are.
            let sparse = weights.contains(&format!("{}.mlp.gate.weight", names.layer()));
            let cache = config.latent_state();
            Some(MtpHead::load(
                weights,
                &names,
                &embed_tokens,
                hidden,
                cache,
                norm,
                |weights, p| layer(weights, p, sparse),
            )?)
        } else {
            None
        };
        // The head's own copies of the embedding and output head, and any deeper heads: the
        // target's are used, and one head drafts every depth by chaining.
        for extra in decoder_layers..decoder_layers + 4 {
            weights.set_aside(&format!("model.layers.{extra}."));
        }
        let final_norm = norm(weights, "model.norm.weight")?;
        let lm_head = embed_tokens.output_head(
            weights,
            config.tie_word_embeddings,
            "lm_head",
            vocab,
            hidden,
        )?;
        Ok(DeepseekV3 {
            spec: config.spec(),
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
            mtp,
        })
    }
}

/// The sparse block under `p`: router `gate` (with `e_score_correction_bias`), experts one by
/// one or fused as transformers 5 saves them, and ungated `shared_experts`.
fn sparse_block(c: &Config, weights: &mut Weights, p: &str, activation: Activation) -> Result<Moe> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let experts = dim(c.n_routed_experts, "n_routed_experts")?;
    let inter = dim(c.moe_intermediate_size, "moe_intermediate_size")?;
    let router = weights.matrix(&format!("{p}.gate"), experts, hidden)?;
    let correction_bias = weights
        .optional(&format!("{p}.gate.e_score_correction_bias"))?
        .map(|t| match t {
            Tensor::Dense(a) => Ok(a),
            Tensor::Quantized(_) | Tensor::KBlocks(_) => Err(Error::Weights(format!(
                "`{p}.gate.e_score_correction_bias` is quantized"
            ))),
        })
        .transpose()?;
    let fused = format!("{p}.experts.gate_up_proj");
    let moe = if weights.contains(&fused) {
        Moe::from_fused(
            router,
            StackedExperts::new(Tensor::Dense(
                weights.dense(&fused, &[experts, 2 * inter, hidden])?,
            )),
            StackedExperts::new(Tensor::Dense(
                weights.dense(&format!("{p}.experts.down_proj"), &[experts, hidden, inter])?,
            )),
            c.num_experts_per_tok,
            c.norm_topk_prob,
            RouterScoring::Sigmoid,
            activation,
        )?
    } else {
        let experts_at = format!("{p}.experts");
        let stacked = |weights: &mut Weights, which: &str, out: i32, inp: i32| {
            StackedExperts::load(weights, &experts_at, which, c.n_routed_experts, out, inp)
        };
        Moe::new(
            router,
            stacked(weights, "gate_proj", inter, hidden)?,
            stacked(weights, "up_proj", inter, hidden)?,
            stacked(weights, "down_proj", hidden, inter)?,
            c.num_experts_per_tok,
            c.norm_topk_prob,
            RouterScoring::Sigmoid,
            activation,
        )?
    };
    let moe = moe.with_routing(RouterOptions {
        correction_bias,
        groups: Some(c.groups),
        scale: c.routed_scaling_factor,
    })?;
    if c.n_shared_experts == 0 {
        return Ok(moe);
    }
    let shared = dim(
        c.moe_intermediate_size * c.n_shared_experts,
        "shared experts' width",
    )?;
    Ok(moe.with_shared(SharedExpert {
        mlp: Mlp::load(
            weights,
            &format!("{p}.shared_experts"),
            shared,
            hidden,
            activation,
        )?,
        gate: None,
    }))
}

impl Model for DeepseekV3 {
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
            h = layer.forward(&h, caches, i, batch, &positions)?;
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
            layer.collect_arrays(&mut out);
        }
        self.norm.collect_arrays(&mut out);
        self.lm_head.collect_arrays(&mut out);
        if let Some(mtp) = &self.mtp {
            mtp.collect_arrays(&mut out);
        }
        out
    }

    fn draft_head(&self) -> Option<&dyn DraftHead> {
        self.mtp.as_ref().map(|mtp| mtp as &dyn DraftHead)
    }
}

impl HeadLayer for DecoderLayer {
    fn forward(
        &self,
        h: &Array,
        caches: &mut [&mut [Option<LayerCache>]],
        index: usize,
        batch: &Batch,
        positions: &BatchPositions,
    ) -> Result<Array> {
        let x = self.input_layernorm.forward(h)?;
        let h = h.add(
            &self
                .self_attn
                .forward(&x, caches, index, batch, positions)?,
        )?;
        let x = self.post_attention_layernorm.forward(&h)?;
        let ff = match &self.mlp {
            FeedForward::Dense(mlp) => mlp.forward(&x)?,
            FeedForward::Sparse(moe) => moe.forward(&x)?,
        };
        Ok(h.add(&ff)?)
    }

    fn collect_arrays(&self, out: &mut Vec<Array>) {
        self.input_layernorm.collect_arrays(out);
        self.self_attn.collect_arrays(out);
        self.post_attention_layernorm.collect_arrays(out);
        match &self.mlp {
            FeedForward::Dense(mlp) => mlp.collect_arrays(out),
            FeedForward::Sparse(moe) => moe.collect_arrays(out),
        }
    }
}
