//! Separable resizing of 8-bit RGB with the filters processor configs name, widened when
//! shrinking so that every source pixel contributes (the way PIL resizes, which is what the
//! reference preprocessors run).
//!
//! Ours rather than `image::imageops::resize`: that one reads each tap through the generic
//! pixel accessors and an `Rgba32F` intermediate, and took ~150 ms for 1024² → 896² where this
//! takes a few milliseconds.

use image::RgbImage;

use crate::image::preprocess::Resample;

/// Resizes `image` to `width` x `height` (both at least 1).
pub(crate) fn resize_rgb(
    image: &RgbImage,
    width: u32,
    height: u32,
    resample: Resample,
) -> RgbImage {
    let (src_w, src_h) = image.dimensions();
    if (src_w, src_h) == (width, height) {
        return image.clone();
    }
    let horizontal = Taps::new(src_w as usize, width as usize, resample);
    let vertical = Taps::new(src_h as usize, height as usize, resample);
    let (src_w, width, height) = (src_w as usize, width as usize, height as usize);

    // Vertical pass first: it runs over whole rows, which the compiler vectorizes, and since
    // inputs are usually larger than an encoder's size, doing it first leaves the per-pixel
    // horizontal pass the fewer rows.
    let src = image.as_raw();
    let row_len = src_w * 3;
    let mut rows = vec![0.0f32; height * row_len];
    for (y, dst_row) in rows.chunks_exact_mut(row_len).enumerate() {
        let (start, weights) = vertical.of(y);
        for (k, &w) in weights.iter().enumerate() {
            let src_row = &src[(start + k) * row_len..(start + k + 1) * row_len];
            for (a, &v) in dst_row.iter_mut().zip(src_row) {
                *a += f32::from(v) * w;
            }
        }
    }

    // Horizontal pass: each output pixel a weighted sum of neighbours in its row.
    let mut out = vec![0u8; width * height * 3];
    for (src_row, dst_row) in rows
        .chunks_exact(row_len)
        .zip(out.chunks_exact_mut(width * 3))
    {
        for (x, dst) in dst_row.chunks_exact_mut(3).enumerate() {
            let (start, weights) = horizontal.of(x);
            let taps = &src_row[start * 3..(start + weights.len()) * 3];
            let mut acc = [0.0f32; 3];
            for (pixel, &w) in taps.chunks_exact(3).zip(weights) {
                acc[0] += pixel[0] * w;
                acc[1] += pixel[1] * w;
                acc[2] += pixel[2] * w;
            }
            for (d, a) in dst.iter_mut().zip(acc) {
                *d = a.round().clamp(0.0, 255.0) as u8;
            }
        }
    }
    // The buffer length is width * height * 3 by construction.
    RgbImage::from_raw(width as u32, height as u32, out)
        .unwrap_or_else(|| RgbImage::new(width as u32, height as u32))
}

/// For each output coordinate, the first source index and the normalized weights from there.
struct Taps {
    starts: Vec<usize>,
    lens: Vec<usize>,
    stride: usize,
    weights: Vec<f32>,
}

impl Taps {
    fn new(src: usize, dst: usize, resample: Resample) -> Taps {
        let (kernel, base_support): (fn(f64) -> f64, f64) = match resample {
            Resample::Bilinear => (triangle, 1.0),
            Resample::Bicubic => (catmull_rom, 2.0),
        };
        let scale = src as f64 / dst as f64;
        // Shrinking stretches the kernel over `scale` source pixels so it averages them.
        let stretch = scale.max(1.0);
        let support = base_support * stretch;
        let stride = (support.ceil() as usize) * 2 + 1;
        let mut taps = Taps {
            starts: Vec::with_capacity(dst),
            lens: Vec::with_capacity(dst),
            stride,
            weights: vec![0.0; dst * stride],
        };
        for o in 0..dst {
            let center = (o as f64 + 0.5) * scale;
            let lo = ((center - support).floor().max(0.0) as usize).min(src - 1);
            let hi = ((center + support).ceil() as usize)
                .clamp(lo + 1, src)
                .min(lo + stride);
            let row = &mut taps.weights[o * stride..o * stride + (hi - lo)];
            let mut sum = 0.0;
            for (k, w) in row.iter_mut().enumerate() {
                let v = kernel(((lo + k) as f64 + 0.5 - center) / stretch);
                *w = v as f32;
                sum += v;
            }
            if sum.abs() > f64::EPSILON {
                row.iter_mut()
                    .for_each(|w| *w = (f64::from(*w) / sum) as f32);
            } else {
                // Unreachable with these kernels (the nearest tap is within half a pixel), but a
                // zero sum must not divide: fall back to the nearest pixel.
                row.fill(0.0);
                let nearest = (center.floor() as usize).clamp(lo, hi - 1) - lo;
                row[nearest] = 1.0;
            }
            taps.starts.push(lo);
            taps.lens.push(hi - lo);
        }
        taps
    }

    fn of(&self, o: usize) -> (usize, &[f32]) {
        let start = o * self.stride;
        (self.starts[o], &self.weights[start..start + self.lens[o]])
    }
}

fn triangle(x: f64) -> f64 {
    (1.0 - x.abs()).max(0.0)
}

/// Keys' cubic with a = -0.5 (Catmull-Rom), PIL's and the reference processors' "bicubic".
fn catmull_rom(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.5 * x * x * x - 2.5 * x * x + 1.0
    } else if x < 2.0 {
        -0.5 * x * x * x + 2.5 * x * x - 4.0 * x + 2.0
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
            for (w, h) in [(5, 9), (100, 61), (37, 1), (1, 1)] {
                let out = resize_rgb(&src, w, h, resample);
                assert_eq!(out.dimensions(), (w, h));
                assert!(
                    out.pixels().all(|p| p.0 == [10, 200, 77]),
                    "{resample:?} {w}x{h}"
                );
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
            let out = resize_rgb(&src, 8, 8, resample);
            assert!(
                out.pixels().all(|p| p.0[0].abs_diff(128) <= 2),
                "{resample:?}: {:?}",
                out.get_pixel(3, 3)
            );
        }
    }

    #[test]
    fn agrees_with_the_image_crate_up_to_rounding() {
        let src = pattern(300, 200);
        for (resample, filter) in [
            (Resample::Bilinear, image::imageops::FilterType::Triangle),
            (Resample::Bicubic, image::imageops::FilterType::CatmullRom),
        ] {
            for (w, h) in [(224, 224), (64, 48), (600, 410)] {
                let ours = resize_rgb(&src, w, h, resample);
                let theirs = image::imageops::resize(&src, w, h, filter);
                let diffs: Vec<u8> = ours
                    .as_raw()
                    .iter()
                    .zip(theirs.as_raw())
                    .map(|(a, b)| a.abs_diff(*b))
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
