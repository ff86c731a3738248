//! Gemma 3 (text): Gemma 2's decoder with per-head RMS norms of queries and keys before
//! rotation. Sliding-window layers outnumber global ones (five to one in the releases:
//! `layer_types`, or in older configs every `sliding_window_pattern`-th layer global), and each
//! kind turns its rope on a base of its own (`rope_parameters.{full,sliding}_attention`, or
//! `rope_theta` and `rope_local_base_freq`). Sandwich norms around attention and MLP, GeGLU,
//! embeddings scaled by `√hidden`, attention scaled by `query_pre_attn_scalar^-½`, output
//! logits soft-capped when `final_logit_softcapping` is set. Norms store `w − 1`.
//!
//! A multimodal checkpoint (`Gemma3ForConditionalGeneration`) loads here as its text model, its
//! vision tower and projector set aside; [`super::gemma3_multimodal`] runs them.
//!
//! References: transformers' `models/gemma3/modeling_gemma3.py` (5.24); Gemma Team, "Gemma 3
//! Technical Report" (2025).

use kvcache::{LayerCache, LogicalMask};
use mlx::Array;
use serde_json::Value;

use crate::activation::Activation;
use crate::attention::{Attention, AttentionParts};
use crate::cached_attention::{
    BatchPositions, TokenBlocks, attend_cached, attend_cached_blocks, check_cache_sets,
};
use crate::config::{Fields, dim, limits, missing, model_type, read_rope, tie_word_embeddings};
use crate::embedding::Embedding;
use crate::linear::Linear;
use crate::mlp::Mlp;
use crate::model::{Batch, Forward, LayerState, Model, ModelSpec, check_depth};
use crate::pipeline_parallel::{PipelineStage, run_decoder};
use crate::rms_norm::RmsNorm;
use crate::rope::{Rope, RopeConfig, RopeScaling};
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The hyperparameters of a Gemma 3 text model.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `model_type`.
    pub model_type: String,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size`.
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
    /// The rotary embedding of global layers: `rope_parameters.full_attention`, or
    /// `rope_theta` and `rope_scaling`.
    pub rope: RopeConfig,
    /// The rotary embedding of sliding layers: `rope_parameters.sliding_attention`, or
    /// `rope_local_base_freq`; `None` when no layer slides.
    pub rope_local: Option<RopeConfig>,
    /// `query_pre_attn_scalar` (`head_dim` when absent).
    pub query_pre_attn_scalar: Option<f64>,
    /// `attn_logit_softcapping`.
    pub attn_logit_softcapping: Option<f32>,
    /// `final_logit_softcapping`; `None` in a multimodal checkpoint whatever its text section
    /// says, as transformers' `Gemma3ForConditionalGeneration` never applies it (5.24; the
    /// released Gemma 3 configs leave it unset anyway).
    pub final_logit_softcapping: Option<f32>,
    /// `hidden_activation` (or `hidden_act`).
    pub hidden_activation: String,
    /// `layer_types` (or `sliding_window_pattern`) and `sliding_window`: each layer's window,
    /// `None` on global layers.
    pub layer_windows: Vec<Option<usize>>,
}

impl Config {
    /// Reads the config (or its `text_config`).
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
        let (rope, nested_local) = read_rope(&f, dim(head_dim, "head_dim")?)?;
        let sliding = match f.layer_types(num_hidden_layers)? {
            Some(sliding) => sliding,
            None => {
                let pattern = match f.usize("sliding_window_pattern")? {
                    Some(p) => Some(p),
                    None => f.usize("_sliding_window_pattern")?,
                };
                (0..num_hidden_layers)
                    .map(|i| matches!(pattern, Some(p) if p > 0 && !(i + 1).is_multiple_of(p)))
                    .collect()
            }
        };
        let layer_windows = f.layer_windows(&sliding)?;
        let rope_local = match nested_local {
            _ if !sliding.contains(&true) => None,
            Some(local) => Some(local),
            None => Some(RopeConfig {
                base: f
                    .f64("rope_local_base_freq")?
                    .ok_or_else(|| missing("rope_local_base_freq"))?,
                dims: rope.dims,
                traditional: false,
                scaling: RopeScaling::None,
            }),
        };
        let query_pre_attn_scalar = f.f64("query_pre_attn_scalar")?;
        if let Some(s) = query_pre_attn_scalar.filter(|s| *s <= 0.0) {
            return Err(Error::Config(format!(
                "query_pre_attn_scalar must be positive, got {s}"
            )));
        }
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
            rope,
            rope_local,
            query_pre_attn_scalar,
            attn_logit_softcapping: f.f64("attn_logit_softcapping")?.map(|c| c as f32),
            final_logit_softcapping: match config.get("text_config") {
                Some(_) => None,
                None => f.f64("final_logit_softcapping")?.map(|c| c as f32),
            },
            hidden_activation: f
                .str("hidden_activation")
                .or_else(|| f.str("hidden_act"))
                .unwrap_or("gelu_pytorch_tanh")
                .to_string(),
            layer_windows,
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

/// One decoder layer with sandwich norms: attention and MLP each normed before and after, and
/// added to the residual stream.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    mlp: Mlp,
    post_feedforward_layernorm: RmsNorm,
    sliding_window: Option<usize>,
}

/// A Gemma 3 text model.
pub struct Gemma3 {
    spec: ModelSpec,
    config: Config,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    /// This rank's range of the layers when they are split across a pipeline: `layers` holds
    /// only those, from the range's start on.
    stage: Option<PipelineStage>,
}

/// Where a checkpoint keeps the text decoder and its head: `model.…` (text only),
/// `language_model.model.…` (a multimodal checkpoint as Google published Gemma 3 and as
/// transformers saves it, 4 and 5.24 alike) or `model.language_model.…` (transformers 5's
/// module names); the head, when untied, is `lm_head` or `language_model.lm_head`.
pub(crate) fn text_root(weights: &Weights) -> (&'static str, &'static str) {
    let root = ["model.language_model", "language_model.model"]
        .into_iter()
        .find(|root| weights.contains(&format!("{root}.embed_tokens.weight")))
        .unwrap_or("model");
    let head = if weights.contains("language_model.lm_head.weight") {
        "language_model.lm_head"
    } else {
        "lm_head"
    };
    (root, head)
}

impl Gemma3 {
    /// Builds the model from transformers-named weights: a text checkpoint's, or a multimodal
    /// one's text decoder, with everything under its vision tower and projector set aside.
    pub fn new(config: Config, weights: &mut Weights) -> Result<Gemma3> {
        let hidden = dim(config.hidden_size, "hidden_size")?;
        let vocab = dim(config.vocab_size, "vocab_size")?;
        let inter = dim(config.intermediate_size, "intermediate_size")?;
        let eps = config.rms_norm_eps;
        let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
            RmsNorm::with_unit_offset(weights.dense(name, &[hidden])?, eps)
        };
        let activation = Activation::from_name(&config.hidden_activation)?;
        let (root, head) = text_root(weights);
        for tower in [
            "model.vision_tower.",
            "model.multi_modal_projector.",
            "vision_tower.",
            "multi_modal_projector.",
        ] {
            weights.set_aside(tower);
        }
        let embed_name = format!("{root}.embed_tokens.weight");
        let embed_weight = weights.table(&embed_name)?;
        check_matrix(&embed_name, &embed_weight, vocab, hidden)?;
        let embed_tokens = Embedding::new(embed_weight).with_packed(weights.packed(&embed_name)?);
        let rope = Rope::new(&config.rope)?;
        let rope_local = config.rope_local.as_ref().map(Rope::new).transpose()?;

        let stage = weights.pipeline_stage().cloned();
        let mut layers = Vec::with_capacity(config.layer_windows.len());
        for (i, &sliding_window) in config.layer_windows.iter().enumerate() {
            let p = format!("{root}.layers.{i}");
            if weights.is_another_stages(i, &format!("{p}.")) {
                continue;
            }
            let layer_rope = match (sliding_window, &rope_local) {
                (Some(_), Some(local)) => local,
                _ => &rope,
            };
            layers.push(DecoderLayer {
                input_layernorm: norm(weights, &format!("{p}.input_layernorm.weight"))?,
                self_attn: attention(&config, weights, &format!("{p}.self_attn"), layer_rope)?,
                post_attention_layernorm: norm(
                    weights,
                    &format!("{p}.post_attention_layernorm.weight"),
                )?,
                pre_feedforward_layernorm: norm(
                    weights,
                    &format!("{p}.pre_feedforward_layernorm.weight"),
                )?,
                mlp: Mlp::load(weights, &format!("{p}.mlp"), inter, hidden, activation)?,
                post_feedforward_layernorm: norm(
                    weights,
                    &format!("{p}.post_feedforward_layernorm.weight"),
                )?,
                sliding_window,
            });
        }
        let final_norm = norm(weights, &format!("{root}.norm.weight"))?;
        let lm_head =
            embed_tokens.output_head(weights, config.tie_word_embeddings, head, vocab, hidden)?;
        let mut spec = config.spec();
        if let Some(stage) = &stage {
            stage.keep_own_caches(&mut spec);
        }
        Ok(Gemma3 {
            spec,
            config,
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
            stage,
        })
    }
}

impl Gemma3 {
    /// Its hyperparameters.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The input embeddings of `tokens` (`[rows, tokens]` ids): rows of the table scaled by
    /// `√hidden`, `[rows, tokens, hidden]`.
    pub fn embed(&self, tokens: &Array) -> Result<Array> {
        Ok(self
            .embed_tokens
            .forward(tokens)?
            .multiply((self.config.hidden_size as f32).sqrt())?)
    }

    /// Like [`Model::forward_rows`] from input embeddings already made (`[rows, tokens,
    /// hidden]`, in place of `batch.tokens`, which only its shape is read from): the text of
    /// [`Gemma3::embed`] with other features placed among it, such as an image's. Tokens in
    /// one of `blocks` also see their block's later tokens, in every layer (within the
    /// window, in sliding ones).
    pub fn forward_embedded(
        &self,
        embedded: Array,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
        blocks: Option<&TokenBlocks>,
    ) -> Result<Forward> {
        let expected = [
            batch.tokens.dim(0)?,
            batch.tokens.dim(1)?,
            dim(self.config.hidden_size, "hidden_size")?,
        ];
        if embedded.shape() != expected {
            return Err(Error::InvalidInput(format!(
                "input embeddings of shape {:?} for a batch needing {expected:?}",
                embedded.shape()
            )));
        }
        self.decode(embedded, batch, caches, self.spec.layers.len(), blocks)
    }

    /// The first `layers` decoder layers and the final norm over input embeddings `h`.
    fn decode(
        &self,
        h: Array,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
        layers: usize,
        blocks: Option<&TokenBlocks>,
    ) -> Result<Forward> {
        check_depth(layers, self.spec.layers.len())?;
        check_cache_sets(batch, caches, self.spec.layers.len())?;
        let positions = BatchPositions::new(batch)?;
        let blocks = blocks.filter(|b| !b.is_empty());
        if self.stage.is_some() && blocks.is_some() {
            return Err(Error::InvalidInput(
                "a pipeline stage runs text only".into(),
            ));
        }
        let hidden = run_decoder(
            self.stage.as_ref(),
            h,
            &self.layers,
            layers,
            self.spec.layers.len(),
            |layer, h, i| layer.forward(&h, caches, i, batch, &positions, blocks),
            |h| self.norm.forward(h),
        )?;
        Ok(Forward {
            hidden,
            conditioning: None,
        })
    }
}

impl DecoderLayer {
    /// Layer `index` of the model over `h`, its caches in `caches`; `blocks`: the spans of
    /// image tokens that attend both ways.
    fn forward(
        &self,
        h: &Array,
        caches: &mut [&mut [Option<LayerCache>]],
        index: usize,
        batch: &Batch,
        positions: &BatchPositions,
        blocks: Option<&TokenBlocks>,
    ) -> Result<Array> {
        let x = self.input_layernorm.forward(h)?;
        let projected = self.self_attn.project(&x, positions.rope())?;
        let logical = match self.sliding_window {
            Some(window) => LogicalMask::SlidingWindow(window),
            None => LogicalMask::Causal,
        };
        let (attention, rows) = (&self.self_attn, &batch.positions);
        let attended = match blocks {
            Some(blocks) => {
                attend_cached_blocks(attention, &projected, caches, index, rows, logical, blocks)?
            }
            None => attend_cached(attention, &projected, caches, index, rows, logical)?,
        };
        let h = h.add(&self.post_attention_layernorm.forward(&attended)?)?;
        let ff = self
            .mlp
            .forward(&self.pre_feedforward_layernorm.forward(&h)?)?;
        Ok(h.add(&self.post_feedforward_layernorm.forward(&ff)?)?)
    }
}

/// The attention block (`self_attn`): queries and keys normed per head, then rotated, and
/// scaled by `query_pre_attn_scalar^-½`.
fn attention(c: &Config, weights: &mut Weights, p: &str, rope: &Rope) -> Result<Attention> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let heads = dim(c.num_attention_heads, "num_attention_heads")?;
    let kv_heads = dim(c.num_key_value_heads, "num_key_value_heads")?;
    let head_dim = dim(c.head_dim, "head_dim")?;
    let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
        let stored = weights.dense(&format!("{p}.{name}.weight"), &[head_dim])?;
        RmsNorm::with_unit_offset(stored, c.rms_norm_eps)
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
    .with_scale(match c.query_pre_attn_scalar {
        Some(s) => (1.0 / s.sqrt()) as f32,
        None => 1.0 / (head_dim as f32).sqrt(),
    })
    .with_logit_softcap(c.attn_logit_softcapping)
    .build())
}

impl Model for Gemma3 {
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
        let embedded = self.embed(&batch.tokens)?;
        self.decode(embedded, batch, caches, layers, None)
    }

    fn unembed(&self, hidden: &Array) -> Result<Array> {
        let logits = self.lm_head.forward(hidden)?;
        Ok(match self.config.final_logit_softcapping {
            Some(cap) => logits.divide(cap)?.tanh()?.multiply(cap)?,
            None => logits,
        })
    }

    fn parameters(&self) -> Vec<Array> {
        let mut out = Vec::new();
        self.embed_tokens.collect_arrays(&mut out);
        for layer in &self.layers {
            for norm in [
                &layer.input_layernorm,
                &layer.post_attention_layernorm,
                &layer.pre_feedforward_layernorm,
                &layer.post_feedforward_layernorm,
            ] {
                norm.collect_arrays(&mut out);
            }
            layer.self_attn.collect_arrays(&mut out);
            layer.mlp.collect_arrays(&mut out);
        }
        self.norm.collect_arrays(&mut out);
        self.lm_head.collect_arrays(&mut out);
        out
    }
}
