//! DFlash block drafters (`DFlashDraftModel`, `dflash_config` in the config): a few decoder
//! layers that propose a whole block of tokens in one forward.
//!
//! The context is the target's own hidden states at the layers `target_layer_ids` name (layer
//! `i`'s output), concatenated per position, projected by `fc` and normed by `hidden_norm`.
//! Each decoder layer (Qwen3's: per-head q/k norms, a rotary embedding, a gated MLP) attends
//! from the block's queries over the keys and values of that context (kept in the drafter's
//! own caches, at the target's positions) and of the block itself (never cached), with no
//! causal mask. The block is the round's first token (the last committed one, at position
//! `P`: the context's length) and `block_size − 1` copies of `mask_token_id`, embedded by the
//! target; the normed states at the mask positions go through the target's output head, one
//! draft each. The drafter has no embedding or head of its own. Keys and values are projected
//! by one fused matrix (`k_proj` over `v_proj`, stacked at load).
//!
//! Loading checks the fit: every tap inside the target's layers, the target's width, and the
//! mask token inside its vocabulary; a mismatch is an error naming it.
//!
//! References: the DFlash checkpoints' layout (`fc`, `hidden_norm`, `layers.*`, `norm`) and
//! mlx-vlm's `speculative/drafters/qwen3_dflash` (0.7.10), whose output the fixture holds.

use kvcache::{KvCache, LayerCache};
use mlx::Array;
use mlx::fast::{AttentionMask, RopeOffset};
use serde_json::Value;

use crate::activation::Activation;
use crate::config::{Fields, dim, limits, read_rope};
use crate::linear::{Linear, Tensor};
use crate::mlp::Mlp;
use crate::model::Model;
use crate::rms_norm::RmsNorm;
use crate::rope::Rope;
use crate::sdpa::ScaledDotProduct;
use crate::weights::Weights;
use crate::{Error, Result};

/// Whether `config` is a DFlash drafter's.
pub fn is_dflash(config: &Value) -> bool {
    config.get("dflash_config").is_some()
        || config
            .get("architectures")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|n| n.as_str() == Some("DFlashDraftModel")))
}

/// One decoder layer.
struct Layer {
    input_layernorm: RmsNorm,
    q_proj: Linear,
    /// `k_proj` over `v_proj`.
    kv_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    o_proj: Linear,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

/// A DFlash drafter, fitted to its target.
pub struct DFlash {
    fc: Linear,
    hidden_norm: RmsNorm,
    layers: Vec<Layer>,
    norm: RmsNorm,
    rope: Rope,
    kernel: ScaledDotProduct,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    block_size: usize,
    mask_token: u32,
    taps: Vec<usize>,
}

/// Every tensor under `prefix`, or under `model.` + `prefix` as some conversions write them.
fn name(weights: &Weights, prefix: &str) -> String {
    if weights.contains(&format!("{prefix}.weight"))
        || !weights.contains(&format!("model.{prefix}.weight"))
    {
        prefix.to_string()
    } else {
        format!("model.{prefix}")
    }
}

impl DFlash {
    /// Reads the drafter of `config` from `weights` for the target of `target_config`,
    /// refusing one that does not fit it.
    pub fn new(config: &Value, weights: &mut Weights, target_config: &Value) -> Result<DFlash> {
        let f = Fields { object: config };
        let dflash = Fields {
            object: f.get("dflash_config").ok_or_else(|| {
                Error::Config("a DFlash drafter's config has no `dflash_config`".into())
            })?,
        };
        let hidden = f.required_bounded("hidden_size", limits::HIDDEN)?;
        let (heads, kv_heads) = f.attention_heads()?;
        let head_dim = f.required_bounded("head_dim", limits::HIDDEN)?;
        let layers = f.required_bounded("num_hidden_layers", limits::LAYERS)?;
        let inter = f.required_bounded("intermediate_size", limits::INTERMEDIATE)?;
        let eps = f.f64("rms_norm_eps")?.unwrap_or(1e-6) as f32;
        let block_size = f.required_bounded("block_size", limits::POSITIONS)?;
        if block_size < 2 {
            return Err(Error::Config(format!(
                "a DFlash block of {block_size} tokens drafts nothing"
            )));
        }
        if let Some(types) = f.get("layer_types").and_then(Value::as_array)
            && types.iter().any(|t| t.as_str() != Some("full_attention"))
        {
            return Err(Error::Config(
                "DFlash drafters with sliding-window layers are not supported".into(),
            ));
        }
        let mask_token = dflash.required_bounded("mask_token_id", limits::VOCAB)?;
        let taps: Vec<usize> = dflash
            .get("target_layer_ids")
            .and_then(Value::as_array)
            .ok_or_else(|| Error::Config("`dflash_config.target_layer_ids` is missing".into()))?
            .iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| usize::try_from(t).ok())
                    .ok_or_else(|| Error::Config(format!("target layer id {t} is not a layer")))
            })
            .collect::<Result<_>>()?;
        if taps.is_empty() {
            return Err(Error::Config(
                "`dflash_config.target_layer_ids` is empty".into(),
            ));
        }
        fit(hidden, mask_token, &taps, target_config)?;

        let h = dim(hidden, "hidden_size")?;
        let (q_heads, kv, hd) = (
            dim(heads, "num_attention_heads")?,
            dim(kv_heads, "num_key_value_heads")?,
            dim(head_dim, "head_dim")?,
        );
        let norm = |weights: &mut Weights, prefix: &str, size: i32| -> Result<RmsNorm> {
            let prefix = name(weights, prefix);
            Ok(RmsNorm::new(
                weights.dense(&format!("{prefix}.weight"), &[size])?,
                eps,
            ))
        };
        let matrix = |weights: &mut Weights, prefix: &str, out: i32, inp: i32| {
            let prefix = name(weights, prefix);
            weights.matrix(&prefix, out, inp)
        };
        let activation = Activation::from_name(f.str("hidden_act").unwrap_or("silu"))?;
        let mut decoder = Vec::with_capacity(layers);
        for i in 0..layers {
            let p = format!("layers.{i}");
            let k = matrix(weights, &format!("{p}.self_attn.k_proj"), kv * hd, h)?;
            let v = matrix(weights, &format!("{p}.self_attn.v_proj"), kv * hd, h)?;
            let kv_proj = match (k.into_weight(), v.into_weight()) {
                (Tensor::Dense(k), Tensor::Dense(v)) => {
                    Linear::new(Tensor::Dense(mlx::concatenate(&[k, v], 0)?), None)
                }
                _ => {
                    return Err(Error::Weights(format!(
                        "`{p}.self_attn` keys and values must be dense to fuse (load dequantized)"
                    )));
                }
            };
            let mlp_prefix = name(weights, &format!("{p}.mlp.gate_proj"));
            let mlp_prefix = mlp_prefix.trim_end_matches(".gate_proj").to_string();
            decoder.push(Layer {
                input_layernorm: norm(weights, &format!("{p}.input_layernorm"), h)?,
                q_proj: matrix(weights, &format!("{p}.self_attn.q_proj"), q_heads * hd, h)?,
                kv_proj,
                q_norm: norm(weights, &format!("{p}.self_attn.q_norm"), hd)?,
                k_norm: norm(weights, &format!("{p}.self_attn.k_norm"), hd)?,
                o_proj: matrix(weights, &format!("{p}.self_attn.o_proj"), h, q_heads * hd)?,
                post_attention_layernorm: norm(
                    weights,
                    &format!("{p}.post_attention_layernorm"),
                    h,
                )?,
                mlp: Mlp::load(
                    weights,
                    &mlp_prefix,
                    dim(inter, "intermediate_size")?,
                    h,
                    activation,
                )?,
            });
        }
        let taps_width = dim(taps.len() * hidden, "the taps' width")?;
        Ok(DFlash {
            fc: matrix(weights, "fc", h, taps_width)?,
            hidden_norm: norm(weights, "hidden_norm", h)?,
            layers: decoder,
            norm: norm(weights, "norm", h)?,
            rope: Rope::new(&read_rope(&f, hd)?.0)?,
            kernel: ScaledDotProduct {
                scale: (head_dim as f32).powf(-0.5),
                logit_softcap: None,
                sinks: None,
            },
            heads: q_heads,
            kv_heads: kv,
            head_dim: hd,
            block_size,
            mask_token: u32::try_from(mask_token).unwrap_or(u32::MAX),
            taps,
        })
    }

    /// The target layers whose outputs it reads, in order.
    pub fn taps(&self) -> &[usize] {
        &self.taps
    }

    /// Tokens in a block: the round's first and the masks that become its drafts.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The token a block's masked positions hold.
    pub fn mask_token(&self) -> u32 {
        self.mask_token
    }

    /// Fresh context caches for one sequence, one per layer.
    pub fn new_caches(&self) -> Vec<Option<LayerCache>> {
        self.layers
            .iter()
            .map(|_| Some(LayerCache::Kv(KvCache::new())))
            .collect()
    }

    /// One sequence's round: `context` (`[1, n, taps · hidden]`, the target's tapped states at
    /// the positions after those `caches` hold, or `None` when there are none) is appended to
    /// its caches, and the block of `first` and `block_size − 1` masks at the position after
    /// them is drafted. Returns the normed states at the masks, `[1, block_size − 1, hidden]`:
    /// the target's `unembed` gives their logits.
    pub fn draft(
        &self,
        target: &dyn Model,
        first: u32,
        context: Option<&Array>,
        caches: &mut [Option<LayerCache>],
    ) -> Result<Array> {
        if caches.len() != self.layers.len() {
            return Err(Error::InvalidInput(format!(
                "{} context caches for {} layers",
                caches.len(),
                self.layers.len()
            )));
        }
        let embeddings = target.input_embeddings().ok_or_else(|| {
            Error::InvalidInput("the drafter's target offers no token embedding".into())
        })?;
        let mut block = vec![first as i32];
        block.extend(std::iter::repeat_n(
            self.mask_token as i32,
            self.block_size - 1,
        ));
        let tokens = Array::from_slice(&block, &[1, block.len() as i32])?;
        let mut h = embeddings.embed(&tokens)?;
        let context = context
            .map(|c| self.hidden_norm.forward(&self.fc.forward(c)?))
            .transpose()?;
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            let cache = cache
                .as_mut()
                .ok_or_else(|| Error::InvalidInput("a DFlash layer has no cache".into()))?;
            h = self.layer(layer, &h, context.as_ref(), cache)?;
        }
        let out = self.norm.forward(&h)?;
        Ok(out.slice_axis(1, 1, self.block_size as i32)?)
    }

    /// One layer over the block `h`, its context's keys and values appended to `cache` first.
    fn layer(
        &self,
        layer: &Layer,
        h: &Array,
        context: Option<&Array>,
        cache: &mut LayerCache,
    ) -> Result<Array> {
        let history = match context {
            Some(c) => {
                let offset = cache.offset() as i32;
                let (k, v) = self.keys_values(layer, c, offset)?;
                Some(cache.update(&k, &v)?)
            }
            None => cache.view(usize::MAX)?,
        };
        let position = cache.offset() as i32;
        let x = layer.input_layernorm.forward(h)?;
        let q = self.heads_of(&layer.q_proj.forward(&x)?, self.heads)?;
        let q = self.rope.forward(
            &layer.q_norm.forward(&q)?.transpose(&[0, 2, 1, 3])?,
            RopeOffset::Scalar(position),
        )?;
        let (bk, bv) = self.keys_values(layer, &x, position)?;
        let (keys, values) = match history {
            Some(history) => {
                let (k, v) = history.floats()?;
                (
                    mlx::concatenate(&[k, bk], 2)?,
                    mlx::concatenate(&[v, bv], 2)?,
                )
            }
            None => (bk, bv),
        };
        let heads = self
            .kernel
            .attend(&q, &keys, &values, AttentionMask::None)?;
        let (rows, tokens) = (heads.dim(0)?, heads.dim(2)?);
        let merged =
            heads
                .transpose(&[0, 2, 1, 3])?
                .reshape(&[rows, tokens, self.heads * self.head_dim])?;
        let h = h.add(&layer.o_proj.forward(&merged)?)?;
        Ok(h.add(
            &layer
                .mlp
                .forward(&layer.post_attention_layernorm.forward(&h)?)?,
        )?)
    }

    /// Normed, rotated keys and values of `x` at positions from `offset`,
    /// `[1, kv_heads, n, head_dim]`.
    fn keys_values(&self, layer: &Layer, x: &Array, offset: i32) -> Result<(Array, Array)> {
        let kv = layer.kv_proj.forward(x)?;
        let width = self.kv_heads * self.head_dim;
        let k = self.heads_of(&kv.slice_axis(-1, 0, width)?, self.kv_heads)?;
        let v = self.heads_of(&kv.slice_axis(-1, width, 2 * width)?, self.kv_heads)?;
        let k = layer.k_norm.forward(&k)?.transpose(&[0, 2, 1, 3])?;
        Ok((
            self.rope.forward(&k, RopeOffset::Scalar(offset))?,
            v.transpose(&[0, 2, 1, 3])?,
        ))
    }

    /// `y` (`[rows, tokens, n · head_dim]`) split into `n` heads.
    fn heads_of(&self, y: &Array, n: i32) -> Result<Array> {
        let (rows, tokens) = (y.dim(0)?, y.dim(1)?);
        Ok(y.reshape(&[rows, tokens, n, self.head_dim])?)
    }

    /// Every weight array, for evaluating them once at load.
    pub fn parameters(&self) -> Vec<Array> {
        let mut out = Vec::new();
        self.fc.collect_arrays(&mut out);
        self.hidden_norm.collect_arrays(&mut out);
        for layer in &self.layers {
            for norm in [
                &layer.input_layernorm,
                &layer.q_norm,
                &layer.k_norm,
                &layer.post_attention_layernorm,
            ] {
                norm.collect_arrays(&mut out);
            }
            for linear in [&layer.q_proj, &layer.kv_proj, &layer.o_proj] {
                linear.collect_arrays(&mut out);
            }
            layer.mlp.collect_arrays(&mut out);
        }
        self.norm.collect_arrays(&mut out);
        out
    }
}

/// Refuses the drafter of `config` for the target of `target_config` when it does not fit
/// (its taps, width and mask token), from the configs alone: `create` checks a pairing before
/// anything is loaded.
pub fn check_fit(config: &Value, target_config: &Value) -> Result<()> {
    let f = Fields { object: config };
    let dflash = Fields {
        object: f.get("dflash_config").ok_or_else(|| {
            Error::Config("a DFlash drafter's config has no `dflash_config`".into())
        })?,
    };
    let taps: Vec<usize> = dflash
        .get("target_layer_ids")
        .and_then(Value::as_array)
        .map(|ids| {
            ids.iter()
                .filter_map(|t| t.as_u64().and_then(|t| usize::try_from(t).ok()))
                .collect()
        })
        .unwrap_or_default();
    fit(
        f.required_bounded("hidden_size", limits::HIDDEN)?,
        dflash.required_bounded("mask_token_id", limits::VOCAB)?,
        &taps,
        target_config,
    )
}

/// Refuses a drafter that does not fit the target of `target_config`, naming what differs.
fn fit(hidden: usize, mask_token: usize, taps: &[usize], target_config: &Value) -> Result<()> {
    let target = Fields::text_section(target_config);
    let target_hidden = target.required_bounded("hidden_size", limits::HIDDEN)?;
    if hidden != target_hidden {
        return Err(Error::Config(format!(
            "the DFlash drafter is {hidden} wide and the target {target_hidden}"
        )));
    }
    let target_layers = target.required_bounded("num_hidden_layers", limits::LAYERS)?;
    if let Some(tap) = taps.iter().find(|&&t| t >= target_layers) {
        return Err(Error::Config(format!(
            "the DFlash drafter reads the target's layer {tap}, and the target has {target_layers}"
        )));
    }
    let vocab = target.required_bounded("vocab_size", limits::VOCAB)?;
    if mask_token >= vocab {
        return Err(Error::Config(format!(
            "the DFlash mask token {mask_token} is outside the target's {vocab}-token vocabulary"
        )));
    }
    Ok(())
}
