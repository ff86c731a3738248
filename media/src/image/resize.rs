//! Separable resizing of 8-bit RGB with the filters processor configs name, widened when
//! shrinking so that every source pixel contributes, in the integer arithmetic of the two
//! resizers Hugging Face's image processors run, so that the pixels come out bit for bit:
//!
//! - [`ResizeBackend::Torchvision`]: transformers' default backend (when torchvision is
//!   installed) hands a `uint8` tensor to `torchvision.transforms.v2.functional.resize` with
//!   `antialias=True`, which on x86 (AVX2) and ARM CPUs runs PyTorch's port of Pillow's
//!   resampler: weights in `f64`, normalized, then quantized to `i16` at the largest precision
//!   that keeps the axis' largest weight below 2^15; horizontal pass first, rounded to `u8`,
//!   then the vertical pass.
//! - [`ResizeBackend::Pil`]: the `*ImageProcessorPil` classes call `PIL.Image.resize`: the same
//!   weights quantized to `i32` with 22 fractional bits, `u8` between passes, and (Pillow 13)
//!   the vertical pass first when the height shrinks by more than twice what the width does.
//!
//! Both give the source pixel window of each output pixel as `[trunc(c - s + 0.5),
//! trunc(c + s + 0.5))` around the centre `c = (i + 0.5) * scale`, support `s = base * max(scale,
//! 1)`, and round each pass with `(acc + 2^(p-1)) >> p` clamped to `0..=255`. Checked against
//! transformers 5.24 (torch 2.15, Pillow 13) in `tests/hf_preprocess.rs`.

use image::RgbImage;

/// The resampling filter a processor config names (`resample: 2` bilinear, `3` bicubic in HF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resample {
    /// Triangle filter, widened when shrinking so it averages instead of aliasing.
    Bilinear,
    /// Catmull-Rom cubic, widened when shrinking.
    Bicubic,
}

/// Whose integer resize arithmetic to reproduce: Hugging Face's two image-processor backends
/// agree on the filter and the taps but round differently, so up to one grey level apart on a
/// few percent of values (see this module's docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResizeBackend {
    /// transformers' default (`backend="torchvision"`, the "fast" processors): PyTorch's
    /// antialiased `uint8` resize, `i16` weights, horizontal pass first.
    #[default]
    Torchvision,
    /// `backend="pil"` (the `*ImageProcessorPil` classes): `PIL.Image.resize`, `i32` weights.
    Pil,
}

/// Resizes `image` to `width` x `height` (both at least 1).
pub(crate) fn resize_rgb(
    image: &RgbImage,
    width: u32,
    height: u32,
    resample: Resample,
    backend: ResizeBackend,
) -> RgbImage {
    let (src_w, src_h) = image.dimensions();
    let need_horizontal = src_w != width;
    let need_vertical = src_h != height;
    let (src_w, src_h) = (src_w as usize, src_h as usize);
    let (width, height) = (width as usize, height as usize);
    let mut pixels = image.as_raw().clone();
    let (mut cur_w, mut cur_h) = (src_w, src_h);
    // Pillow 13 runs the vertical pass first when the height shrinks by more than twice as many
    // pixels as the width does; PyTorch always starts with the horizontal one.
    let vertical_first = backend == ResizeBackend::Pil
        && need_horizontal
        && src_h > height
        && (src_h - height) as i64 > 2 * (src_w as i64 - width as i64);
    if vertical_first {
        pixels = vertical_pass(&pixels, cur_w, cur_h, height, resample, backend);
        cur_h = height;
    }
    if need_horizontal {
        pixels = horizontal_pass(&pixels, cur_w, cur_h, width, resample, backend);
        cur_w = width;
    }
    if need_vertical && !vertical_first {
        pixels = vertical_pass(&pixels, cur_w, cur_h, height, resample, backend);
        cur_h = height;
    }
    debug_assert_eq!((cur_w, cur_h), (width, height));
    // The buffer length is width * height * 3 by construction.
    RgbImage::from_raw(width as u32, height as u32, pixels)
        .unwrap_or_else(|| RgbImage::new(width as u32, height as u32))
}

/// Each output column a fixed-point weighted sum of source pixels in its row.
fn horizontal_pass(
    src: &[u8],
    src_w: usize,
    rows: usize,
    dst_w: usize,
    resample: Resample,
    backend: ResizeBackend,
) -> Vec<u8> {
    let taps = Taps::new(src_w, dst_w, resample, backend);
    let round = 1i32 << (taps.precision - 1);
    let mut out = vec![0u8; dst_w * rows * 3];
    for (src_row, dst_row) in src
        .chunks_exact(src_w * 3)
        .zip(out.chunks_exact_mut(dst_w * 3))
    {
        for (x, dst) in dst_row.chunks_exact_mut(3).enumerate() {
            let (start, weights) = taps.of(x);
            let window = &src_row[start * 3..(start + weights.len()) * 3];
            let mut acc = [round; 3];
            for (pixel, &w) in window.chunks_exact(3).zip(weights) {
                acc[0] += i32::from(pixel[0]) * w;
                acc[1] += i32::from(pixel[1]) * w;
                acc[2] += i32::from(pixel[2]) * w;
            }
            for (d, a) in dst.iter_mut().zip(acc) {
                *d = clip8(a, taps.precision);
            }
        }
    }
    out
}

/// Each output row a fixed-point weighted sum of source rows, whole rows at a time.
fn vertical_pass(
    src: &[u8],
    width: usize,
    src_h: usize,
    dst_h: usize,
    resample: Resample,
    backend: ResizeBackend,
) -> Vec<u8> {
    let taps = Taps::new(src_h, dst_h, resample, backend);
    let row_len = width * 3;
    let round = 1i32 << (taps.precision - 1);
    let mut acc = vec![0i32; row_len];
    let mut out = vec![0u8; row_len * dst_h];
    for (y, dst_row) in out.chunks_exact_mut(row_len).enumerate() {
        let (start, weights) = taps.of(y);
        acc.fill(round);
        for (k, &w) in weights.iter().enumerate() {
            let src_row = &src[(start + k) * row_len..(start + k + 1) * row_len];
            for (a, &v) in acc.iter_mut().zip(src_row) {
                *a += i32::from(v) * w;
            }
        }
        for (d, &a) in dst_row.iter_mut().zip(&acc) {
            *d = clip8(a, taps.precision);
        }
    }
    out
}

fn clip8(acc: i32, precision: u32) -> u8 {
    (acc >> precision).clamp(0, 255) as u8
}

/// For each output coordinate, the first source index and the fixed-point weights from there.
struct Taps {
    starts: Vec<usize>,
    lens: Vec<usize>,
    stride: usize,
    weights: Vec<i32>,
    /// Fractional bits of `weights`.
    precision: u32,
}

impl Taps {
    fn new(src: usize, dst: usize, resample: Resample, backend: ResizeBackend) -> Taps {
        let (kernel, base_support): (fn(f64) -> f64, f64) = match resample {
            Resample::Bilinear => (triangle, 1.0),
            Resample::Bicubic => (keys_cubic, 2.0),
        };
        let scale = src as f64 / dst as f64;
        // Shrinking stretches the kernel over `scale` source pixels so it averages them.
        let stretch = scale.max(1.0);
        let inv_stretch = 1.0 / stretch;
        let support = base_support * stretch;
        let stride = (support.ceil() as usize) * 2 + 1;
        let mut starts = Vec::with_capacity(dst);
        let mut lens = Vec::with_capacity(dst);
        let mut real = vec![0.0f64; dst * stride];
        let mut max_weight = 0.0f64;
        for o in 0..dst {
            let center = (o as f64 + 0.5) * scale;
            // `as` truncates toward zero, as the C casts do.
            let lo = ((center - support + 0.5) as i64).max(0) as usize;
            let hi = ((center + support + 0.5) as i64).min(src as i64) as usize;
            let len = hi.saturating_sub(lo).min(stride);
            let row = &mut real[o * stride..o * stride + len];
            let mut sum = 0.0;
            for (k, w) in row.iter_mut().enumerate() {
                *w = kernel(((lo + k) as f64 - center + 0.5) * inv_stretch);
                sum += *w;
            }
            if sum != 0.0 {
                for w in row.iter_mut() {
                    *w /= sum;
                    max_weight = max_weight.max(*w);
                }
            }
            starts.push(lo);
            lens.push(len);
        }
        let precision = match backend {
            ResizeBackend::Pil => PIL_PRECISION_BITS,
            // The largest precision below 22 at which the largest weight still fits in an i16.
            ResizeBackend::Torchvision => (0..PIL_PRECISION_BITS)
                .find(|p| (0.5 + max_weight * f64::from(1u32 << (p + 1))) as i64 >= 1 << 15)
                .unwrap_or(PIL_PRECISION_BITS),
        };
        let one = f64::from(1u32 << precision);
        let weights = real
            .iter()
            .map(|&w| {
                // Round half away from zero, as both libraries do.
                let v = w * one;
                let q = if v < 0.0 { v - 0.5 } else { v + 0.5 } as i32;
                match backend {
                    ResizeBackend::Pil => q,
                    ResizeBackend::Torchvision => i32::from(q as i16),
                }
            })
            .collect();
        Taps {
            starts,
            lens,
            stride,
            weights,
            precision,
        }
    }

    fn of(&self, o: usize) -> (usize, &[i32]) {
        let start = o * self.stride;
        (self.starts[o], &self.weights[start..start + self.lens[o]])
    }
}

/// Pillow's fixed-point precision for 8-bit images: 32 bits less 8 for the value, 2 for the
/// overshoot of negative lobes.
const PIL_PRECISION_BITS: u32 = 32 - 8 - 2;

fn triangle(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 { 1.0 - x } else { 0.0 }
}

/// Keys' cubic with a = -0.5, Pillow's and PyTorch's antialiased "bicubic", in Pillow's form.
fn keys_cubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::Rgb;

    fn pattern(width: u32, height: u32) -> RgbImage {
        RgbImage::from_fn(width, height, |x, y| {
            let v = |a: f64, b: f64| {
                ((f64::from(x) * a).sin() * (f64::from(y) * b).cos() * 100.0 + 128.0) as u8
            };
            Rgb([v(0.05, 0.03), v(0.011, 0.07), ((x * 3 + y) % 256) as u8])
        })
    }

    #[test]
    fn constant_images_stay_constant() {
        let src = RgbImage::from_pixel(37, 23, Rgb([10, 200, 77]));
        for resample in [Resample::Bilinear, Resample::Bicubic] {
            for backend in [ResizeBackend::Torchvision, ResizeBackend::Pil] {
                for (w, h) in [(5, 9), (100, 61), (37, 1), (1, 1)] {
                    let out = resize_rgb(&src, w, h, resample, backend);
                    assert_eq!(out.dimensions(), (w, h));
                    assert!(
                        out.pixels().all(|p| p.0 == [10, 200, 77]),
                        "{resample:?} {backend:?} {w}x{h}"
                    );
                }
            }
        }
    }

    #[test]
    fn shrinking_averages_instead_of_aliasing() {
        // A one-pixel checkerboard shrunk 8x must come out flat grey, not a moiré.
        let src = RgbImage::from_fn(64, 64, |x, y| {
            if (x + y) % 2 == 0 {
                Rgb([255; 3])
            } else {
                Rgb([0; 3])
            }
        });
        for resample in [Resample::Bilinear, Resample::Bicubic] {
            for backend in [ResizeBackend::Torchvision, ResizeBackend::Pil] {
                let out = resize_rgb(&src, 8, 8, resample, backend);
                assert!(
                    out.pixels().all(|p| p.0[0].abs_diff(128) <= 2),
                    "{resample:?} {backend:?}: {:?}",
                    out.get_pixel(3, 3)
                );
            }
        }
    }

    #[test]
    fn agrees_with_the_image_crate_up_to_rounding() {
        let src = pattern(300, 200);
        for (resample, filter) in [
            (Resample::Bilinear, image::imageops::FilterType::Triangle),
            (Resample::Bicubic, image::imageops::FilterType::CatmullRom),
        ] {
            for (w, h, backend) in [
                (224, 224, ResizeBackend::Torchvision),
                (64, 48, ResizeBackend::Pil),
                (600, 410, ResizeBackend::Torchvision),
                (600, 410, ResizeBackend::Pil),
            ] {
                let ours = resize_rgb(&src, w, h, resample, backend);
                let theirs = image::imageops::resize(&src, w, h, filter);
                // Red and green only: blue is a sawtooth jumping from 255 to 0, where the cubic's
                // overshoot is clamped to u8 between our passes (as Pillow and PyTorch do,
                // checked in tests/hf_preprocess.rs) but kept in the image crate's f32.
                let diffs: Vec<u8> = ours
                    .pixels()
                    .zip(theirs.pixels())
                    .flat_map(|(a, b)| [a[0].abs_diff(b[0]), a[1].abs_diff(b[1])])
                    .collect();
                let mean = diffs.iter().map(|&d| f64::from(d)).sum::<f64>() / diffs.len() as f64;
                let max = diffs.iter().copied().max().unwrap_or(0);
                assert!(
                    mean < 0.6 && max <= 3,
                    "{resample:?} {w}x{h}: mean {mean}, max {max}"
                );
            }
        }
    }
}
