//! Preprocessing an RGB image the way a model's image processor config says: resize
//! (bilinear or bicubic), fit to the target by stretching, center-cropping or padding, then
//! rescale and normalize into channel-first `f32` host data.

use image::imageops;
use image::{Rgb, RgbImage};

use crate::error::{Error, Result};
use crate::image::resize::{Resample, ResizeBackend, resize_rgb};

/// How an image whose aspect ratio differs from the target's is made to fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// Resize straight to the target; the aspect ratio changes.
    Stretch,
    /// Resize to cover the target, then cut the centre. The covering size is transformers'
    /// `shortest_edge` resize: the side that binds gets its target exactly, the other
    /// `trunc(target * other / side)` (truncated, as `get_resize_output_image_size` does); the
    /// crop starts at `trunc((covered - target) / 2)`.
    CenterCrop,
    /// Resize to fit inside the target, centred on a canvas of `fill`.
    Pad {
        /// The canvas colour.
        fill: [u8; 3],
    },
}

/// The subset of an image processor config that fixes the pixels a vision encoder sees.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImageProcessorConfig {
    /// Output width in pixels.
    pub width: u32,
    /// Output height in pixels.
    pub height: u32,
    /// Resize filter.
    pub resample: Resample,
    /// Whose fixed-point resize to reproduce.
    pub backend: ResizeBackend,
    /// Aspect-ratio handling.
    pub fit: Fit,
    /// Multiplier taking `u8` to the model's range, usually `1/255`; `f64` as transformers
    /// keeps it (a Python float), since the `f32` nearest 1/255 inverts to 254.99998, not 255.
    pub rescale_factor: f64,
    /// Per-channel mean subtracted after rescaling.
    pub image_mean: [f32; 3],
    /// Per-channel standard deviation divided by after subtracting the mean.
    pub image_std: [f32; 3],
}

impl ImageProcessorConfig {
    /// A config with CLIP's mean and std, `1/255` rescale, bicubic, center crop: what
    /// transformers' `CLIPImageProcessor` does with `shortest_edge` and `crop_size` both `size`.
    pub fn clip(size: u32) -> Self {
        ImageProcessorConfig {
            width: size,
            height: size,
            resample: Resample::Bicubic,
            backend: ResizeBackend::Torchvision,
            fit: Fit::CenterCrop,
            rescale_factor: 1.0 / 255.0,
            image_mean: [0.481_454_66, 0.457_827_5, 0.408_210_73],
            image_std: [0.268_629_54, 0.261_302_6, 0.275_777_1],
        }
    }

    /// A config mapping `[0, 255]` to `[-1, 1]` (mean 0.5, std 0.5), bilinear, stretched to
    /// `size` x `size`, as SigLIP's and Gemma 3's image processors do.
    pub fn siglip(size: u32) -> Self {
        ImageProcessorConfig {
            width: size,
            height: size,
            resample: Resample::Bilinear,
            backend: ResizeBackend::Torchvision,
            fit: Fit::Stretch,
            rescale_factor: 1.0 / 255.0,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
        }
    }

    /// The identity of the image `bytes` under this preprocessing: the content and
    /// [`Self::shape_key`], known before decoding.
    pub fn media_id(&self, bytes: &[u8]) -> crate::MediaId {
        crate::MediaId::new(crate::Modality::Image, bytes, &self.shape_key())
    }

    /// The numbers that identify this preprocessing for the cache key: the output shape,
    /// the filter and fit, and the normalization as raw bits.
    pub fn shape_key(&self) -> Vec<u64> {
        let (fit, fill) = match self.fit {
            Fit::Stretch => (0, 0),
            Fit::CenterCrop => (1, 0),
            Fit::Pad { fill } => (
                2,
                u64::from(u32::from_be_bytes([0, fill[0], fill[1], fill[2]])),
            ),
        };
        let mut key = vec![
            u64::from(self.width),
            u64::from(self.height),
            self.resample as u64,
            fit,
            self.backend as u64,
            fill,
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
        if self.width == 0 || self.height == 0 {
            return Err(Error::InvalidConfig(format!(
                "output size {}x{} has a zero side",
                self.width, self.height
            )));
        }
        if !self.rescale_factor.is_finite() {
            return Err(Error::InvalidConfig("rescale_factor is not finite".into()));
        }
        if self.image_std.iter().any(|s| !s.is_finite() || *s <= 0.0) {
            return Err(Error::InvalidConfig(format!(
                "image_std {:?} must be positive",
                self.image_std
            )));
        }
        if self.image_mean.iter().any(|m| !m.is_finite()) {
            return Err(Error::InvalidConfig("image_mean is not finite".into()));
        }
        Ok(())
    }
}

/// Channel-first (`[3, height, width]`) normalized pixels, ready to become an array.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelValues {
    /// `3 * height * width` values, channel-major.
    pub data: Vec<f32>,
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
}

impl PixelValues {
    /// Number of channels (always 3: RGB).
    pub const CHANNELS: usize = 3;

    /// The value at channel `c`, row `y`, column `x`, or `None` outside the image.
    pub fn get(&self, c: usize, y: u32, x: u32) -> Option<f32> {
        if c >= Self::CHANNELS || y >= self.height || x >= self.width {
            return None;
        }
        let plane = self.height as usize * self.width as usize;
        self.data
            .get(c * plane + y as usize * self.width as usize + x as usize)
            .copied()
    }
}

/// Resizes and fits `image` to the config's size (no normalization).
pub fn resize_to_fit(image: &RgbImage, config: &ImageProcessorConfig) -> Result<RgbImage> {
    config.validate()?;
    let (src_w, src_h) = image.dimensions();
    if src_w == 0 || src_h == 0 {
        return Err(Error::InvalidConfig("source image has a zero side".into()));
    }
    let (dst_w, dst_h) = (config.width, config.height);
    let resize = |w, h| resize_rgb(image, w, h, config.resample, config.backend);
    let resized = match config.fit {
        Fit::Stretch => resize(dst_w, dst_h),
        Fit::CenterCrop => {
            let (w, h) = covering_size(src_w, src_h, dst_w, dst_h);
            let covered = resize(w, h);
            imageops::crop_imm(&covered, (w - dst_w) / 2, (h - dst_h) / 2, dst_w, dst_h).to_image()
        }
        Fit::Pad { fill } => {
            let scale = f64::min(
                f64::from(dst_w) / f64::from(src_w),
                f64::from(dst_h) / f64::from(src_h),
            );
            let w = scaled_side(src_w, scale).min(dst_w);
            let h = scaled_side(src_h, scale).min(dst_h);
            let inner = resize(w, h);
            let mut canvas = RgbImage::from_pixel(dst_w, dst_h, Rgb(fill));
            imageops::replace(
                &mut canvas,
                &inner,
                i64::from((dst_w - w) / 2),
                i64::from((dst_h - h) / 2),
            );
            canvas
        }
    };
    Ok(resized)
}

/// Resizes, fits, rescales and normalizes `image` into [`PixelValues`].
///
/// Fails with [`Error::InvalidConfig`] on a zero output size, a non-positive std or
/// non-finite numbers.
pub fn preprocess(image: &RgbImage, config: &ImageProcessorConfig) -> Result<PixelValues> {
    let fitted = resize_to_fit(image, config)?;
    Ok(normalize(
        &fitted,
        config.rescale_factor,
        config.image_mean,
        config.image_std,
    ))
}

/// Rescales and normalizes an already-sized image into channel-first `f32`.
///
/// In the arithmetic of transformers' torchvision backend, which fuses the two steps into
/// `(v - mean / rescale) / (std / rescale)` in `f32`; its PIL backend rescales and normalizes in
/// separate steps and lands within a few `f32` ulps of this.
pub fn normalize(
    image: &RgbImage,
    rescale_factor: f64,
    mean: [f32; 3],
    std: [f32; 3],
) -> PixelValues {
    let (width, height) = image.dimensions();
    let plane = width as usize * height as usize;
    let mut data = vec![0.0f32; plane * PixelValues::CHANNELS];
    // transformers multiplies the f32 mean and std tensors by the Python float 1 / rescale,
    // which torch rounds to f32 first.
    let inverse = (1.0 / rescale_factor) as f32;
    let mean: [f32; 3] = std::array::from_fn(|c| mean[c] * inverse);
    let std: [f32; 3] = std::array::from_fn(|c| std[c] * inverse);
    for (i, pixel) in image.pixels().enumerate() {
        for c in 0..3 {
            data[c * plane + i] = (f32::from(pixel[c]) - mean[c]) / std[c];
        }
    }
    PixelValues {
        data,
        height,
        width,
    }
}

/// The size that covers `dst_w` x `dst_h`, as transformers' `shortest_edge` resize computes it:
/// the binding side exactly, the other truncated, never below its target.
fn covering_size(src_w: u32, src_h: u32, dst_w: u32, dst_h: u32) -> (u32, u32) {
    // Width binds when dst_w / src_w >= dst_h / src_h.
    let width_binds = u64::from(dst_w) * u64::from(src_h) >= u64::from(dst_h) * u64::from(src_w);
    // Integer floor equals Python's int(float) here: the quotients are far from f64's limits.
    let scaled = |target: u32, side: u32, other: u32| {
        (u64::from(target) * u64::from(other) / u64::from(side)).min(u64::from(u32::MAX)) as u32
    };
    if width_binds {
        (dst_w, scaled(dst_w, src_w, src_h).max(dst_h))
    } else {
        (scaled(dst_h, src_h, src_w).max(dst_w), dst_h)
    }
}

fn scaled_side(side: u32, scale: f64) -> u32 {
    // Round to nearest, never below one pixel.
    ((f64::from(side) * scale).round() as u32).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(width: u32, height: u32) -> RgbImage {
        RgbImage::from_fn(width, height, |x, y| {
            Rgb([
                (x * 255 / width.max(1)) as u8,
                (y * 255 / height.max(1)) as u8,
                128,
            ])
        })
    }

    #[test]
    fn output_has_the_configured_shape_for_every_fit() {
        let src = gradient(300, 120);
        for fit in [Fit::Stretch, Fit::CenterCrop, Fit::Pad { fill: [0, 0, 0] }] {
            for resample in [Resample::Bilinear, Resample::Bicubic] {
                let cfg = ImageProcessorConfig {
                    fit,
                    resample,
                    width: 64,
                    height: 48,
                    ..ImageProcessorConfig::clip(64)
                };
                let px = preprocess(&src, &cfg).unwrap();
                assert_eq!(
                    (px.width, px.height, px.data.len()),
                    (64, 48, 3 * 64 * 48),
                    "{fit:?}"
                );
            }
        }
    }

    #[test]
    fn normalization_maps_the_byte_range_as_configured() {
        let white = RgbImage::from_pixel(4, 4, Rgb([255, 255, 255]));
        let black = RgbImage::from_pixel(4, 4, Rgb([0, 0, 0]));
        let cfg = ImageProcessorConfig::siglip(4);
        assert!(
            preprocess(&white, &cfg)
                .unwrap()
                .data
                .iter()
                .all(|v| (v - 1.0).abs() < 1e-6)
        );
        assert!(
            preprocess(&black, &cfg)
                .unwrap()
                .data
                .iter()
                .all(|v| (v + 1.0).abs() < 1e-6)
        );
    }

    #[test]
    fn pad_centres_the_image_on_the_fill_colour() {
        let src = RgbImage::from_pixel(100, 50, Rgb([200, 0, 0]));
        let cfg = ImageProcessorConfig {
            fit: Fit::Pad { fill: [0, 0, 255] },
            ..ImageProcessorConfig::siglip(100)
        };
        let out = resize_to_fit(&src, &cfg).unwrap();
        assert_eq!(out.get_pixel(50, 0).0, [0, 0, 255], "top band is padding");
        assert_eq!(
            out.get_pixel(50, 99).0,
            [0, 0, 255],
            "bottom band is padding"
        );
        assert_eq!(out.get_pixel(50, 50).0, [200, 0, 0], "centre is the image");
    }

    #[test]
    fn center_crop_keeps_the_middle() {
        // Left third red, middle green, right third blue; cropping a square keeps green.
        let src = RgbImage::from_fn(300, 100, |x, _| match x / 100 {
            0 => Rgb([255, 0, 0]),
            1 => Rgb([0, 255, 0]),
            _ => Rgb([0, 0, 255]),
        });
        let cfg = ImageProcessorConfig {
            fit: Fit::CenterCrop,
            ..ImageProcessorConfig::siglip(50)
        };
        let out = resize_to_fit(&src, &cfg).unwrap();
        assert_eq!(out.get_pixel(25, 25).0, [0, 255, 0]);
        assert_eq!(out.get_pixel(2, 25).0, [0, 255, 0]);
    }

    #[test]
    fn bad_configs_are_errors() {
        let src = gradient(8, 8);
        let zero = ImageProcessorConfig {
            width: 0,
            ..ImageProcessorConfig::clip(8)
        };
        assert!(matches!(
            preprocess(&src, &zero),
            Err(Error::InvalidConfig(_))
        ));
        let bad_std = ImageProcessorConfig {
            image_std: [0.5, 0.0, 0.5],
            ..ImageProcessorConfig::clip(8)
        };
        assert!(matches!(
            preprocess(&src, &bad_std),
            Err(Error::InvalidConfig(_))
        ));
    }

    #[test]
    fn shape_key_distinguishes_configs() {
        assert_ne!(
            ImageProcessorConfig::clip(224).shape_key(),
            ImageProcessorConfig::clip(336).shape_key()
        );
        assert_ne!(
            ImageProcessorConfig::clip(224).shape_key(),
            ImageProcessorConfig::siglip(224).shape_key()
        );
    }
}
