//! Llama 2 and 3, and the checkpoints that call themselves `llama` (SmolLM2, …): a pre-norm
//! decoder of grouped-query attention with rotary positions and a SwiGLU MLP, each behind an
//! RMS norm. Llama 3.1 stretches the rope's low frequencies (`rope_scaling` of type `llama3`);
//! the output head is the embedding table or a matrix of its own (`tie_word_embeddings`, or
//! whether the checkpoint has `lm_head`). Attention biases are read when the checkpoint has
//! them (`attention_bias`). A multi-token-prediction head is read when the weights carry
//! `mtp.*` (one trained for a catalog model and attached at load: `nn::load`), with a decoder
//! layer of the model's own shape.
//!
//! References: transformers' `models/llama/modeling_llama.py` (5.24); Touvron et al., "Llama 2:
//! Open Foundation and Fine-Tuned Chat Models" (2023); Grattafiori et al., "The Llama 3 Herd of
//! Models" (2024).

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
use crate::model::{
    Batch, DraftHead, Forward, InputEmbeddings, LayerState, Model, ModelSpec, check_depth,
};
use crate::mtp_head::{HeadLayer, HeadNames, MtpHead};
use crate::pipeline_parallel::{PipelineStage, run_decoder};
use crate::rms_norm::RmsNorm;
use crate::rope::{Rope, RopeConfig};
use crate::taps::Taps;
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The hyperparameters of a Llama model.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `model_type`.
    pub model_type: String,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `num_hidden_layers`.
    pub num_hidden_layers: usize,
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
    /// The rotary embedding: `rope_parameters`, or `rope_theta` and `rope_scaling`.
    pub rope: RopeConfig,
    /// `hidden_act`.
    pub hidden_act: String,
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
        Ok(Config {
            model_type,
            hidden_size,
            num_hidden_layers,
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
        })
    }

    /// What the engine needs to know of the model.
    pub fn spec(&self) -> ModelSpec {
        ModelSpec {
            model_type: self.model_type.clone(),
            vocab_size: self.vocab_size,
            context_length: self.max_position_embeddings,
            layers: vec![
                LayerState::Attention {
                    kv_heads: self.num_key_value_heads,
                    head_dim: self.head_dim,
                    window: None,
                };
                self.num_hidden_layers
            ],
        }
    }
}

/// One decoder layer: pre-norm attention and a pre-norm MLP, each added to the residual
/// stream.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

/// A Llama model.
pub struct Llama {
    spec: ModelSpec,
    /// `hidden_size`, the width of the input embeddings.
    hidden: i32,
    /// The dtype it computes in.
    dtype: mlx::Dtype,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    mtp: Option<MtpHead<DecoderLayer>>,
    /// The layers whose outputs a forward offers a block drafter ([`Model::tap_layers`]).
    taps: Taps,
    /// This rank's range of the layers when they are split across a pipeline: `layers` holds
    /// only those, from the range's start on.
    stage: Option<PipelineStage>,
}

impl Llama {
    /// Builds the model from transformers-named weights.
    pub fn new(config: Config, weights: &mut Weights) -> Result<Llama> {
        let hidden = dim(config.hidden_size, "hidden_size")?;
        let vocab = dim(config.vocab_size, "vocab_size")?;
        let inter = dim(config.intermediate_size, "intermediate_size")?;
        let eps = config.rms_norm_eps;
        let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(weights.dense(name, &[hidden])?, eps))
        };
        let activation = Activation::from_name(&config.hidden_act)?;
        let stage = weights.pipeline_stage().cloned();
        // A pipeline's later stages neither embed nor unembed: they hold no table, and a
        // row of zeros stands in for it (never read; see `forward_rows_through`).
        let ends_here = stage.as_ref().is_none_or(PipelineStage::holds_ends);
        let embed_name = "model.embed_tokens.weight";
        let embed_tokens = if ends_here {
            let embed_weight = weights.table(embed_name)?;
            check_matrix(embed_name, &embed_weight, vocab, hidden)?;
            Embedding::new(embed_weight).with_packed(weights.packed(embed_name)?)
        } else {
            weights.set_aside("model.embed_tokens.");
            weights.set_aside("lm_head.");
            Embedding::dense(Array::zeros(&[1, hidden], weights.dtype())?)
        };
        let rope = Rope::new(&config.rope)?;

        let layer = |weights: &mut Weights, p: &str| -> Result<DecoderLayer> {
            Ok(DecoderLayer {
                input_layernorm: norm(weights, &format!("{p}.input_layernorm.weight"))?,
                self_attn: attention(&config, weights, &format!("{p}.self_attn"), &rope)?,
                post_attention_layernorm: norm(
                    weights,
                    &format!("{p}.post_attention_layernorm.weight"),
                )?,
                mlp: Mlp::load(weights, &format!("{p}.mlp"), inter, hidden, activation)?,
            })
        };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            if weights.is_another_stages(i, &format!("model.layers.{i}.")) {
                continue;
            }
            layers.push(layer(weights, &format!("model.layers.{i}"))?);
        }
        if stage.is_some() {
            // A pipeline drafts with no head yet: the head would run where the states end.
            weights.set_aside("mtp.");
        }
        let mtp = if stage.is_none() && HeadNames::mtp().present(weights) {
            let cache = LayerState::Attention {
                kv_heads: config.num_key_value_heads,
                head_dim: config.head_dim,
                window: None,
            };
            Some(MtpHead::load(
                weights,
                &HeadNames::mtp(),
                &embed_tokens,
                hidden,
                cache,
                norm,
                layer,
            )?)
        } else {
            None
        };
        let final_norm = norm(weights, "model.norm.weight")?;
        let lm_head = if ends_here {
            embed_tokens.output_head(
                weights,
                config.tie_word_embeddings,
                "lm_head",
                vocab,
                hidden,
            )?
        } else {
            embed_tokens.as_linear()
        };
        let mut spec = config.spec();
        if let Some(stage) = &stage {
            stage.keep_own_caches(&mut spec);
        }
        Ok(Llama {
            spec,
            hidden,
            dtype: weights.dtype(),
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
            mtp,
            taps: Taps::default(),
            stage,
        })
    }
}

/// The attention block (`self_attn`): grouped-query attention over rotated queries and keys.
fn attention(c: &Config, weights: &mut Weights, p: &str, rope: &Rope) -> Result<Attention> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let heads = dim(c.num_attention_heads, "num_attention_heads")?;
    let kv_heads = dim(c.num_key_value_heads, "num_key_value_heads")?;
    let head_dim = dim(c.head_dim, "head_dim")?;
    Ok(
        AttentionParts::load(weights, p, hidden, (heads, kv_heads, head_dim))?
            .with_rope(rope.clone())
            .build(),
    )
}

impl Model for Llama {
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
        let embedded = match &self.stage {
            Some(stage) if !stage.holds_ends() => {
                PipelineStage::states_like(&batch.tokens, self.hidden, self.dtype)?
            }
            _ => self.embed_tokens.forward(&batch.tokens)?,
        };
        self.run_layers(embedded, batch, caches, layers)
    }

    fn unembed(&self, hidden: &Array) -> Result<Array> {
        if self.stage.as_ref().is_some_and(|s| !s.holds_ends()) {
            return Err(Error::InvalidInput(
                "a later pipeline stage holds no head: rank 0 unembeds".into(),
            ));
        }
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

    fn input_embeddings(&self) -> Option<&dyn InputEmbeddings> {
        Some(self)
    }

    fn draft_head(&self) -> Option<&dyn DraftHead> {
        self.mtp.as_ref().map(|mtp| mtp as &dyn DraftHead)
    }

    fn tap_layers(&mut self, layers: &[usize]) -> Result<()> {
        self.taps.set(layers, self.spec.layers.len())
    }
}

/// LLaVA's text model: image features take the image tokens' places before the first layer.
impl InputEmbeddings for Llama {
    fn embed(&self, tokens: &Array) -> Result<Array> {
        self.embed_tokens.forward(tokens)
    }

    fn forward_rows_embedded(
        &self,
        embedded: &Array,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        let (rows, width) = (batch.row_count(), batch.width()?);
        let shape = embedded.shape();
        let hidden = self.hidden;
        if shape.len() != 3
            || usize::try_from(shape[0]) != Ok(rows)
            || usize::try_from(shape[1]) != Ok(width)
            || shape[2] != hidden
        {
            return Err(Error::InvalidInput(format!(
                "input embeddings of shape {shape:?} for a batch of {rows} rows of {width} \
                 tokens, expected [{rows}, {width}, {hidden}]"
            )));
        }
        self.run_layers(embedded.clone(), batch, caches, self.spec.layers.len())
    }
}

impl Llama {
    /// The first `layers` layers and the final norm over `h`, the batch's input embeddings.
    fn run_layers(
        &self,
        h: Array,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
        layers: usize,
    ) -> Result<Forward> {
        check_depth(layers, self.spec.layers.len())?;
        check_cache_sets(batch, caches, self.spec.layers.len())?;
        let positions = BatchPositions::new(batch)?;
        let mut tapped = self.taps.record();
        let hidden = run_decoder(
            self.stage.as_ref(),
            h,
            &self.layers,
            layers,
            self.spec.layers.len(),
            |layer, h, i| {
                let h = layer.forward(&h, caches, i, batch, &positions)?;
                tapped.layer(i, &h);
                Ok(h)
            },
            |h| self.norm.forward(h),
        )?;
        Ok(Forward {
            hidden,
            conditioning: tapped.conditioning()?,
        })
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
        let projected = self.self_attn.project(&x, positions.rope())?;
        let attended = attend_cached(
            &self.self_attn,
            &projected,
            caches,
            index,
            &batch.positions,
            LogicalMask::Causal,
        )?;
        let h = h.add(&attended)?;
        let ff = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&h)?)?;
        Ok(h.add(&ff)?)
    }

    fn collect_arrays(&self, out: &mut Vec<Array>) {
        self.input_layernorm.collect_arrays(out);
        self.self_attn.collect_arrays(out);
        self.post_attention_layernorm.collect_arrays(out);
        self.mlp.collect_arrays(out);
    }
}
