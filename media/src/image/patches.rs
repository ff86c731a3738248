//! Dynamic-resolution preprocessing for encoders that take an image of any size as a list of
//! flattened patches (Qwen2-VL, Qwen2.5-VL): the image is resized to the nearest patch-aligned
//! size within a pixel budget ([`smart_resize`]), rescaled and normalized, then cut into
//! `patch_size` squares, each repeated `temporal_patch_size` times (a still image is a video
//! of identical frames to the encoder's 3-D patch embedding) and flattened in the order of the
//! embedding's kernel, `(channel, frame, row, column)`. Patches are listed block by block:
//! each `merge_size` x `merge_size` block of neighbouring patches, which the encoder merges
//! into one token, is consecutive, blocks row by row.
//!
//! Reference: transformers' `models/qwen2_vl/image_processing_qwen2_vl.py` (5.24,
//! `Qwen2VLImageProcessor`: `smart_resize`, `patchify`); checked against it in
//! `tests/hf_preprocess.rs`.

use image::RgbImage;

use crate::error::{Error, Result};
use crate::image::preprocess::{Fit, ImageProcessorConfig, PixelValues, preprocess};
use crate::image::resize::{Resample, ResizeBackend};
use crate::image::tiling::smart_resize;

/// Largest `max_pixels` a config may ask for: 8192 x 8192, far above any released model's
/// budget (Qwen2.5-VL's is 12,845,056), so that a config cannot size a buffer beyond reason.
const MAX_PIXEL_BUDGET: u64 = 1 << 26;
/// Largest patch side, merge size or frame count a config may ask for.
const MAX_PATCH_PARAMETER: u32 = 1024;

/// How a dynamic-resolution processor turns an image into patches (the keys of its
/// `preprocessor_config.json`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PatchProcessorConfig {
    /// `patch_size`: the side of a square patch in pixels.
    pub patch_size: u32,
    /// `merge_size`: patches per side of the block the encoder merges into one token.
    pub merge_size: u32,
    /// `temporal_patch_size`: frames per patch; a still image is repeated this many times.
    pub temporal_patch_size: u32,
    /// `min_pixels` (or `size.shortest_edge`): the least area the image is resized to.
    pub min_pixels: u64,
    /// `max_pixels` (or `size.longest_edge`): the most area the image is resized to.
    pub max_pixels: u64,
    /// Resize filter (`resample: 3`, bicubic, in Qwen's configs).
    pub resample: Resample,
    /// Whose fixed-point resize to reproduce.
    pub backend: ResizeBackend,
    /// Multiplier taking `u8` to the model's range, usually `1/255` (see
    /// [`ImageProcessorConfig::rescale_factor`]).
    pub rescale_factor: f64,
    /// Per-channel mean subtracted after rescaling.
    pub image_mean: [f32; 3],
    /// Per-channel standard deviation divided by after subtracting the mean.
    pub image_std: [f32; 3],
}

/// An image's size in patches: transformers' `image_grid_thw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PatchGrid {
    /// Frames, in units of `temporal_patch_size` (1 for a still image).
    pub t: u32,
    /// Patches down.
    pub h: u32,
    /// Patches across.
    pub w: u32,
}

impl PatchGrid {
    /// Patches in the grid: the encoder's input rows.
    pub fn patches(self) -> usize {
        self.t as usize * self.h as usize * self.w as usize
    }

    /// Tokens the encoder gives once `merge` x `merge` blocks are merged: the image's tokens
    /// in the prompt.
    pub fn tokens(self, merge: u32) -> usize {
        let merge = merge.max(1) as usize;
        self.patches() / (merge * merge)
    }
}

/// An image as its encoder takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct ImagePatches {
    /// `grid.patches()` rows of `patch_len` values, row-major.
    pub data: Vec<f32>,
    /// The grid the rows tile.
    pub grid: PatchGrid,
    /// Values per row: `channels · temporal_patch_size · patch_size²`.
    pub patch_len: usize,
}

impl PatchProcessorConfig {
    /// `Qwen2VLImageProcessor`'s defaults, which Qwen2.5-VL's processor keeps: 14-pixel
    /// patches merged 2 x 2, two frames, between 56² and 28² · 1280 pixels, bicubic, CLIP's
    /// mean and std.
    pub fn qwen2_vl() -> Self {
        let clip = ImageProcessorConfig::clip(1);
        PatchProcessorConfig {
            patch_size: 14,
            merge_size: 2,
            temporal_patch_size: 2,
            min_pixels: 56 * 56,
            max_pixels: 28 * 28 * 1280,
            resample: Resample::Bicubic,
            backend: ResizeBackend::Torchvision,
            rescale_factor: clip.rescale_factor,
            image_mean: clip.image_mean,
            image_std: clip.image_std,
        }
    }

    /// The side the resized image's sides are multiples of: a merged block's.
    pub fn factor(&self) -> u32 {
        self.patch_size.saturating_mul(self.merge_size)
    }

    /// The size a `width` x `height` image is resized to, `(width, height)`.
    pub fn resized_size(&self, width: u32, height: u32) -> Result<(u32, u32)> {
        self.validate()?;
        let (h, w) = smart_resize(
            height,
            width,
            self.factor(),
            self.min_pixels,
            self.max_pixels,
        )?;
        Ok((w, h))
    }

    /// The grid a `width` x `height` image becomes, known before any pixel is touched: what
    /// a prompt needs to lay out the image's tokens.
    pub fn grid(&self, width: u32, height: u32) -> Result<PatchGrid> {
        let (w, h) = self.resized_size(width, height)?;
        Ok(PatchGrid {
            t: 1,
            h: h / self.patch_size,
            w: w / self.patch_size,
        })
    }

    /// The identity of the image `bytes` under this preprocessing: the content and
    /// [`Self::shape_key`], known before decoding.
    pub fn media_id(&self, bytes: &[u8]) -> crate::MediaId {
        crate::MediaId::new(crate::Modality::Image, bytes, &self.shape_key())
    }

    /// The numbers that identify this preprocessing for the cache key.
    pub fn shape_key(&self) -> Vec<u64> {
        let mut key = vec![
            u64::from(self.patch_size),
            u64::from(self.merge_size),
            u64::from(self.temporal_patch_size),
            self.min_pixels,
            self.max_pixels,
            self.resample as u64,
            self.backend as u64,
            self.rescale_factor.to_bits(),
        ];
        key.extend(
            self.image_mean
                .iter()
                .chain(&self.image_std)
                .map(|v| u64::from(v.to_bits())),
        );
        key
    }

    fn validate(&self) -> Result<()> {
        for (name, value) in [
            ("patch_size", self.patch_size),
            ("merge_size", self.merge_size),
            ("temporal_patch_size", self.temporal_patch_size),
        ] {
            if value == 0 || value > MAX_PATCH_PARAMETER {
                return Err(Error::InvalidConfig(format!(
                    "`{name}` = {value} is outside 1..={MAX_PATCH_PARAMETER}"
                )));
            }
        }
        if self.max_pixels > MAX_PIXEL_BUDGET {
            return Err(Error::InvalidConfig(format!(
                "`max_pixels` = {} is over {MAX_PIXEL_BUDGET}",
                self.max_pixels
            )));
        }
        Ok(())
    }

    /// The per-pixel config of the resize and normalization, for a target size.
    fn pixel_config(&self, width: u32, height: u32) -> ImageProcessorConfig {
        ImageProcessorConfig {
            width,
            height,
            resample: self.resample,
            backend: self.backend,
            fit: Fit::Stretch,
            rescale_factor: self.rescale_factor,
            image_mean: self.image_mean,
            image_std: self.image_std,
        }
    }
}

/// Resizes `image` per `config` ([`PatchProcessorConfig::resized_size`]), rescales,
/// normalizes and cuts it into patches ([`patchify`]).
///
/// Fails with [`Error::InvalidConfig`] on a config out of bounds or an image
/// [`smart_resize`] refuses.
pub fn preprocess_patches(image: &RgbImage, config: &PatchProcessorConfig) -> Result<ImagePatches> {
    let (width, height) = image.dimensions();
    let (w, h) = config.resized_size(width, height)?;
    let pixels = preprocess(image, &config.pixel_config(w, h))?;
    patchify(
        &pixels,
        config.patch_size,
        config.merge_size,
        config.temporal_patch_size,
    )
}

/// Cuts normalized pixels into rows of `(channel, frame, row, column)` values, each patch
/// repeated over `temporal_patch_size` frames, listed merge block by merge block.
///
/// Fails unless both sides are multiples of `patch_size · merge_size`.
pub fn patchify(
    pixels: &PixelValues,
    patch_size: u32,
    merge_size: u32,
    temporal_patch_size: u32,
) -> Result<ImagePatches> {
    let block = patch_size.checked_mul(merge_size).unwrap_or(0);
    if block == 0
        || temporal_patch_size == 0
        || temporal_patch_size > MAX_PATCH_PARAMETER
        || !pixels.width.is_multiple_of(block)
        || !pixels.height.is_multiple_of(block)
    {
        return Err(Error::InvalidConfig(format!(
            "a {}x{} image does not cut into {patch_size}-pixel patches merged {merge_size} \
             by {merge_size} over {temporal_patch_size} frames",
            pixels.width, pixels.height
        )));
    }
    let (width, height) = (pixels.width as usize, pixels.height as usize);
    let plane = width * height;
    if pixels.data.len() != PixelValues::CHANNELS * plane {
        return Err(Error::InvalidConfig(format!(
            "pixel buffer holds {} values, a {width}x{height} image needs {}",
            pixels.data.len(),
            PixelValues::CHANNELS * plane
        )));
    }
    let (p, m, frames) = (
        patch_size as usize,
        merge_size as usize,
        temporal_patch_size as usize,
    );
    let grid = PatchGrid {
        t: 1,
        h: pixels.height / patch_size,
        w: pixels.width / patch_size,
    };
    let patch_len = PixelValues::CHANNELS * frames * p * p;
    let mut data = Vec::with_capacity(grid.patches() * patch_len);
    let (blocks_down, blocks_across) = (height / (p * m), width / (p * m));
    for block_y in 0..blocks_down {
        for block_x in 0..blocks_across {
            for in_y in 0..m {
                for in_x in 0..m {
                    let top = (block_y * m + in_y) * p;
                    let left = (block_x * m + in_x) * p;
                    for c in 0..PixelValues::CHANNELS {
                        for _ in 0..frames {
                            for y in top..top + p {
                                let row = c * plane + y * width + left;
                                data.extend_from_slice(&pixels.data[row..row + p]);
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(ImagePatches {
        data,
        grid,
        patch_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_follow_the_merge_blocks_and_repeat_each_frame() {
        // A 4x8 image (2x4 patches of 2, merged 2x2) whose values are their own coordinates.
        let (w, h) = (8u32, 4u32);
        let data = (0..3 * w * h).map(|i| i as f32).collect();
        let pixels = PixelValues {
            data,
            height: h,
            width: w,
        };
        let out = patchify(&pixels, 2, 2, 2).unwrap();
        assert_eq!(out.grid, PatchGrid { t: 1, h: 2, w: 4 });
        assert_eq!((out.patch_len, out.data.len()), (24, 8 * 24));
        // The second patch is the first block's top-right one: columns 2..4 of rows 0..2.
        let second = &out.data[24..48];
        let at = |c: u32, y: u32, x: u32| pixels.get(c as usize, y, x).unwrap();
        assert_eq!(
            &second[..4],
            &[at(0, 0, 2), at(0, 0, 3), at(0, 1, 2), at(0, 1, 3)]
        );
        assert_eq!(&second[4..8], &second[..4], "the frame is repeated");
        assert_eq!(second[8], at(1, 0, 2));
        // The fifth patch opens the second block: columns 4..6.
        assert_eq!(out.data[4 * 24], at(0, 0, 4));
        assert_eq!(out.grid.tokens(2), 2);
    }

    #[test]
    fn unaligned_images_and_absurd_configs_are_refused() {
        let pixels = PixelValues {
            data: vec![0.0; 3 * 6 * 4],
            height: 4,
            width: 6,
        };
        assert!(patchify(&pixels, 2, 2, 2).is_err());
        let config = PatchProcessorConfig {
            max_pixels: 1 << 40,
            ..PatchProcessorConfig::qwen2_vl()
        };
        assert!(config.grid(100, 100).is_err());
        let config = PatchProcessorConfig {
            patch_size: 0,
            ..PatchProcessorConfig::qwen2_vl()
        };
        assert!(config.grid(100, 100).is_err());
    }

    #[test]
    fn grid_is_the_resized_size_in_patches() {
        let config = PatchProcessorConfig::qwen2_vl();
        // 113 / 28 rounds to 4, 150 / 28 to 5.
        assert_eq!(config.resized_size(150, 113).unwrap(), (140, 112));
        assert_eq!(
            config.grid(150, 113).unwrap(),
            PatchGrid { t: 1, h: 8, w: 10 }
        );
        assert_eq!(config.grid(150, 113).unwrap().tokens(2), 20);
    }
}
