//! Qwen2.5-VL (`Qwen2_5_VLForConditionalGeneration`): a Qwen2 decoder whose rotary positions
//! are three-dimensional ("M-RoPE"), behind a dynamic-resolution vision tower
//! ([`crate::vision::qwen2_5_vl`]) whose merged tokens replace the prompt's image tokens
//! (`<|image_pad|>`, one per merged block, between `<|vision_start|>` and `<|vision_end|>`).
//!
//! M-RoPE: each token has a (time, height, width) position, and the head's rotary frequencies
//! are split into three consecutive sections (`mrope_section`, e.g. 16, 24, 24 of 64), each
//! turning with one of them. Text takes the same position on all three axes, one more per
//! token; an image of `h' x w'` merged tokens starting at position `s` gives its token in row
//! `y`, column `x` the position `(s, s + y, s + x)`, and the text after it continues from
//! `s + max(h', w')` (transformers' `get_rope_index`). An image of `h' · w'` tokens thus takes
//! only `max(h', w')` positions, so after images a token's rotary position is its cache
//! position plus a (usually negative) delta; text never changes the delta, so a decode step
//! sits at `cache offset + delta` on all three axes.
//!
//! Engine contract (issue 21; the runner's engine speaks it; text alone has every delta 0,
//! where M-RoPE is plain rope):
//!
//! - Per image: [`Vision::patch_input`] and the processor's pixel budget give its grid before
//!   decoding its pixels (`media::PatchProcessorConfig::grid`), hence its token count
//!   ([`ImageGrid::tokens`]); the prompt lays out that many image tokens;
//!   [`Vision::encode_image_patches`] encodes `media::preprocess_patches`' rows.
//! - Per sequence, the engine keeps the rope delta of the tokens it has cached
//!   ([`Vision::rope_delta`] of its tokens and the grids of its images) and passes it as the
//!   row's [`Batch::rope_deltas`] in every forward: prefill chunks
//!   ([`Vision::forward_rows_with_image_grids`], with the chunk's images' grids), decode steps,
//!   speculative verify and draft forwards alike.
//! - Prefix cache: an image's positions are keyed by its `MediaId`, whose preprocessing key
//!   fixes its grid, so a matched prefix holds the same images at the same places and its
//!   delta is a function of the prefix: a sequence restored to `n` cached tokens recomputes it
//!   from its first `n` tokens and their images (no extra state in the trie). Rollback of
//!   rejected drafts removes text only and leaves it unchanged. Images are never cut across
//!   chunks (their positions depend on their whole grid).
//!
//! References: transformers' `models/qwen2_5_vl/modeling_qwen2_5_vl.py` (5.24:
//! `Qwen2_5_VLModel.get_rope_index`, `Qwen2_5_VLRotaryEmbedding`,
//! `compute_3d_position_ids`); Qwen Team, "Qwen2.5-VL Technical Report" (2025); Wang et al.,
//! "Qwen2-VL" (2024) for M-RoPE.

use kvcache::{LayerCache, LogicalMask};
use mlx::fast::RopeOffset;
use mlx::{Array, Dtype};
use serde_json::Value;

use crate::activation::Activation;
use crate::arch::qwen2;
use crate::attention::{Attention, AttentionParts};
use crate::cached_attention::{attend_cached, check_cache_sets};
use crate::config::{Fields, dim, missing};
use crate::embedding::Embedding;
use crate::linear::Linear;
use crate::mlp::Mlp;
use crate::model::{
    Batch, Forward, ImageGrid, ImageInput, ImagePreprocessing, Model, ModelSpec, PatchInput,
    Vision, check_depth,
};
use crate::rms_norm::RmsNorm;
use crate::rope::AxialRope;
use crate::vision::qwen2_5_vl::{self as tower, VisionModel};
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// The hyperparameters of a Qwen2.5-VL.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The text model's, read as Qwen2's (from `text_config`, or the top level as the released
    /// checkpoints have it).
    pub text: qwen2::Config,
    /// `vision_config`.
    pub vision: tower::Config,
    /// `mrope_section` (in `rope_parameters`, or `rope_scaling` as the released checkpoints
    /// have it): rotary frequencies turning with time, height and width.
    pub mrope_section: [usize; 3],
    /// `image_token_id`: the id image features replace.
    pub image_token_id: u32,
    /// `vision_start_token_id`, when the config names it.
    pub vision_start_token_id: Option<u32>,
    /// `vision_end_token_id`, when the config names it.
    pub vision_end_token_id: Option<u32>,
}

impl Config {
    /// Reads a `Qwen2_5_VLForConditionalGeneration` config in either spelling; what is missing
    /// or does not fit is an error naming the field.
    pub fn from_json(config: &Value) -> Result<Config> {
        let root = Fields { object: config };
        let vision = tower::Config::from_json(
            root.get("vision_config")
                .ok_or_else(|| missing("vision_config"))?,
        )?;
        let text_section = Fields::text_section(config);
        let rope = text_section
            .get("rope_parameters")
            .or_else(|| text_section.get("rope_scaling"))
            .ok_or_else(|| missing("rope_parameters.mrope_section"))?;
        let sections: Vec<usize> = Fields { object: rope }
            .get("mrope_section")
            .and_then(Value::as_array)
            .ok_or_else(|| missing("rope_parameters.mrope_section"))?
            .iter()
            .map(|v| v.as_u64().and_then(|v| usize::try_from(v).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| Error::Config("`mrope_section` holds a non-integer".into()))?;
        let mrope_section: [usize; 3] = sections.try_into().map_err(|s: Vec<usize>| {
            Error::Config(format!("`mrope_section` has {} entries, not 3", s.len()))
        })?;
        // The released configs call the scaling `mrope` (`rope_scaling.type`), which says how
        // positions are laid out, not how frequencies scale: read the rest as default rope.
        let mut plain = config.clone();
        let section = match plain.get_mut("text_config") {
            Some(text) if text.is_object() => text,
            _ => &mut plain,
        };
        if let Some(map) = section.as_object_mut() {
            for key in ["rope_scaling", "rope_parameters"] {
                if let Some(Value::Object(r)) = map.get_mut(key) {
                    let kind = r.get("rope_type").or_else(|| r.get("type"));
                    if kind.and_then(Value::as_str) == Some("mrope") {
                        r.remove("type");
                        r.insert("rope_type".into(), Value::from("default"));
                    }
                }
            }
        }
        let text = qwen2::Config::from_json(&plain)?;
        if 2 * mrope_section.iter().sum::<usize>() != text.head_dim {
            return Err(Error::Config(format!(
                "`mrope_section` {mrope_section:?} does not split the {} rotary frequencies of \
                 a {}-wide head",
                text.head_dim / 2,
                text.head_dim
            )));
        }
        if vision.out_hidden_size != text.hidden_size {
            return Err(Error::Config(format!(
                "vision_config.out_hidden_size = {} differs from the text model's hidden size {}",
                vision.out_hidden_size, text.hidden_size
            )));
        }
        let token = |name: &str| -> Result<Option<u32>> {
            root.usize(name)?
                .map(|v| {
                    u32::try_from(v)
                        .map_err(|_| Error::Config(format!("`{name}` = {v} is not a token id")))
                })
                .transpose()
        };
        Ok(Config {
            text,
            vision,
            mrope_section,
            image_token_id: token("image_token_id")?.ok_or_else(|| missing("image_token_id"))?,
            vision_start_token_id: token("vision_start_token_id")?,
            vision_end_token_id: token("vision_end_token_id")?,
        })
    }

    /// How images enter its prompts: between the vision markers, as many image tokens as
    /// each image's grid gives ([`Config::patch_input`]), so the fixed sizes are 0.
    pub fn image_input(&self) -> ImageInput {
        ImageInput {
            image_size: 0,
            tokens_per_image: 0,
            image_token: self.image_token_id,
            start_token: self.vision_start_token_id,
            end_token: self.vision_end_token_id,
            preprocessing: ImagePreprocessing::Patches,
        }
    }

    /// What the model takes as images.
    pub fn patch_input(&self) -> PatchInput {
        PatchInput {
            patch_size: self.vision.patch_size,
            merge_size: self.vision.spatial_merge_size,
            temporal_patch_size: self.vision.temporal_patch_size,
            patch_len: self.vision.patch_len(),
        }
    }
}

/// Rotary positions `[time, height, width]` of `tokens` whose first sits at text position
/// `start`: text one position further each, each run of `image_token` the images of `grids`
/// in turn (each `grid.tokens(merge)` tokens, the tokens of an `h' x w'` image from `s` at
/// `(s, s + y, s + x)`, the text after it from `s + max(h', w')`); and the text position
/// after them. Fails when the image tokens and the grids do not match one for one.
pub fn rope_index(
    tokens: &[u32],
    image_token: u32,
    grids: &[ImageGrid],
    merge: usize,
    start: i64,
) -> Result<(Vec<[i64; 3]>, i64)> {
    let mut positions = Vec::with_capacity(tokens.len());
    let mut next = start;
    let mut grids = grids.iter();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] != image_token {
            positions.push([next; 3]);
            next += 1;
            i += 1;
            continue;
        }
        let grid = grids.next().ok_or_else(|| {
            Error::InvalidInput(format!("image tokens at {i} without an image grid left"))
        })?;
        let (h, w) = (grid.h / merge.max(1), grid.w / merge.max(1));
        let count = grid.tokens(merge);
        if count == 0 || i + count > tokens.len() {
            return Err(Error::InvalidInput(format!(
                "an image of grid {grid:?} needs {count} image tokens from {i}, the batch has {}",
                tokens.len() - i
            )));
        }
        if let Some(stray) = tokens[i..i + count].iter().position(|&t| t != image_token) {
            return Err(Error::InvalidInput(format!(
                "an image of grid {grid:?} needs {count} image tokens from {i}; token {} is not \
                 one",
                i + stray
            )));
        }
        for t in 0..grid.t {
            for y in 0..h {
                for x in 0..w {
                    positions.push([next + t as i64, next + y as i64, next + x as i64]);
                }
            }
        }
        next += h.max(w) as i64;
        i += count;
    }
    if let Some(left) = grids.next() {
        return Err(Error::InvalidInput(format!(
            "an image grid {left:?} without image tokens"
        )));
    }
    Ok((positions, next))
}

/// One decoder layer: Qwen2's, its rotary positions applied outside the attention block.
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
    sliding_window: Option<usize>,
}

/// A Qwen2.5-VL.
pub struct Qwen25Vl {
    config: Config,
    spec: ModelSpec,
    visual: VisionModel,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: AxialRope,
}

impl Qwen25Vl {
    /// Builds the model from a checkpoint's weights, named as the released checkpoints and
    /// transformers 5.24's `save_pretrained` have them (`visual.…`, `model.layers.…`,
    /// `lm_head`) or by transformers 5's modules (`model.visual.…`,
    /// `model.language_model.…`).
    pub fn new(config: Config, weights: &mut Weights) -> Result<Qwen25Vl> {
        let visual_root = if weights.contains("model.visual.patch_embed.proj.weight") {
            "model.visual"
        } else {
            "visual"
        };
        let root = if weights.contains("model.language_model.embed_tokens.weight") {
            "model.language_model"
        } else {
            "model"
        };
        let visual = VisionModel::new(config.vision.clone(), weights, visual_root)?;
        let c = &config.text;
        let hidden = dim(c.hidden_size, "hidden_size")?;
        let vocab = dim(c.vocab_size, "vocab_size")?;
        let inter = dim(c.intermediate_size, "intermediate_size")?;
        let heads = dim(c.num_attention_heads, "num_attention_heads")?;
        let kv_heads = dim(c.num_key_value_heads, "num_key_value_heads")?;
        let head_dim = dim(c.head_dim, "head_dim")?;
        let eps = c.rms_norm_eps;
        let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(weights.dense(name, &[hidden])?, eps))
        };
        let activation = Activation::from_name(&c.hidden_act)?;
        let embed_name = format!("{root}.embed_tokens.weight");
        let embed_weight = weights.table(&embed_name)?;
        check_matrix(&embed_name, &embed_weight, vocab, hidden)?;
        let embed_tokens = Embedding::new(embed_weight).with_packed(weights.packed(&embed_name)?);
        let mut layers = Vec::with_capacity(c.layer_windows.len());
        for (i, &sliding_window) in c.layer_windows.iter().enumerate() {
            let p = format!("{root}.layers.{i}");
            let a = format!("{p}.self_attn");
            layers.push(DecoderLayer {
                input_layernorm: norm(weights, &format!("{p}.input_layernorm.weight"))?,
                // No rope: M-RoPE is applied between the projections and the cache, below.
                self_attn: AttentionParts::new(
                    weights.linear(&format!("{a}.q_proj"), heads * head_dim, hidden)?,
                    weights.linear(&format!("{a}.k_proj"), kv_heads * head_dim, hidden)?,
                    weights.linear(&format!("{a}.v_proj"), kv_heads * head_dim, hidden)?,
                    weights.linear(&format!("{a}.o_proj"), hidden, heads * head_dim)?,
                    heads,
                    kv_heads,
                    head_dim,
                )
                .build(),
                post_attention_layernorm: norm(
                    weights,
                    &format!("{p}.post_attention_layernorm.weight"),
                )?,
                mlp: Mlp::load(weights, &format!("{p}.mlp"), inter, hidden, activation)?,
                sliding_window,
            });
        }
        let final_norm = norm(weights, &format!("{root}.norm.weight"))?;
        let lm_head =
            embed_tokens.output_head(weights, c.tie_word_embeddings, "lm_head", vocab, hidden)?;
        let rope = AxialRope::sectioned(c.rope.base, head_dim, &config.mrope_section)?;
        Ok(Qwen25Vl {
            spec: c.spec(),
            config,
            visual,
            embed_tokens,
            layers,
            norm: final_norm,
            lm_head,
            rope,
        })
    }

    /// Its hyperparameters.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The vision tower.
    pub fn visual(&self) -> &VisionModel {
        &self.visual
    }

    /// The image tokens `[tokens, hidden]` of images given as patches of `grids`
    /// ([`VisionModel::forward`]).
    pub fn encode_images(&self, patches: &Array, grids: &[ImageGrid]) -> Result<Array> {
        Ok(self.visual.forward(patches, grids)?.merged)
    }

    /// Like [`Model::forward_rows`], with `features` (`[tokens, hidden]`, from
    /// [`Qwen25Vl::encode_images`]) in place of the image tokens' embeddings and the images'
    /// `grids` placing their rotary positions, both row by row in token order; each row's
    /// first token at rotary position `batch.positions[row] + batch.rope_delta(row)`. Fails
    /// when the image tokens, the features and the grids do not match.
    pub fn forward_with_images(
        &self,
        batch: &Batch,
        features: Option<&Array>,
        grids: &[ImageGrid],
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        let (rows, width) = (batch.row_count(), batch.width()?);
        let ids = batch
            .tokens
            .astype(Dtype::I32)?
            .to_vec::<i32>()?
            .into_iter()
            .map(|id| {
                u32::try_from(id)
                    .map_err(|_| Error::InvalidInput(format!("token id {id} is out of range")))
            })
            .collect::<Result<Vec<u32>>>()?;
        let image = self.config.image_token_id;
        let merge = self.config.vision.spatial_merge_size;
        let hidden = dim(self.config.text.hidden_size, "hidden_size")?;
        // Each row's positions, taking its images' grids in turn.
        let mut positions = Vec::with_capacity(rows * width * 3);
        let mut grids_left = grids;
        for (row, row_ids) in ids.chunks(width.max(1)).enumerate() {
            let images = count_runs(row_ids, image, grids_left, merge)?;
            let (mine, rest) = grids_left.split_at(images);
            grids_left = rest;
            let start = start_of(batch, row)?;
            let (row_positions, _) = rope_index(row_ids, image, mine, merge, start)?;
            positions.extend(row_positions.into_iter().flatten());
        }
        if !grids_left.is_empty() {
            return Err(Error::InvalidInput(format!(
                "{} image grids left over after the batch's image tokens",
                grids_left.len()
            )));
        }
        let image_tokens = ids.iter().filter(|&&id| id == image).count();
        let feature_rows = match features {
            None => 0,
            Some(f) => {
                let s = f.shape();
                if s.len() != 2 || s[1] != hidden {
                    return Err(Error::InvalidInput(format!(
                        "image features of shape {s:?}, expected [tokens, {hidden}]"
                    )));
                }
                s[0] as usize
            }
        };
        if image_tokens != feature_rows {
            return Err(Error::InvalidInput(format!(
                "{image_tokens} image tokens in the batch for {feature_rows} rows of image \
                 features"
            )));
        }
        // An image id past the vocabulary is looked up as 0; its row is replaced below.
        let lookup = if (image as usize) < self.config.text.vocab_size || image_tokens == 0 {
            batch.tokens.clone()
        } else {
            let safe: Vec<i32> = ids
                .iter()
                .map(|&id| if id == image { 0 } else { id as i32 })
                .collect();
            Array::from_slice(&safe, &[rows as i32, width as i32])?
        };
        let mut embedded = self.embed_tokens.forward(&lookup)?;
        if let Some(features) = features.filter(|_| image_tokens > 0) {
            // One gather over the text rows followed by the feature rows.
            let total = rows * width;
            let mut next = total;
            let index = ids
                .iter()
                .enumerate()
                .map(|(i, &id)| {
                    let from = if id == image {
                        next += 1;
                        next - 1
                    } else {
                        i
                    };
                    i32::try_from(from)
                        .map_err(|_| Error::InvalidInput(format!("{total} positions are too many")))
                })
                .collect::<Result<Vec<i32>>>()?;
            let flat = embedded.reshape(&[-1, hidden])?;
            let table = mlx::concatenate(&[flat.clone(), features.astype(flat.dtype())?], 0)?;
            embedded = table
                .take(&Array::from_slice(&index, &[index.len() as i32])?, 0)?
                .reshape(&[rows as i32, width as i32, hidden])?;
        }
        let positions = position_array(&positions, rows, width)?;
        self.decode(embedded, &positions, batch, caches, self.layers.len())
    }

    /// The first `layers` decoder layers and the final norm over input embeddings `h`, at
    /// rotary `positions` (`[rows, tokens, 3]`).
    fn decode(
        &self,
        mut h: Array,
        positions: &Array,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
        layers: usize,
    ) -> Result<Forward> {
        check_depth(layers, self.layers.len())?;
        check_cache_sets(batch, caches, self.layers.len())?;
        let (cos, sin) = self.rope.cos_sin(positions)?;
        // [rows, 1, tokens, head_dim]: the same angles for every head.
        let (cos, sin) = (cos.expand_dims(&[1])?, sin.expand_dims(&[1])?);
        for (i, layer) in self.layers.iter().enumerate().take(layers) {
            let x = layer.input_layernorm.forward(&h)?;
            let mut projected = layer.self_attn.project(&x, RopeOffset::Scalar(0))?;
            projected.queries = AxialRope::rotate(&projected.queries, &cos, &sin)?;
            projected.keys = AxialRope::rotate(&projected.keys, &cos, &sin)?;
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
        }
        Ok(Forward {
            hidden: self.norm.forward(&h)?,
            conditioning: None,
        })
    }

    /// Every weight array, for evaluating them once at load.
    pub fn parameters(&self) -> Vec<Array> {
        let mut out = self.visual.parameters();
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

/// The rotary position of row `row`'s first token: its cache position plus its delta.
fn start_of(batch: &Batch, row: usize) -> Result<i64> {
    let position = i64::try_from(batch.positions[row])
        .map_err(|_| Error::InvalidInput("a position is too large".into()))?;
    Ok(position + batch.rope_delta(row))
}

/// How many of `grids` (in order) the runs of `image` in `ids` take.
fn count_runs(ids: &[u32], image: u32, grids: &[ImageGrid], merge: usize) -> Result<usize> {
    let mut tokens = ids.iter().filter(|&&id| id == image).count();
    let mut used = 0;
    while tokens > 0 {
        let grid = grids.get(used).ok_or_else(|| {
            Error::InvalidInput(format!(
                "{tokens} image tokens in a row have no image grid left"
            ))
        })?;
        tokens = tokens.saturating_sub(grid.tokens(merge).max(1));
        used += 1;
    }
    Ok(used)
}

/// `[rows, tokens, 3]` int32 of host positions.
fn position_array(positions: &[i64], rows: usize, width: usize) -> Result<Array> {
    let values = positions
        .iter()
        .map(|&p| {
            i32::try_from(p)
                .map_err(|_| Error::InvalidInput(format!("rotary position {p} is out of range")))
        })
        .collect::<Result<Vec<i32>>>()?;
    Ok(Array::from_slice(&values, &[rows as i32, width as i32, 3])?)
}

/// Text runs through the text model with each row at its cache position plus its rope delta
/// on all three axes (0 for a sequence without images: plain rope).
impl Model for Qwen25Vl {
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
        let (rows, width) = (batch.row_count(), batch.width()?);
        let mut positions = Vec::with_capacity(rows * width * 3);
        for row in 0..rows {
            let start = start_of(batch, row)?;
            for j in 0..width as i64 {
                positions.extend([start + j; 3]);
            }
        }
        let positions = position_array(&positions, rows, width)?;
        let embedded = self.embed_tokens.forward(&batch.tokens)?;
        self.decode(embedded, &positions, batch, caches, layers)
    }

    fn unembed(&self, hidden: &Array) -> Result<Array> {
        self.lm_head.forward(hidden)
    }

    fn parameters(&self) -> Vec<Array> {
        Qwen25Vl::parameters(self)
    }

    fn vision(&self) -> Option<&dyn Vision> {
        Some(self)
    }
}

/// The image side: the dynamic-resolution contract.
impl Vision for Qwen25Vl {
    /// Sizes come from each image's grid ([`Vision::patch_input`]); the fixed fields are 0.
    fn image_input(&self) -> ImageInput {
        self.config.image_input()
    }

    fn encode_images(&self, pixel_values: &Array) -> Result<Array> {
        Err(Error::InvalidInput(format!(
            "Qwen2.5-VL takes images as patches with their grids, not pixel values of shape {:?}",
            pixel_values.shape()
        )))
    }

    fn forward_rows_with_images(
        &self,
        batch: &Batch,
        features: Option<&Array>,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        match features {
            None => self.forward_with_images(batch, None, &[], caches),
            Some(_) => Err(Error::InvalidInput(
                "Qwen2.5-VL needs each image's grid to place it".into(),
            )),
        }
    }

    fn patch_input(&self) -> Option<PatchInput> {
        Some(self.config.patch_input())
    }

    fn encode_image_patches(&self, patches: &Array, grids: &[ImageGrid]) -> Result<Array> {
        self.encode_images(patches, grids)
    }

    fn rope_delta(&self, tokens: &[u32], grids: &[ImageGrid]) -> Result<i64> {
        let merge = self.config.vision.spatial_merge_size;
        let (_, next) = rope_index(tokens, self.config.image_token_id, grids, merge, 0)?;
        Ok(next - tokens.len() as i64)
    }

    fn forward_rows_with_image_grids(
        &self,
        batch: &Batch,
        features: Option<&Array>,
        grids: &[ImageGrid],
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        self.forward_with_images(batch, features, grids, caches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_after_an_image_continues_from_its_widest_side() {
        let grid = ImageGrid { t: 1, h: 4, w: 6 };
        // Two text tokens, a 2x3-token image, one text token.
        let ids = [5, 6, 9, 9, 9, 9, 9, 9, 7];
        let (positions, next) = rope_index(&ids, 9, &[grid], 2, 0).unwrap();
        assert_eq!(positions[..2], [[0; 3], [1; 3]]);
        assert_eq!(positions[2], [2, 2, 2]);
        assert_eq!(positions[4], [2, 2, 4]);
        assert_eq!(positions[5], [2, 3, 2]);
        assert_eq!(positions[8], [5; 3]);
        assert_eq!(next, 6);
        // Nine tokens took six positions.
        let (_, from_three) = rope_index(&ids, 9, &[grid], 2, 3).unwrap();
        assert_eq!(from_three, 9);
    }

    #[test]
    fn image_tokens_and_grids_must_match() {
        let grid = ImageGrid { t: 1, h: 4, w: 4 };
        assert!(rope_index(&[9, 9, 9], 9, &[grid], 2, 0).is_err());
        assert!(rope_index(&[9, 9, 9, 9], 9, &[], 2, 0).is_err());
        assert!(rope_index(&[1, 2], 9, &[grid], 2, 0).is_err());
        assert!(rope_index(&[9, 9, 9, 9, 9, 9, 9, 9], 9, &[grid, grid], 2, 0).is_ok());
    }
}
