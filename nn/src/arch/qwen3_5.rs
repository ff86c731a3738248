//! Qwen3.5 and Qwen3-Next (text): hybrids of gated delta net layers and gated full attention,
//! with a dense MLP (Qwen3.5) or a mixture of experts with a gated shared expert (Qwen3.5-MoE,
//! Qwen3-Next) after each.
//!
//! Three of every four layers mix tokens with a gated delta net (Yang, Kautz and Hatamizadeh,
//! "Gated Delta Networks", 2024; see [`crate::gated_delta`]): a short causal convolution over
//! the projected queries, keys and values, then the delta rule's recurrence, whose state has a
//! fixed size whatever the context. The fourth attends over a KV cache, with a sigmoid output
//! gate per channel, per-head q/k norms and rotary embeddings on a quarter of each head. Every
//! layer's feed-forward is a SwiGLU MLP. Norms store `w − 1` (they scale by `1 + w`), except
//! the gated norm inside the delta net, which scales by `w`.
//!
//! Qwen3-Next, the first of the line, differs only in how it stores the delta net's input
//! projections: `in_proj_qkvz` and `in_proj_ba` interleave queries, keys, values and gates per
//! key head, where Qwen3.5 keeps four plain matrices. They are regrouped into Qwen3.5's at
//! load, so one forward serves both (a GGUF file holds `in_proj_qkvz` regrouped already, as
//! llama.cpp's converter writes it).
//!
//! References: transformers' `models/qwen3_5/modeling_qwen3_5.py`, `qwen3_5_moe` and
//! `qwen3_next` (5.24). Positions of text
//! tokens are the same on the three M-RoPE axes, so for text the rotary embedding is the plain
//! one over `head_dim · partial_rotary_factor` features; the sections matter only for images
//! (issue 21). The vision tower of the released checkpoints is set aside at load, not read;
//! their multi-token-prediction head (`mtp.*`, one decoder layer over the next token's
//! embedding and the target's final state) is read when the config names it, and drafts
//! through [`DraftHead`].

use kvcache::{LayerCache, LogicalMask, RecurrentConfig};
use mlx::{Array, Dtype};
use serde_json::Value;

use crate::activation::Activation;
use crate::attention::{Attention, AttentionParts};
use crate::cached_attention::{BatchPositions, attend_cached, check_cache_sets};
use crate::config::{Fields, dim, limits, missing, read_scaling};
use crate::embedding::Embedding;
use crate::gated_delta::{DeltaInputs, gated_delta_rule, softplus};
use crate::linear::{Linear, Tensor};
use crate::mlp::Mlp;
use crate::model::{Batch, DraftHead, Forward, LayerState, Model, ModelSpec, check_depth};
use crate::moe::{Moe, RouterScoring, SharedExpert, StackedExperts};
use crate::mtp_head::{HeadLayer, HeadNames, MtpHead};
use crate::recurrent_rows::{conv_tails, recurrent_states, split_at_captures, store};
use crate::rms_norm::RmsNorm;
use crate::rope::{Rope, RopeConfig};
use crate::short_conv::ShortConv;
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The hyperparameters of a Qwen3.5 text model, as its `config.json` (or the `text_config` of
/// a multimodal one) spells them.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `model_type`.
    pub model_type: String,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size`: the dense MLP's width (0 when every layer is sparse).
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
    /// `layer_types`: which layers are gated delta nets (`true`) and which attend.
    pub linear_layers: Vec<bool>,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `num_key_value_heads`.
    pub num_key_value_heads: usize,
    /// `head_dim`.
    pub head_dim: usize,
    /// The rotary embedding of attention layers (`rope_parameters`, with its
    /// `partial_rotary_factor`).
    pub rope: RopeConfig,
    /// `attention_bias`.
    pub attention_bias: bool,
    /// `linear_num_key_heads`.
    pub linear_num_key_heads: usize,
    /// `linear_num_value_heads`.
    pub linear_num_value_heads: usize,
    /// `linear_key_head_dim`.
    pub linear_key_head_dim: usize,
    /// `linear_value_head_dim`.
    pub linear_value_head_dim: usize,
    /// `linear_conv_kernel_dim`.
    pub linear_conv_kernel_dim: usize,
    /// The mixture of experts, for Qwen3.5-MoE and Qwen3-Next.
    pub moe: Option<SparseConfig>,
    /// How the delta net's input projections are stored.
    pub projections: Projections,
    /// `mtp_num_hidden_layers` (Qwen3-Next: `num_nextn_predict_layers`): the layers of the
    /// multi-token-prediction head the checkpoint ships, 0 when it says nothing.
    pub mtp_layers: usize,
}

/// The mixture-of-experts hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseConfig {
    /// `num_experts`.
    pub num_experts: usize,
    /// `num_experts_per_tok`.
    pub num_experts_per_tok: usize,
    /// `moe_intermediate_size`: each expert's width.
    pub moe_intermediate_size: usize,
    /// `shared_expert_intermediate_size`.
    pub shared_expert_intermediate_size: usize,
    /// `norm_topk_prob` (Qwen3.5-MoE always renormalizes).
    pub norm_topk_prob: bool,
    /// `decoder_sparse_step`: layers `i` with `(i + 1) % step == 0` are sparse.
    pub decoder_sparse_step: usize,
    /// `mlp_only_layers`: layers that keep the dense MLP.
    pub mlp_only_layers: Vec<usize>,
}

impl SparseConfig {
    fn is_sparse(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer)
            && (layer + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

/// How a checkpoint stores the delta net's input projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Projections {
    /// `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` (Qwen3.5).
    Separate,
    /// `in_proj_qkvz` and `in_proj_ba`, grouped per key head (Qwen3-Next).
    GroupedPerKeyHead,
}

impl Config {
    /// Reads the config, in transformers 5's spelling (`rope_parameters`, `layer_types`) or the
    /// older one (`rope_theta` and `partial_rotary_factor` at top level,
    /// `full_attention_interval`).
    pub fn from_json(config: &Value) -> Result<Config> {
        let f = Fields::text_section(config);
        let root = Fields { object: config };
        let model_type = f
            .str("model_type")
            .or_else(|| root.str("model_type"))
            .ok_or_else(|| missing("model_type"))?
            .to_string();
        let hidden_size = f.required_bounded("hidden_size", limits::HIDDEN)?;
        let layers = f.required_bounded("num_hidden_layers", limits::LAYERS)?;
        let heads = f.required_bounded("num_attention_heads", limits::HEADS)?;
        let kv_heads = f.required_bounded("num_key_value_heads", limits::HEADS)?;
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(Error::Config(format!(
                "{heads} attention heads cannot share {kv_heads} key/value heads"
            )));
        }
        let head_dim = f.required_bounded("head_dim", limits::HIDDEN)?;
        let linear_num_key_heads = f.required_bounded("linear_num_key_heads", limits::HEADS)?;
        let linear_num_value_heads = f.required_bounded("linear_num_value_heads", limits::HEADS)?;
        if linear_num_key_heads == 0 || linear_num_value_heads % linear_num_key_heads != 0 {
            return Err(Error::Config(format!(
                "{linear_num_value_heads} linear value heads cannot share \
                 {linear_num_key_heads} key heads"
            )));
        }
        let linear_conv_kernel_dim = f.required_bounded("linear_conv_kernel_dim", 64)?;
        if linear_conv_kernel_dim < 2 {
            return Err(Error::Config(format!(
                "`linear_conv_kernel_dim` = {linear_conv_kernel_dim} leaves no convolution"
            )));
        }
        let moe = read_sparse(&f, &model_type)?;
        // Qwen3.5-MoE has no dense layer and no dense width.
        let all_sparse = moe
            .as_ref()
            .is_some_and(|moe| (0..layers).all(|i| moe.is_sparse(i)));
        let intermediate_size = match f.bounded("intermediate_size", limits::INTERMEDIATE)? {
            Some(size) => size,
            None if all_sparse => 0,
            None => return Err(missing("intermediate_size")),
        };
        let projections = if model_type.starts_with("qwen3_next") {
            Projections::GroupedPerKeyHead
        } else {
            Projections::Separate
        };
        Ok(Config {
            model_type,
            hidden_size,
            intermediate_size,
            vocab_size: f.required_bounded("vocab_size", limits::VOCAB)?,
            rms_norm_eps: f
                .f64("rms_norm_eps")?
                .ok_or_else(|| missing("rms_norm_eps"))? as f32,
            max_position_embeddings: f
                .bounded("max_position_embeddings", limits::POSITIONS)?
                .ok_or_else(|| missing("max_position_embeddings"))?,
            tie_word_embeddings: f
                .bool("tie_word_embeddings")?
                .or(root.bool("tie_word_embeddings")?),
            hidden_act: f.str("hidden_act").unwrap_or("silu").to_string(),
            linear_layers: read_layer_types(&f, layers)?,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rope: read_rope(&f, head_dim)?,
            attention_bias: f.bool("attention_bias")?.unwrap_or(false),
            linear_num_key_heads,
            linear_num_value_heads,
            linear_key_head_dim: f.required_bounded("linear_key_head_dim", limits::HIDDEN)?,
            linear_value_head_dim: f.required_bounded("linear_value_head_dim", limits::HIDDEN)?,
            linear_conv_kernel_dim,
            moe,
            projections,
            mtp_layers: match f.bounded("mtp_num_hidden_layers", limits::LAYERS)? {
                Some(layers) => layers,
                None => f
                    .bounded("num_nextn_predict_layers", limits::LAYERS)?
                    .unwrap_or(0),
            },
        })
    }

    /// Channels of the delta net's convolution: queries, keys and values side by side.
    fn conv_dim(&self) -> usize {
        2 * self.linear_num_key_heads * self.linear_key_head_dim
            + self.linear_num_value_heads * self.linear_value_head_dim
    }

    /// What a full-attention layer keeps: keys and values of every position.
    fn attention_state(&self) -> LayerState {
        LayerState::Attention {
            kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            window: None,
        }
    }

    fn recurrent_config(&self) -> RecurrentConfig {
        RecurrentConfig {
            conv_tail: self.linear_conv_kernel_dim - 1,
            conv_dim: self.conv_dim(),
            heads: self.linear_num_value_heads,
            value_dim: self.linear_value_head_dim,
            key_dim: self.linear_key_head_dim,
        }
    }

    /// What the engine needs to know of the model.
    pub fn spec(&self) -> ModelSpec {
        let recurrent = self.recurrent_config();
        ModelSpec {
            model_type: self.model_type.clone(),
            vocab_size: self.vocab_size,
            context_length: self.max_position_embeddings,
            layers: self
                .linear_layers
                .iter()
                .map(|&linear| {
                    if linear {
                        LayerState::Recurrent { state: recurrent }
                    } else {
                        self.attention_state()
                    }
                })
                .collect(),
        }
    }
}

/// `layer_types` (`linear_attention` / `full_attention`), or every `full_attention_interval`-th
/// layer attending (transformers' default interval, 4, when neither is given).
fn read_layer_types(f: &Fields<'_>, layers: usize) -> Result<Vec<bool>> {
    if let Some(types) = f.get("layer_types") {
        let list = types
            .as_array()
            .ok_or_else(|| Error::Config("`layer_types` must be a list".into()))?;
        if list.len() != layers {
            return Err(Error::Config(format!(
                "`layer_types` lists {} layers, the model has {layers}",
                list.len()
            )));
        }
        return list
            .iter()
            .map(|t| match t.as_str() {
                Some("linear_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(Error::Config(format!("unsupported layer type {t}"))),
            })
            .collect();
    }
    let interval = f
        .bounded("full_attention_interval", limits::LAYERS)?
        .unwrap_or(4);
    if interval == 0 {
        return Err(Error::Config(
            "`full_attention_interval` must be positive".into(),
        ));
    }
    Ok((0..layers).map(|i| (i + 1) % interval != 0).collect())
}

/// The rotary embedding: base and scaling from `rope_parameters` (or `rope_theta` and
/// `rope_scaling`), over `head_dim · partial_rotary_factor` features.
fn read_rope(f: &Fields<'_>, head_dim: usize) -> Result<RopeConfig> {
    let (base, scaling, factor) = match f.get("rope_parameters") {
        Some(params) => {
            let p = Fields { object: params };
            let base = p
                .f64("rope_theta")?
                .ok_or_else(|| missing("rope_parameters.rope_theta"))?;
            let factor = p.f64("partial_rotary_factor")?;
            (base, read_scaling(params)?, factor)
        }
        None => {
            let base = f.f64("rope_theta")?.ok_or_else(|| missing("rope_theta"))?;
            let scaling = match f.get("rope_scaling") {
                Some(s) => read_scaling(s)?,
                None => crate::rope::RopeScaling::None,
            };
            (base, scaling, None)
        }
    };
    // transformers itself reads an absent factor as 0.25 for these families.
    let factor = match factor.or(f.f64("partial_rotary_factor")?) {
        Some(factor) if factor > 0.0 && factor <= 1.0 => factor,
        Some(factor) => {
            return Err(Error::Config(format!(
                "`partial_rotary_factor` must be in (0, 1], got {factor}"
            )));
        }
        None => 0.25,
    };
    Ok(RopeConfig {
        base,
        dims: ((head_dim as f64 * factor) as i32) & !1,
        traditional: false,
        scaling,
    })
}

/// The experts of Qwen3.5-MoE (every layer sparse, top-k always renormalized) or Qwen3-Next
/// (`decoder_sparse_step`, `mlp_only_layers`, `norm_topk_prob`); `None` for dense Qwen3.5.
fn read_sparse(f: &Fields<'_>, model_type: &str) -> Result<Option<SparseConfig>> {
    let Some(num_experts) = f
        .bounded("num_experts", limits::EXPERTS)?
        .filter(|&n| n > 0)
    else {
        if model_type.contains("moe") || model_type.starts_with("qwen3_next") {
            return Err(missing("num_experts"));
        }
        return Ok(None);
    };
    let next = model_type.starts_with("qwen3_next");
    let top_k = f.required_usize("num_experts_per_tok")?;
    if top_k == 0 || top_k > num_experts {
        return Err(Error::Config(format!(
            "`num_experts_per_tok` = {top_k} must be between 1 and the {num_experts} experts"
        )));
    }
    let mlp_only_layers = match f.get("mlp_only_layers") {
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
    Ok(Some(SparseConfig {
        num_experts,
        num_experts_per_tok: top_k,
        moe_intermediate_size: f.required_bounded("moe_intermediate_size", limits::INTERMEDIATE)?,
        shared_expert_intermediate_size: f
            .required_bounded("shared_expert_intermediate_size", limits::INTERMEDIATE)?,
        norm_topk_prob: if next {
            f.bool("norm_topk_prob")?.unwrap_or(true)
        } else {
            true
        },
        decoder_sparse_step: f.usize("decoder_sparse_step")?.unwrap_or(1).max(1),
        mlp_only_layers,
    }))
}

/// The gated delta net of a linear layer (`linear_attn`).
struct GatedDeltaNet {
    in_proj_qkv: Linear,
    in_proj_z: Linear,
    in_proj_b: Linear,
    in_proj_a: Linear,
    conv1d: ShortConv,
    /// Added to the decay input before the softplus; f32, converted once at load.
    dt_bias: Array,
    /// `−exp(A_log)`, f32: the decay rate per value head.
    decay_rate: Array,
    /// The gated norm of each value head's output.
    norm: RmsNorm,
    out_proj: Linear,
    key_heads: i32,
    value_heads: i32,
    key_dim: i32,
    value_dim: i32,
}

impl GatedDeltaNet {
    fn new(c: &Config, weights: &mut Weights, p: &str) -> Result<GatedDeltaNet> {
        let hidden = dim(c.hidden_size, "hidden_size")?;
        let key_heads = dim(c.linear_num_key_heads, "linear_num_key_heads")?;
        let value_heads = dim(c.linear_num_value_heads, "linear_num_value_heads")?;
        let key_dim = dim(c.linear_key_head_dim, "linear_key_head_dim")?;
        let value_dim = dim(c.linear_value_head_dim, "linear_value_head_dim")?;
        let conv_dim = dim(c.conv_dim(), "linear conv channels")?;
        let a_log = weights.dense(&format!("{p}.A_log"), &[value_heads])?;
        let conv_name = format!("{p}.conv1d.weight");
        let kernel = dim(c.linear_conv_kernel_dim, "linear_conv_kernel_dim")?;
        let conv_weight = weights.dense(&conv_name, &[conv_dim, 1, kernel])?;
        let conv1d = ShortConv::from_torch(&conv_weight, conv_dim)?;
        let [in_proj_qkv, in_proj_z, in_proj_b, in_proj_a] = match c.projections {
            Projections::Separate => [
                weights.matrix(&format!("{p}.in_proj_qkv"), conv_dim, hidden)?,
                weights.matrix(&format!("{p}.in_proj_z"), value_heads * value_dim, hidden)?,
                weights.matrix(&format!("{p}.in_proj_b"), value_heads, hidden)?,
                weights.matrix(&format!("{p}.in_proj_a"), value_heads, hidden)?,
            ],
            Projections::GroupedPerKeyHead
                if !weights.contains(&format!("{p}.in_proj_qkvz.weight")) =>
            {
                // llama.cpp's converter writes `in_proj_qkvz` already regrouped, as Qwen3.5's
                // `in_proj_qkv` and `in_proj_z`, and keeps `in_proj_ba` as it is.
                let [in_proj_b, in_proj_a] = split_ba(c, weights, p)?;
                [
                    weights.matrix(&format!("{p}.in_proj_qkv"), conv_dim, hidden)?,
                    weights.matrix(&format!("{p}.in_proj_z"), value_heads * value_dim, hidden)?,
                    in_proj_b,
                    in_proj_a,
                ]
            }
            Projections::GroupedPerKeyHead => regroup_projections(c, weights, p)?,
        };
        Ok(GatedDeltaNet {
            in_proj_qkv,
            in_proj_z,
            in_proj_b,
            in_proj_a,
            conv1d,
            dt_bias: weights
                .dense(&format!("{p}.dt_bias"), &[value_heads])?
                .astype(Dtype::F32)?,
            decay_rate: a_log.astype(Dtype::F32)?.exp()?.negative()?,
            norm: RmsNorm::new(
                weights.dense(&format!("{p}.norm.weight"), &[value_dim])?,
                c.rms_norm_eps,
            ),
            out_proj: weights.matrix(&format!("{p}.out_proj"), hidden, value_heads * value_dim)?,
            key_heads,
            value_heads,
            key_dim,
            value_dim,
        })
    }

    fn collect_arrays(&self, out: &mut Vec<Array>) {
        for proj in [
            &self.in_proj_qkv,
            &self.in_proj_z,
            &self.in_proj_b,
            &self.in_proj_a,
            &self.out_proj,
        ] {
            proj.collect_arrays(out);
        }
        self.conv1d.collect_arrays(out);
        out.extend([self.dt_bias.clone(), self.decay_rate.clone()]);
        self.norm.collect_arrays(out);
    }

    /// Mixes `x: [rows, tokens, hidden]`, row `r` continuing from the state in
    /// `caches[r][layer]`. A prefix-cache capture scheduled strictly inside the forward splits
    /// it there (for every row: the pieces are the same arithmetic, token by token), since a
    /// recurrent state exists only at a piece's end.
    fn forward(
        &self,
        x: &Array,
        caches: &mut [&mut [Option<LayerCache>]],
        layer: usize,
    ) -> Result<Array> {
        split_at_captures(x, caches, layer, |piece, caches| {
            self.forward_piece(piece, caches, layer)
        })
    }

    fn forward_piece(
        &self,
        x: &Array,
        caches: &mut [&mut [Option<LayerCache>]],
        layer: usize,
    ) -> Result<Array> {
        let shape = x.shape();
        let (rows, tokens) = (shape[0], shape[1]);
        let tail = conv_tails(caches, layer, x.dtype())?;
        let state = recurrent_states(caches, layer)?;

        let (mixed, tail) = self.conv1d.forward(&self.in_proj_qkv.forward(x)?, &tail)?;
        let mixed = mixed.silu()?;
        let key_width = self.key_heads * self.key_dim;
        let mut parts = mixed.split_at(&[key_width, 2 * key_width], -1)?.into_iter();
        let (Some(q), Some(k), Some(v)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(Error::InvalidInput(
                "gated delta net: the convolution output did not split".into(),
            ));
        };
        let q = q.reshape(&[rows, tokens, self.key_heads, self.key_dim])?;
        let k = k.reshape(&[rows, tokens, self.key_heads, self.key_dim])?;
        let v = v.reshape(&[rows, tokens, self.value_heads, self.value_dim])?;
        let beta = self.in_proj_b.forward(x)?.sigmoid()?;
        let a = self.in_proj_a.forward(x)?.astype(Dtype::F32)?;
        let g = softplus(&a.add(&self.dt_bias)?)?.multiply(&self.decay_rate)?;
        let (y, state) = gated_delta_rule(
            &DeltaInputs {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
            },
            &state,
        )?;

        store(caches, layer, &tail, Some(&state), tokens as usize)?;

        let z = self.in_proj_z.forward(x)?.reshape(&[
            rows,
            tokens,
            self.value_heads,
            self.value_dim,
        ])?;
        let y = self.norm.forward(&y)?.multiply(&z.silu()?)?;
        self.out_proj
            .forward(&y.reshape(&[rows, tokens, self.value_heads * self.value_dim])?)
    }
}

/// Qwen3-Next's `in_proj_qkvz` (per key head: its query, its key, then the values and output
/// gates of the value heads it serves) and `in_proj_ba` as Qwen3.5's four matrices. Rows are
/// only reordered, so the products are the same; quantized projections are dequantized for it.
fn regroup_projections(c: &Config, weights: &mut Weights, p: &str) -> Result<[Linear; 4]> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let key_heads = dim(c.linear_num_key_heads, "linear_num_key_heads")?;
    let group = dim(
        c.linear_num_value_heads / c.linear_num_key_heads,
        "value heads per key head",
    )?;
    let key_dim = dim(c.linear_key_head_dim, "linear_key_head_dim")?;
    let value_dim = dim(c.linear_value_head_dim, "linear_value_head_dim")?;
    let per_head = 2 * key_dim + 2 * group * value_dim;
    let qkvz = weights
        .dense(
            &format!("{p}.in_proj_qkvz.weight"),
            &[key_heads * per_head, hidden],
        )?
        .reshape(&[key_heads, per_head, hidden])?;
    let rows = |start: i32, len: i32| -> Result<Array> {
        Ok(qkvz
            .slice_axis(1, start, start + len)?
            .reshape(&[key_heads * len, hidden])?)
    };
    let q = rows(0, key_dim)?;
    let k = rows(key_dim, key_dim)?;
    let v = rows(2 * key_dim, group * value_dim)?;
    let z = rows(2 * key_dim + group * value_dim, group * value_dim)?;
    let [b, a] = split_ba(c, weights, p)?;
    let dense = |w: Array| Linear::new(Tensor::Dense(w), None);
    Ok([dense(mlx::concatenate(&[q, k, v], 0)?), dense(z), b, a])
}

/// Qwen3-Next's `in_proj_ba` (per key head: its value heads' `b`, then their `a`) as Qwen3.5's
/// `in_proj_b` and `in_proj_a`.
fn split_ba(c: &Config, weights: &mut Weights, p: &str) -> Result<[Linear; 2]> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let key_heads = dim(c.linear_num_key_heads, "linear_num_key_heads")?;
    let group = dim(
        c.linear_num_value_heads / c.linear_num_key_heads,
        "value heads per key head",
    )?;
    let ba = weights
        .dense(
            &format!("{p}.in_proj_ba.weight"),
            &[key_heads * 2 * group, hidden],
        )?
        .reshape(&[key_heads, 2 * group, hidden])?;
    let rows = |start: i32| -> Result<Linear> {
        let w = ba
            .slice_axis(1, start, start + group)?
            .reshape(&[key_heads * group, hidden])?;
        Ok(Linear::new(Tensor::Dense(w), None))
    };
    Ok([rows(0)?, rows(group)?])
}

/// How a layer mixes tokens.
enum Mixer {
    /// `linear_attn`: a gated delta net.
    Linear(GatedDeltaNet),
    /// `self_attn`: gated full attention.
    Attention(Attention),
}

/// A layer's feed-forward block (`mlp`).
enum FeedForward {
    /// A SwiGLU MLP.
    Dense(Mlp),
    /// Routed experts beside a gated shared expert.
    Sparse(Moe),
}

impl FeedForward {
    fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            FeedForward::Dense(mlp) => mlp.forward(x),
            FeedForward::Sparse(moe) => moe.forward(x),
        }
    }

    fn collect_arrays(&self, out: &mut Vec<Array>) {
        match self {
            FeedForward::Dense(mlp) => mlp.collect_arrays(out),
            FeedForward::Sparse(moe) => moe.collect_arrays(out),
        }
    }
}

/// One decoder layer: pre-norm mixer and pre-norm feed-forward, each added to the residual
/// stream.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    mixer: Mixer,
    post_attention_layernorm: RmsNorm,
    mlp: FeedForward,
}

/// The decoder's layers and the head's run the same code.
impl HeadLayer for DecoderLayer {
    /// The layer over `h`, its mixer reading and appending to cache slot `index` of each row.
    fn forward(
        &self,
        h: &Array,
        caches: &mut [&mut [Option<LayerCache>]],
        index: usize,
        batch: &Batch,
        positions: &BatchPositions,
    ) -> Result<Array> {
        let x = self.input_layernorm.forward(h)?;
        let mixed = match &self.mixer {
            Mixer::Linear(net) => net.forward(&x, caches, index)?,
            Mixer::Attention(attention) => {
                let projected = attention.project(&x, positions.rope())?;
                attend_cached(
                    attention,
                    &projected,
                    caches,
                    index,
                    &batch.positions,
                    LogicalMask::Causal,
                )?
            }
        };
        let h = h.add(&mixed)?;
        Ok(h.add(
            &self
                .mlp
                .forward(&self.post_attention_layernorm.forward(&h)?)?,
        )?)
    }

    fn collect_arrays(&self, out: &mut Vec<Array>) {
        self.input_layernorm.collect_arrays(out);
        match &self.mixer {
            Mixer::Linear(net) => net.collect_arrays(out),
            Mixer::Attention(attention) => attention.collect_arrays(out),
        }
        self.post_attention_layernorm.collect_arrays(out);
        self.mlp.collect_arrays(out);
    }
}

/// A Qwen3.5 text model.
pub struct Qwen3_5 {
    spec: ModelSpec,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    mtp: Option<MtpHead<DecoderLayer>>,
}

impl Qwen3_5 {
    /// Builds the model from transformers-named weights (`model.layers.N.linear_attn.…`, or
    /// `model.language_model.layers.N.…` in a multimodal checkpoint).
    pub fn new(config: Config, weights: &mut Weights) -> Result<Qwen3_5> {
        let hidden = dim(config.hidden_size, "hidden_size")?;
        let vocab = dim(config.vocab_size, "vocab_size")?;
        let eps = config.rms_norm_eps;
        let root = if weights.contains("model.language_model.embed_tokens.weight") {
            "model.language_model"
        } else {
            "model"
        };
        // The released checkpoints carry a vision tower (images: issue 21) beside the decoder.
        weights.set_aside("model.visual.");
        let norm = |weights: &mut Weights, name: &str, size: i32| -> Result<RmsNorm> {
            RmsNorm::with_unit_offset(weights.dense(name, &[size])?, eps)
        };
        let embed_name = format!("{root}.embed_tokens.weight");
        let embed_weight = weights.table(&embed_name)?;
        check_matrix(&embed_name, &embed_weight, vocab, hidden)?;
        let embed_tokens = Embedding::new(embed_weight).with_packed(weights.packed(&embed_name)?);
        let activation = Activation::from_name(&config.hidden_act)?;
        let rope = Rope::new(&config.rope)?;

        let layer = |weights: &mut Weights, p: &str, linear: bool, sparse_mlp: bool| {
            let mixer = if linear {
                Mixer::Linear(GatedDeltaNet::new(
                    &config,
                    weights,
                    &format!("{p}.linear_attn"),
                )?)
            } else {
                Mixer::Attention(attention(
                    &config,
                    weights,
                    &format!("{p}.self_attn"),
                    &rope,
                )?)
            };
            Ok::<_, Error>(DecoderLayer {
                input_layernorm: norm(weights, &format!("{p}.input_layernorm.weight"), hidden)?,
                mixer,
                post_attention_layernorm: norm(
                    weights,
                    &format!("{p}.post_attention_layernorm.weight"),
                    hidden,
                )?,
                mlp: match &config.moe {
                    Some(moe) if sparse_mlp => FeedForward::Sparse(sparse(
                        moe,
                        weights,
                        &format!("{p}.mlp"),
                        hidden,
                        activation,
                    )?),
                    _ => FeedForward::Dense(Mlp::load(
                        weights,
                        &format!("{p}.mlp"),
                        dim(config.intermediate_size, "intermediate_size")?,
                        hidden,
                        activation,
                    )?),
                },
            })
        };

        let mut layers = Vec::with_capacity(config.linear_layers.len());
        for (i, &linear) in config.linear_layers.iter().enumerate() {
            let sparse_mlp = config.moe.as_ref().is_some_and(|moe| moe.is_sparse(i));
            layers.push(layer(
                weights,
                &format!("{root}.layers.{i}"),
                linear,
                sparse_mlp,
            )?);
        }
        // The multi-token-prediction head, when the config names one layer and the checkpoint
        // kept its tensors (many conversions drop them). Its layer attends, and its MLP is
        // sparse wherever the decoder's are. A head of several layers is set aside, unread.
        let mtp = if config.mtp_layers == 1 && HeadNames::mtp().present(weights) {
            Some(MtpHead::load(
                weights,
                &HeadNames::mtp(),
                &embed_tokens,
                hidden,
                config.attention_state(),
                |weights, name| norm(weights, name, hidden),
                |weights, p| layer(weights, p, false, config.moe.is_some()),
            )?)
        } else {
            weights.set_aside("mtp.");
            None
        };
        let final_norm = norm(weights, &format!("{root}.norm.weight"), hidden)?;
        let lm_head = embed_tokens.output_head(
            weights,
            config.tie_word_embeddings,
            "lm_head",
            vocab,
            hidden,
        )?;
        Ok(Qwen3_5 {
            spec: config.spec(),
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
            mtp,
        })
    }
}

/// The sparse block under `p`: router `gate`, experts either fused as transformers 5 saves
/// them (`experts.gate_up_proj` `[E, 2I, H]`, `experts.down_proj` `[E, H, I]`) or one by one
/// (`experts.N.gate_proj.weight`, …), and `shared_expert` scaled by
/// `sigmoid(shared_expert_gate)`.
fn sparse(
    c: &SparseConfig,
    weights: &mut Weights,
    p: &str,
    hidden: i32,
    activation: Activation,
) -> Result<Moe> {
    let experts = dim(c.num_experts, "num_experts")?;
    let inter = dim(c.moe_intermediate_size, "moe_intermediate_size")?;
    let router = weights.matrix(&format!("{p}.gate"), experts, hidden)?;
    let fused = format!("{p}.experts.gate_up_proj");
    let moe = if weights.contains(&fused) {
        let gate_up = weights.dense(&fused, &[experts, 2 * inter, hidden])?;
        let down = weights.dense(&format!("{p}.experts.down_proj"), &[experts, hidden, inter])?;
        Moe::from_fused(
            router,
            StackedExperts::new(Tensor::Dense(gate_up)),
            StackedExperts::new(Tensor::Dense(down)),
            c.num_experts_per_tok,
            c.norm_topk_prob,
            RouterScoring::Softmax,
            activation,
        )?
    } else {
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
        )?
    };
    let shared_inter = dim(
        c.shared_expert_intermediate_size,
        "shared_expert_intermediate_size",
    )?;
    Ok(moe.with_shared(SharedExpert {
        mlp: Mlp::load(
            weights,
            &format!("{p}.shared_expert"),
            shared_inter,
            hidden,
            activation,
        )?,
        gate: Some(weights.matrix(&format!("{p}.shared_expert_gate"), 1, hidden)?),
    }))
}

/// The gated attention block of a full-attention layer (`self_attn`).
fn attention(c: &Config, weights: &mut Weights, p: &str, rope: &Rope) -> Result<Attention> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let heads = dim(c.num_attention_heads, "num_attention_heads")?;
    let kv_heads = dim(c.num_key_value_heads, "num_key_value_heads")?;
    let head_dim = dim(c.head_dim, "head_dim")?;
    let projection = |weights: &mut Weights, name: &str, out: i32, inp: i32| {
        weights.projection(&format!("{p}.{name}"), out, inp, c.attention_bias)
    };
    let head_norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
        RmsNorm::with_unit_offset(
            weights.dense(&format!("{p}.{name}.weight"), &[head_dim])?,
            c.rms_norm_eps,
        )
    };
    Ok(AttentionParts::new(
        projection(weights, "q_proj", 2 * heads * head_dim, hidden)?,
        projection(weights, "k_proj", kv_heads * head_dim, hidden)?,
        projection(weights, "v_proj", kv_heads * head_dim, hidden)?,
        projection(weights, "o_proj", hidden, heads * head_dim)?,
        heads,
        kv_heads,
        head_dim,
    )
    .with_rope(rope.clone())
    .with_qk_norms(head_norm(weights, "q_norm")?, head_norm(weights, "k_norm")?)
    .with_output_gate()
    .build())
}

impl Model for Qwen3_5 {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// A recurrent layer's state cannot rewind past a forward; `slack` only concerns sliding
    /// windows, which this family has none of.
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
