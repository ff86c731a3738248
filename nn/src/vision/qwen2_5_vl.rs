//! Qwen2.5-VL's vision transformer: images of any size, each cut by the processor into
//! `patch_size` squares over `temporal_patch_size` frames (`media::preprocess_patches`) and
//! listed block by block (each `spatial_merge_size`² block of neighbouring patches
//! consecutive). A 3-D convolution whose stride is its kernel embeds each patch (here one
//! matrix product over the flattened patch); a 2-D rope turns half of each head's frequencies
//! with the patch's row and half with its column; pre-norm blocks (RMS norms, attention with a
//! fused biased `qkv`, a SwiGLU MLP with biases) attend within windows of
//! `window_size` pixels, except the `fullatt_block_indexes` blocks, which attend over the whole
//! image; a merger (RMS norm, then an MLP over each block's concatenated patches) gives one
//! token per block in the text model's width.
//!
//! Windows: the patches are reordered once, before the first block, so that each window's
//! blocks are consecutive (`window_index`); every block then attends over contiguous segments
//! (windows, or whole images), and the merged tokens are put back in image order at the end.
//! Attention never crosses an image, nor a window in a windowed block, so images of different
//! sizes go through one call.
//!
//! References: transformers' `models/qwen2_5_vl/modeling_qwen2_5_vl.py` and `vision_utils.py`
//! (5.24: `Qwen2_5_VisionTransformerPretrainedModel`, `get_vision_window_index`,
//! `get_vision_position_ids`); Qwen Team, "Qwen2.5-VL Technical Report" (2025).

use mlx::fast::AttentionMask;
use mlx::{Array, Dtype};
use serde_json::Value;

use crate::activation::Activation;
use crate::config::{Fields, dim, limits};
use crate::linear::{Linear, Tensor};
use crate::model::ImageGrid as Grid;
use crate::rms_norm::RmsNorm;
use crate::rope::AxialRope;
use crate::weights::Weights;
use crate::{Error, Result};

/// Most channels, frames or pixels per patch side a config may claim.
const MAX_PATCH: usize = 1024;
/// Most patches one call may take (a 16384² image in 14-pixel patches, four times Qwen2.5-VL's
/// default pixel budget), so that a request cannot size the host-side index tables without
/// bound.
const MAX_PATCHES: usize = 1 << 20;
/// The RMS norms' epsilon, fixed in the reference (not in the config).
const NORM_EPS: f32 = 1e-6;

/// The hyperparameters of the tower (a checkpoint's `vision_config`).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `depth`: blocks.
    pub depth: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size`: the blocks' MLP width.
    pub intermediate_size: usize,
    /// `num_heads`.
    pub num_heads: usize,
    /// `in_channels` (or `in_chans`, the released configs' key; 3 when absent).
    pub in_channels: usize,
    /// `patch_size` (or `spatial_patch_size`).
    pub patch_size: usize,
    /// `temporal_patch_size`.
    pub temporal_patch_size: usize,
    /// `spatial_merge_size`: patches per side of a merged block.
    pub spatial_merge_size: usize,
    /// `window_size`: a window's side in pixels, a multiple of a merged block's.
    pub window_size: usize,
    /// `out_hidden_size`: the merged tokens' width (the text model's).
    pub out_hidden_size: usize,
    /// `fullatt_block_indexes`: blocks that attend over whole images.
    pub fullatt_block_indexes: Vec<usize>,
    /// `hidden_act` of the blocks' MLP (`silu` when absent).
    pub hidden_act: String,
    /// `rope_parameters.rope_theta` (10000 when absent, the base the released checkpoints'
    /// code fixed).
    pub rope_theta: f64,
}

impl Config {
    /// Reads a `vision_config` object; a missing size, or one beyond any real model, is an
    /// error naming the field.
    pub fn from_json(vision_config: &Value) -> Result<Config> {
        let f = Fields {
            object: vision_config,
        };
        let either = |a: &str, b: &str, bound: usize| -> Result<Option<usize>> {
            match f.bounded(a, bound)? {
                Some(v) => Ok(Some(v)),
                None => f.bounded(b, bound),
            }
        };
        let hidden_size = f.required_bounded("hidden_size", limits::HIDDEN)?;
        let num_heads = f.required_bounded("num_heads", limits::HEADS)?;
        if num_heads == 0 || !hidden_size.is_multiple_of(num_heads) {
            return Err(Error::Config(format!(
                "vision_config: {num_heads} heads do not split a hidden size of {hidden_size}"
            )));
        }
        let head_dim = hidden_size / num_heads;
        if !head_dim.is_multiple_of(4) {
            return Err(Error::Config(format!(
                "vision_config: a head of {head_dim} features does not split into two rotary \
                 halves of pairs"
            )));
        }
        let patch_size = either("patch_size", "spatial_patch_size", MAX_PATCH)?
            .ok_or_else(|| crate::config::missing("vision_config.patch_size"))?;
        let spatial_merge_size = f.required_bounded("spatial_merge_size", MAX_PATCH)?;
        let window_size = f.required_bounded("window_size", MAX_PATCH * MAX_PATCH)?;
        let block = patch_size * spatial_merge_size;
        if block == 0 || window_size < block || !window_size.is_multiple_of(block) {
            return Err(Error::Config(format!(
                "vision_config: `window_size` = {window_size} is not a whole number of \
                 {block}-pixel merged blocks"
            )));
        }
        let depth = f.required_bounded("depth", limits::LAYERS)?;
        let fullatt_block_indexes = match f.get("fullatt_block_indexes") {
            None => Vec::new(),
            Some(v) => v
                .as_array()
                .ok_or_else(|| {
                    Error::Config("vision_config: `fullatt_block_indexes` is not a list".into())
                })?
                .iter()
                .map(|i| {
                    i.as_u64()
                        .and_then(|i| usize::try_from(i).ok())
                        .filter(|&i| i < depth)
                        .ok_or_else(|| {
                            Error::Config(format!(
                                "vision_config: `fullatt_block_indexes` holds {i}, not a block \
                                 of {depth}"
                            ))
                        })
                })
                .collect::<Result<_>>()?,
        };
        let rope_theta = match f.get("rope_parameters") {
            Some(p) => Fields { object: p }.f64("rope_theta")?.unwrap_or(10000.0),
            None => 10000.0,
        };
        Ok(Config {
            depth,
            hidden_size,
            intermediate_size: f.required_bounded("intermediate_size", limits::INTERMEDIATE)?,
            num_heads,
            in_channels: either("in_channels", "in_chans", MAX_PATCH)?.unwrap_or(3),
            patch_size,
            temporal_patch_size: f.required_bounded("temporal_patch_size", MAX_PATCH)?,
            spatial_merge_size,
            window_size,
            out_hidden_size: f.required_bounded("out_hidden_size", limits::HIDDEN)?,
            fullatt_block_indexes,
            hidden_act: f.str("hidden_act").unwrap_or("silu").to_string(),
            rope_theta,
        })
    }

    /// Values in one patch row: `in_channels · temporal_patch_size · patch_size²`.
    pub fn patch_len(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Merged blocks per window side.
    fn window_blocks(&self) -> usize {
        self.window_size / (self.patch_size * self.spatial_merge_size)
    }
}

/// The gated feed-forward block (`mlp`), biased: `down(act(gate(x)) · up(x))`.
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    activation: Activation,
}

/// One pre-norm block (`blocks.{i}`).
struct Block {
    norm1: RmsNorm,
    /// `attn.qkv`: queries, keys and values of every head, `[3 · hidden, hidden]`.
    qkv: Linear,
    /// `attn.proj`.
    proj: Linear,
    norm2: RmsNorm,
    mlp: Mlp,
    whole_images: bool,
}

/// The merger (`merger`): RMS norm (`ln_q`), each block's patches concatenated, then
/// `mlp.0`, exact GELU, `mlp.2`.
struct Merger {
    ln_q: RmsNorm,
    fc1: Linear,
    fc2: Linear,
}

/// What the tower computes for a batch of images.
#[derive(Debug, Clone)]
pub struct VisionOutput {
    /// The last block's output, `[patches, hidden]`, in window order (transformers'
    /// `last_hidden_state`).
    pub last_hidden_state: Array,
    /// The merged tokens `[tokens, out_hidden]`, images in order, each's tokens row by row
    /// (transformers' `pooler_output`).
    pub merged: Array,
}

/// Qwen2.5-VL's vision tower.
pub struct VisionModel {
    config: Config,
    dtype: Dtype,
    /// `patch_embed.proj`, its `[hidden, channels, frames, p, p]` kernel flattened.
    patch_embed: Linear,
    rope: AxialRope,
    blocks: Vec<Block>,
    merger: Merger,
    heads: i32,
    head_dim: i32,
}

impl VisionModel {
    /// Builds the tower from transformers-named weights under `prefix` (`visual` in the
    /// released checkpoints, `model.visual` by transformers 5's modules).
    pub fn new(config: Config, weights: &mut Weights, prefix: &str) -> Result<VisionModel> {
        let hidden = dim(config.hidden_size, "vision_config.hidden_size")?;
        let inter = dim(config.intermediate_size, "vision_config.intermediate_size")?;
        let out = dim(config.out_hidden_size, "vision_config.out_hidden_size")?;
        let heads = dim(config.num_heads, "vision_config.num_heads")?;
        let channels = dim(config.in_channels, "vision_config.in_channels")?;
        let frames = dim(
            config.temporal_patch_size,
            "vision_config.temporal_patch_size",
        )?;
        let patch = dim(config.patch_size, "vision_config.patch_size")?;
        let unit = dim(
            config.spatial_merge_size * config.spatial_merge_size,
            "vision_config.spatial_merge_size",
        )?;
        let activation = Activation::from_name(&config.hidden_act)?;
        let head_dim = hidden / heads;
        let norm = |weights: &mut Weights, name: &str, width: i32| -> Result<RmsNorm> {
            Ok(RmsNorm::new(
                weights.dense(&format!("{prefix}.{name}.weight"), &[width])?,
                NORM_EPS,
            ))
        };
        let biased = |weights: &mut Weights, name: &str, out: i32, inp: i32| -> Result<Linear> {
            let p = format!("{prefix}.{name}");
            if !weights.contains(&format!("{p}.bias")) {
                return Err(Error::Weights(format!("tensor `{p}.bias` is missing")));
            }
            weights.linear(&p, out, inp)
        };
        let kernel = weights.dense(
            &format!("{prefix}.patch_embed.proj.weight"),
            &[hidden, channels, frames, patch, patch],
        )?;
        let patch_embed = Linear::new(
            Tensor::Dense(kernel.reshape(&[hidden, channels * frames * patch * patch])?),
            None,
        );
        let mut blocks = Vec::with_capacity(config.depth);
        for i in 0..config.depth {
            let p = format!("blocks.{i}");
            blocks.push(Block {
                norm1: norm(weights, &format!("{p}.norm1"), hidden)?,
                qkv: biased(weights, &format!("{p}.attn.qkv"), 3 * hidden, hidden)?,
                proj: biased(weights, &format!("{p}.attn.proj"), hidden, hidden)?,
                norm2: norm(weights, &format!("{p}.norm2"), hidden)?,
                mlp: Mlp {
                    gate_proj: biased(weights, &format!("{p}.mlp.gate_proj"), inter, hidden)?,
                    up_proj: biased(weights, &format!("{p}.mlp.up_proj"), inter, hidden)?,
                    down_proj: biased(weights, &format!("{p}.mlp.down_proj"), hidden, inter)?,
                    activation,
                },
                whole_images: config.fullatt_block_indexes.contains(&i),
            });
        }
        let merged = hidden * unit;
        let merger = Merger {
            ln_q: norm(weights, "merger.ln_q", hidden)?,
            fc1: biased(weights, "merger.mlp.0", merged, merged)?,
            fc2: biased(weights, "merger.mlp.2", out, merged)?,
        };
        Ok(VisionModel {
            rope: AxialRope::per_axis(config.rope_theta, head_dim / 2, 2)?,
            config,
            dtype: weights.dtype(),
            patch_embed,
            blocks,
            merger,
            heads,
            head_dim,
        })
    }

    /// Its hyperparameters.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Tokens an image of `grid` gives: its patches over the merged block's.
    pub fn tokens(&self, grid: Grid) -> usize {
        grid.tokens(self.config.spatial_merge_size)
    }

    /// The tower over `patches` (`[patches, patch_len]`: the images' rows one image after the
    /// other, as the processor lists them) of images of `grids`. Fails when the rows do not
    /// match the grids, or a grid does not divide into merged blocks.
    pub fn forward(&self, patches: &Array, grids: &[Grid]) -> Result<VisionOutput> {
        let layout = Layout::new(&self.config, grids)?;
        let shape = patches.shape();
        let len = dim(self.config.patch_len(), "vision_config.patch_size")?;
        if shape.len() != 2 || shape[1] != len || shape[0] as usize != layout.patches {
            return Err(Error::InvalidInput(format!(
                "image patches of shape {shape:?}, expected [{}, {len}] for grids {grids:?}",
                layout.patches
            )));
        }
        let unit = (self.config.spatial_merge_size * self.config.spatial_merge_size) as i32;
        let (rows, tokens) = (layout.patches as i32, (layout.patches as i32) / unit);
        // Blocks of `unit` patches move together: the window order permutes merged blocks.
        let order = Array::from_slice(&layout.window_index, &[tokens])?;
        let to_windows = |x: &Array| -> Result<Array> {
            let width = x.dim(-1)?;
            Ok(x.reshape(&[tokens, unit, width])?
                .take(&order, 0)?
                .reshape(&[rows, width])?)
        };
        let h = self.patch_embed.forward(&patches.astype(self.dtype)?)?;
        let mut h = to_windows(&h)?;
        let positions = Array::from_slice(&layout.positions, &[rows, 2])?;
        let (cos, sin) = self.rope.cos_sin(&to_windows(&positions)?)?;
        // [patches, 1, head_dim]: the same angles for every head.
        let (cos, sin) = (cos.expand_dims(&[1])?, sin.expand_dims(&[1])?);
        for block in &self.blocks {
            let segments = if block.whole_images {
                &layout.images
            } else {
                &layout.windows
            };
            let x = block.norm1.forward(&h)?;
            let attended = self.attend(block, &x, &cos, &sin, segments)?;
            h = h.add(&block.proj.forward(&attended)?)?;
            let x = block.norm2.forward(&h)?;
            let mlp = &block.mlp;
            let ff = mlp.down_proj.forward(
                &mlp.activation
                    .gated(&mlp.gate_proj.forward(&x)?, &mlp.up_proj.forward(&x)?)?,
            )?;
            h = h.add(&ff)?;
        }
        let merged_width = self.merger.fc1.out_features()?;
        let m = self
            .merger
            .ln_q
            .forward(&h)?
            .reshape(&[tokens, merged_width])?;
        let m = self.merger.fc1.forward(&m)?.gelu()?;
        let m = self.merger.fc2.forward(&m)?;
        let back = Array::from_slice(&layout.inverse_window_index, &[tokens])?;
        Ok(VisionOutput {
            last_hidden_state: h,
            merged: m.take(&back, 0)?,
        })
    }

    /// Attention of `x` (`[patches, hidden]`, window order) within each of `segments`
    /// (consecutive row ranges): `[patches, hidden]` before the output projection. Runs of
    /// equal-length segments share one call.
    fn attend(
        &self,
        block: &Block,
        x: &Array,
        cos: &Array,
        sin: &Array,
        segments: &[(usize, usize)],
    ) -> Result<Array> {
        let rows = x.dim(0)?;
        let (heads, head_dim) = (self.heads, self.head_dim);
        let qkv = block.qkv.forward(x)?.reshape(&[rows, 3, heads, head_dim])?;
        let mut parts = qkv.split_at(&[1, 2], 1)?.into_iter();
        let (Some(q), Some(k), Some(v)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(Error::InvalidInput("vision qkv did not split".into()));
        };
        let q = AxialRope::rotate(&q.squeeze(&[1])?, cos, sin)?;
        let k = AxialRope::rotate(&k.squeeze(&[1])?, cos, sin)?;
        let v = v.squeeze(&[1])?;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut out = Vec::new();
        let mut i = 0;
        while i < segments.len() {
            let (start, len) = segments[i];
            let mut count = 1;
            while i + count < segments.len() && segments[i + count].1 == len {
                count += 1;
            }
            let (s, n, l) = (start as i32, count as i32, len as i32);
            // [rows, heads, d] → [segments, heads, len, d]
            let take = |a: &Array| -> Result<Array> {
                Ok(a.slice_axis(0, s, s + n * l)?
                    .reshape(&[n, l, heads, head_dim])?
                    .transpose(&[0, 2, 1, 3])?)
            };
            let o = mlx::fast::scaled_dot_product_attention(
                &take(&q)?,
                &take(&k)?,
                &take(&v)?,
                scale,
                AttentionMask::None,
            )?;
            out.push(
                o.transpose(&[0, 2, 1, 3])?
                    .reshape(&[n * l, heads * head_dim])?,
            );
            i += count;
        }
        Ok(mlx::concatenate(&out, 0)?)
    }

    /// Every weight array, for evaluating them once at load.
    pub fn parameters(&self) -> Vec<Array> {
        let mut out = Vec::new();
        self.patch_embed.collect_arrays(&mut out);
        for block in &self.blocks {
            block.norm1.collect_arrays(&mut out);
            block.qkv.collect_arrays(&mut out);
            block.proj.collect_arrays(&mut out);
            block.norm2.collect_arrays(&mut out);
            block.mlp.gate_proj.collect_arrays(&mut out);
            block.mlp.up_proj.collect_arrays(&mut out);
            block.mlp.down_proj.collect_arrays(&mut out);
        }
        self.merger.ln_q.collect_arrays(&mut out);
        self.merger.fc1.collect_arrays(&mut out);
        self.merger.fc2.collect_arrays(&mut out);
        out
    }
}

/// Where every patch of a batch of images goes: host-side index tables.
struct Layout {
    patches: usize,
    /// Each patch's (row, column) in its image, processor order.
    positions: Vec<i32>,
    /// For each merged block in window order, its index in processor order.
    window_index: Vec<i32>,
    /// The inverse permutation.
    inverse_window_index: Vec<i32>,
    /// (first row, rows) of each window, window order.
    windows: Vec<(usize, usize)>,
    /// (first row, rows) of each image.
    images: Vec<(usize, usize)>,
}

impl Layout {
    fn new(config: &Config, grids: &[Grid]) -> Result<Layout> {
        let m = config.spatial_merge_size;
        let unit = m * m;
        let span = config.window_blocks();
        let mut patches = 0usize;
        for g in grids {
            if g.patches() == 0 || !g.h.is_multiple_of(m) || !g.w.is_multiple_of(m) {
                return Err(Error::InvalidInput(format!(
                    "an image grid of {}x{}x{} patches does not divide into {m}x{m} blocks",
                    g.t, g.h, g.w
                )));
            }
            patches = patches.saturating_add(g.patches());
        }
        if grids.is_empty() || patches > MAX_PATCHES {
            return Err(Error::InvalidInput(format!(
                "{patches} image patches in {} images: between 1 and {MAX_PATCHES} patches \
                 needed",
                grids.len()
            )));
        }
        let mut layout = Layout {
            patches,
            positions: Vec::with_capacity(2 * patches),
            window_index: Vec::with_capacity(patches / unit),
            inverse_window_index: vec![0; patches / unit],
            windows: Vec::new(),
            images: Vec::with_capacity(grids.len()),
        };
        let (mut first_block, mut first_row) = (0usize, 0usize);
        for g in grids {
            // Block-major (row, column) of each patch, repeated over frames.
            for _ in 0..g.t {
                for by in 0..g.h / m {
                    for bx in 0..g.w / m {
                        for iy in 0..m {
                            for ix in 0..m {
                                layout.positions.push((by * m + iy) as i32);
                                layout.positions.push((bx * m + ix) as i32);
                            }
                        }
                    }
                }
            }
            // Windows of `span` x `span` blocks, row by row, each frame in turn; partial at the
            // bottom and right edges.
            let (bh, bw) = (g.h / m, g.w / m);
            for t in 0..g.t {
                for wy in 0..bh.div_ceil(span) {
                    for wx in 0..bw.div_ceil(span) {
                        // Rows in window order: every block placed so far, `unit` rows each.
                        let start = layout.window_index.len() * unit;
                        let before = layout.window_index.len();
                        for y in wy * span..((wy + 1) * span).min(bh) {
                            for x in wx * span..((wx + 1) * span).min(bw) {
                                let block = first_block + (t * bh + y) * bw + x;
                                layout.window_index.push(block as i32);
                            }
                        }
                        let len = (layout.window_index.len() - before) * unit;
                        layout.windows.push((start, len));
                    }
                }
            }
            layout.images.push((first_row, g.patches()));
            first_block += g.patches() / unit;
            first_row += g.patches();
        }
        for (at, &block) in layout.window_index.iter().enumerate() {
            layout.inverse_window_index[block as usize] = at as i32;
        }
        Ok(layout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(window_blocks: usize) -> Config {
        Config {
            depth: 1,
            hidden_size: 8,
            intermediate_size: 8,
            num_heads: 1,
            in_channels: 3,
            patch_size: 2,
            temporal_patch_size: 2,
            spatial_merge_size: 2,
            window_size: 4 * window_blocks,
            out_hidden_size: 8,
            fullatt_block_indexes: vec![],
            hidden_act: "silu".into(),
            rope_theta: 10000.0,
        }
    }

    #[test]
    fn windows_cover_each_image_once_in_its_own_rows() {
        // 3x5 blocks in windows of 2x2 blocks: six windows, the edge ones partial; then a
        // second image of 1x1 block.
        let grids = [Grid { t: 1, h: 6, w: 10 }, Grid { t: 1, h: 2, w: 2 }];
        let layout = Layout::new(&config(2), &grids).unwrap();
        let lens: Vec<usize> = layout.windows.iter().map(|w| w.1 / 4).collect();
        assert_eq!(lens, [4, 4, 2, 2, 2, 1, 1]);
        assert_eq!(&layout.window_index[..4], &[0, 1, 5, 6]);
        assert_eq!(&layout.window_index[8..10], &[4, 9]);
        assert_eq!(layout.window_index[15], 15);
        let mut seen = layout.window_index.clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..16).collect::<Vec<i32>>());
        let mut row = 0;
        for &(start, len) in &layout.windows {
            assert_eq!(start, row);
            row += len;
        }
        assert_eq!(layout.images, [(0, 60), (60, 4)]);
        for (at, &block) in layout.window_index.iter().enumerate() {
            assert_eq!(layout.inverse_window_index[block as usize], at as i32);
        }
    }

    #[test]
    fn grids_that_do_not_merge_are_refused() {
        assert!(Layout::new(&config(2), &[Grid { t: 1, h: 3, w: 4 }]).is_err());
        assert!(Layout::new(&config(2), &[]).is_err());
        assert!(
            Layout::new(
                &config(2),
                &[Grid {
                    t: 1,
                    h: 4096,
                    w: 4096
                }]
            )
            .is_err()
        );
    }
}
