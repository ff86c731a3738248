//! Gemma 4's assistant (`Gemma4AssistantForCausalLM`, `model_type: gemma4_assistant`): a small
//! drafter that keeps no cache. Its layers are Gemma 4 decoder layers whose keys and values
//! all come from the target: each attends, with queries of its own, over the cache of the
//! target's last cache-keeping layer of its kind (full, or sliding within the same window).
//!
//! A round starting at position `P` (the target's caches hold `0..P`), where a sliding layer
//! sees the last `sliding_window + 1` of them (transformers' bidirectional window counts
//! distances up to the window inclusive; the target's sliding caches must hold that one
//! position more: [`kvcache::LayerCache::view`]):
//!
//! ```text
//! x     = pre_projection([target_embed(token), state])    state: the target's final state
//!                                                          at P − 1, then the step before's
//! x     = layers(x)                                        queries at P over the target's
//!                                                          keys and values at 0..P
//! out   = norm(x)
//! state = post_projection(out)                             back to the target's width
//! logits = lm_head(out)                                    its own head, tied to its own
//!                                                          embedding (not the target's)
//! ```
//!
//! every step of the round at the same position `P`. With `use_ordered_embeddings`, only the
//! tokens of the `centroid_intermediate_top_k` clusters (of `num_centroids`, a permutation of
//! the vocabulary cut into equal runs) whose centroids score best are scored; every other
//! token gets the least of those scores less one. transformers takes that least over the
//! whole batch; here it is each row's, so a row does not depend on the others (only the
//! unscored tokens' value differs, and drafting reads the argmax). The text config's
//! `final_logit_softcapping` is not applied, as the reference does not.
//!
//! Loading checks the fit: the target's width (`backbone_hidden_size`), vocabulary, and for
//! each kind of layer the width and number of key/value heads the target's cache holds and
//! the sliding window; a mismatch is an error naming it.
//!
//! Reference: transformers' `models/gemma4_assistant/modeling_gemma4_assistant.py` and
//! `generation/candidate_generator.py` (`SinglePositionMultiTokenCandidateGenerator`), 5.24.

use kvcache::LayerCache;
use mlx::{Array, Dtype};
use serde_json::Value;

use super::gemma4::{self, DecoderLayer};
use crate::activation::Activation;
use crate::cached_attention::{BatchPositions, RowHistories};
use crate::config::{Fields, dim, limits};
use crate::embedding::Embedding;
use crate::linear::{Linear, Tensor};
use crate::model::{Assistant, AssistantStep, Batch, LayerState, Model};
use crate::rms_norm::RmsNorm;
use crate::rope::Rope;
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The centroid-masked head (`masked_embedding`).
struct OrderedHead {
    centroids: Linear,
    /// `[num_centroids, vocab / num_centroids]` token ids, int32.
    clusters: Array,
    /// `centroid_intermediate_top_k`.
    top_k: i32,
}

/// A Gemma 4 assistant, fitted to its target.
pub struct Gemma4Assistant {
    text: gemma4::Config,
    pre_projection: Linear,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    post_projection: Linear,
    embed_tokens: Embedding,
    lm_head: Linear,
    ordered: Option<OrderedHead>,
    activation: Activation,
    /// The target's cache slot each kind reads: `[sliding, full]`.
    slots: [Option<usize>; 2],
}

/// Whether `config` is a Gemma 4 assistant's.
pub fn is_assistant(config: &Value) -> bool {
    config.get("model_type").and_then(Value::as_str) == Some("gemma4_assistant")
}

/// Refuses the assistant of `config` for the target of `target_config` when it does not fit
/// (the target's family, width and vocabulary; for each kind of layer the width and number of
/// key/value heads the target's cache holds, and the sliding window), naming what differs:
/// from the configs alone, so `create` checks a pairing before anything is loaded.
pub fn check_fit(config: &Value, target_config: &Value) -> Result<()> {
    let (text, backbone) = read_config(config)?;
    fit(&text, backbone, target_config).map(|_| ())
}

/// The text config and `backbone_hidden_size` of an assistant's `config`.
fn read_config(config: &Value) -> Result<(gemma4::Config, usize)> {
    let f = Fields { object: config };
    if !is_assistant(config) {
        return Err(Error::Config(
            "an assistant's config must say `model_type: gemma4_assistant`".into(),
        ));
    }
    let text_json = f
        .get("text_config")
        .ok_or_else(|| Error::Config("the assistant's config has no `text_config`".into()))?;
    let text = gemma4::Config::for_assistant(text_json)?;
    let backbone = f.required_bounded("backbone_hidden_size", limits::HIDDEN)?;
    Ok((text, backbone))
}

impl Gemma4Assistant {
    /// Reads the assistant of `config` from `weights` for `target` (built from
    /// `target_config`), refusing one that does not fit it ([`check_fit`]).
    pub fn new(
        config: &Value,
        weights: &mut Weights,
        target: &dyn Model,
        target_config: &Value,
    ) -> Result<Gemma4Assistant> {
        let f = Fields { object: config };
        let (text, backbone) = read_config(config)?;
        let slots = fit(&text, backbone, target_config)?;
        if target.input_embeddings().is_none() {
            return Err(Error::Config(format!(
                "`{}` models take no Gemma 4 assistant",
                target.spec().model_type
            )));
        }

        let hidden = dim(text.hidden_size, "hidden_size")?;
        let vocab = dim(text.vocab_size, "vocab_size")?;
        let width = dim(backbone, "backbone_hidden_size")?;
        let activation = Activation::from_name(&text.hidden_activation)?;
        let rope_sliding = Rope::new(&text.rope_sliding)?;
        let rope_full = Rope::new(&text.rope_full)?;
        let mut layers = Vec::with_capacity(text.layers.len());
        for (i, layer) in text.layers.iter().enumerate() {
            let rope = if layer.sliding {
                &rope_sliding
            } else {
                &rope_full
            };
            layers.push(DecoderLayer::load(
                &text,
                layer,
                weights,
                &format!("model.layers.{i}"),
                rope,
                None,
                activation,
            )?);
        }
        let embed_name = "model.embed_tokens.weight";
        let embed_weight = weights.table(embed_name)?;
        check_matrix(embed_name, &embed_weight, vocab, hidden)?;
        let embed_tokens = Embedding::new(embed_weight);
        let tie = f.bool("tie_word_embeddings")?.or(Some(true));
        let lm_head = embed_tokens.output_head(weights, tie, "lm_head", vocab, hidden)?;
        let ordered = match f.bool("use_ordered_embeddings")?.unwrap_or(false) {
            false => {
                weights.set_aside("masked_embedding.");
                None
            }
            true => Some(ordered_head(&f, weights, text.vocab_size, hidden)?),
        };
        Ok(Gemma4Assistant {
            pre_projection: weights.matrix("pre_projection", hidden, 2 * width)?,
            layers,
            norm: RmsNorm::new(
                weights.dense("model.norm.weight", &[hidden])?,
                text.rms_norm_eps,
            ),
            post_projection: weights.matrix("post_projection", width, hidden)?,
            embed_tokens,
            lm_head,
            ordered,
            activation,
            slots,
            text,
        })
    }

    /// The logits of `out` (`[rows, 1, hidden]`).
    fn logits(&self, out: &Array) -> Result<Array> {
        let Some(head) = &self.ordered else {
            return self.lm_head.forward(out);
        };
        let rows = out.dim(0)?;
        // The best clusters: the first `top_k` of a partition of the negated scores.
        let scores = head.centroids.forward(out)?.multiply(-1.0f32)?;
        let best = scores
            .argpartition(head.top_k - 1, -1)?
            .slice_axis(-1, 0, head.top_k)?;
        let per_cluster = head.clusters.dim(1)?;
        let ids = head
            .clusters
            .take(&best, 0)?
            .reshape(&[rows, 1, head.top_k * per_cluster])?;
        // Each chosen token's row of the head, dotted with the state.
        let rows_of = self.embed_tokens.forward(&ids)?.astype(out.dtype())?;
        let scored = rows_of.matmul(&out.expand_dims(&[-1])?)?.squeeze(&[-1])?;
        let floor = scored.min(&[-1], true)?.subtract(1.0f32)?;
        let vocab = dim(self.text.vocab_size, "vocab_size")?;
        let all = Array::zeros(&[rows, 1, vocab], out.dtype())?.add(&floor)?;
        Ok(all.put_along_axis(&ids, &scored, -1)?)
    }
}

impl Assistant for Gemma4Assistant {
    fn draft_step(
        &self,
        target: &dyn Model,
        batch: &Batch,
        conditioning: &Array,
        target_caches: &[&[Option<LayerCache>]],
    ) -> Result<AssistantStep> {
        if batch.width()? != 1 {
            return Err(Error::InvalidInput(
                "an assistant drafts one token per row at a time".into(),
            ));
        }
        if target_caches.len() != batch.positions.len() {
            return Err(Error::InvalidInput(format!(
                "{} rows and {} cache sets",
                batch.positions.len(),
                target_caches.len()
            )));
        }
        let embeddings = target.input_embeddings().ok_or_else(|| {
            Error::InvalidInput("the assistant's target offers no token embedding".into())
        })?;
        let embedded = embeddings.embed(&batch.tokens)?;
        let mut h = self
            .pre_projection
            .forward(&mlx::concatenate(&[embedded, conditioning.clone()], -1)?)?;
        let positions = BatchPositions::new(batch)?;
        // Each row's target caches end where its token stands: the query is the position
        // after the last key it sees.
        for (row, (set, &position)) in target_caches.iter().zip(&batch.positions).enumerate() {
            for slot in self.slots.iter().flatten() {
                let held = set
                    .get(*slot)
                    .and_then(Option::as_ref)
                    .map(LayerCache::offset);
                if held != Some(position) {
                    return Err(Error::InvalidInput(format!(
                        "row {row}: the assistant drafts at position {position}, \
                         but the target's cache holds {}",
                        held.map_or("nothing".into(), |h| format!("{h} positions"))
                    )));
                }
            }
        }
        // A full layer's view is every position; the window applies to sliding ones only.
        let window = self.text.sliding_window + 1;
        let mut histories: [Option<RowHistories>; 2] = [None, None];
        for (kind, slot) in self.slots.iter().enumerate() {
            if let Some(slot) = slot {
                histories[kind] = Some(RowHistories::of_views(target_caches, *slot, window)?);
            }
        }
        for layer in &self.layers {
            let kind = usize::from(!layer.sliding());
            let history = histories[kind].as_ref().ok_or_else(|| {
                Error::InvalidInput("the assistant has no target layer of this kind".into())
            })?;
            let queries = layer.queries(&layer.attention_input(&h)?, positions.rope())?;
            let heads = layer.attend(&queries, history)?;
            h = layer.after_attention(&h, &heads, None, self.activation)?;
        }
        let out = self.norm.forward(&h)?;
        Ok(AssistantStep {
            logits: self.logits(&out)?,
            state: self.post_projection.forward(&out)?,
        })
    }

    fn parameters(&self) -> Vec<Array> {
        let mut out = Vec::new();
        self.pre_projection.collect_arrays(&mut out);
        for layer in &self.layers {
            layer.collect_arrays(&mut out);
        }
        self.norm.collect_arrays(&mut out);
        self.post_projection.collect_arrays(&mut out);
        self.embed_tokens.collect_arrays(&mut out);
        if let Some(head) = &self.ordered {
            head.centroids.collect_arrays(&mut out);
            out.push(head.clusters.clone());
        }
        out
    }
}

/// The target's cache slot each kind of the assistant's layers reads (`[sliding, full]`), or
/// an error naming what does not fit.
fn fit(
    text: &gemma4::Config,
    backbone: usize,
    target_config: &Value,
) -> Result<[Option<usize>; 2]> {
    let spec = crate::registry::describe(target_config)?;
    if !matches!(spec.model_type.as_str(), "gemma4" | "gemma4_text") {
        return Err(Error::Config(format!(
            "a Gemma 4 assistant drafts for Gemma 4 models, not `{}`",
            spec.model_type
        )));
    }
    let target_fields = Fields::text_section(target_config);
    let target_hidden = target_fields.required_bounded("hidden_size", limits::HIDDEN)?;
    if backbone != target_hidden {
        return Err(Error::Config(format!(
            "the assistant was trained for a target `hidden_size` of {backbone}; \
             this model's is {target_hidden}"
        )));
    }
    if text.vocab_size != spec.vocab_size {
        return Err(Error::Config(format!(
            "the assistant scores {} tokens and the target {}",
            text.vocab_size, spec.vocab_size
        )));
    }
    let mut slots = [None, None];
    for (kind, sliding) in [(0, true), (1, false)] {
        let Some(layer) = text.layers.iter().find(|l| l.sliding == sliding) else {
            continue;
        };
        let name = if sliding { "sliding" } else { "full" };
        // The last layer of the kind that keeps a cache: a sliding one keeps a window.
        let found = spec
            .layers
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, l)| match l {
                LayerState::Attention {
                    kv_heads,
                    head_dim,
                    window,
                } if window.is_some() == sliding => Some((i, *kv_heads, *head_dim, *window)),
                _ => None,
            });
        let Some((slot, kv_heads, head_dim, window)) = found else {
            return Err(Error::Config(format!(
                "the assistant's {name} layers read the target's last {name} attention \
                 layer, and the target has none"
            )));
        };
        if (kv_heads, head_dim) != (layer.kv_heads, layer.head_dim) {
            return Err(Error::Config(format!(
                "the assistant's {name} layers read {} key/value heads of width {}; the \
                 target's layer {slot} keeps {kv_heads} of width {head_dim}",
                layer.kv_heads, layer.head_dim
            )));
        }
        if let Some(window) = window.filter(|w| *w != text.sliding_window) {
            return Err(Error::Config(format!(
                "the assistant's sliding window is {} tokens; the target's is {window}",
                text.sliding_window
            )));
        }
        slots[kind] = Some(slot);
    }
    Ok(slots)
}

/// The centroid-masked head: `masked_embedding.centroids` and the vocabulary permutation
/// `masked_embedding.token_ordering`, checked to hold every id once.
fn ordered_head(
    f: &Fields<'_>,
    weights: &mut Weights,
    vocab: usize,
    hidden: i32,
) -> Result<OrderedHead> {
    let centroids = f.required_bounded("num_centroids", limits::VOCAB)?;
    let top_k = f.required_bounded("centroid_intermediate_top_k", limits::VOCAB)?;
    if centroids == 0 || !vocab.is_multiple_of(centroids) || top_k == 0 || top_k > centroids {
        return Err(Error::Config(format!(
            "`num_centroids` = {centroids} must divide the {vocab} tokens, and \
             `centroid_intermediate_top_k` = {top_k} must be between 1 and it"
        )));
    }
    let name = "masked_embedding.token_ordering";
    let ordering = match weights.stored(name)? {
        Tensor::Dense(a) => a.astype(Dtype::I32)?,
        Tensor::Quantized(_) | Tensor::KBlocks(_) => {
            return Err(Error::Weights(format!("`{name}` is quantized")));
        }
    };
    let ids: Vec<i32> = ordering.to_vec()?;
    let mut seen = vec![false; vocab];
    for &id in &ids {
        match usize::try_from(id).ok().and_then(|i| seen.get_mut(i)) {
            Some(slot) if !*slot => *slot = true,
            _ => {
                return Err(Error::Weights(format!(
                    "`{name}` must hold every token id below {vocab} once; it holds {id}"
                )));
            }
        }
    }
    if ids.len() != vocab {
        return Err(Error::Weights(format!(
            "`{name}` holds {} ids for {vocab} tokens",
            ids.len()
        )));
    }
    let per_cluster = dim(vocab / centroids, "tokens per centroid")?;
    Ok(OrderedHead {
        centroids: weights.matrix(
            "masked_embedding.centroids",
            dim(centroids, "num_centroids")?,
            hidden,
        )?,
        clusters: ordering.reshape(&[dim(centroids, "num_centroids")?, per_cluster])?,
        top_k: dim(top_k, "centroid_intermediate_top_k")?,
    })
}
