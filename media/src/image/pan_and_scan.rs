//! Gemma 3's pan and scan: an image much wider than tall (or taller than wide) is also shown to
//! the encoder as a few crops side by side (or stacked), each resized to the encoder's square
//! as the whole image is, so a long screenshot keeps legible detail. The crops' geometry is
//! transformers 5.24's `Gemma3ImageProcessor.pan_and_scan`, exactly: integer crop sizes
//! rounded up, the last crop cut off at the image's edge.

use image::RgbImage;

/// When and how an image is cut (`Gemma3ImageProcessor`'s `pan_and_scan_*` settings).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PanAndScan {
    /// The smallest crop side; an image whose crops would be smaller is not cut.
    pub min_crop_size: u32,
    /// The most crops an image is cut into.
    pub max_num_crops: u32,
    /// The aspect ratio (long side over short) from which an image is cut.
    pub min_ratio_to_activate: f64,
}

impl Default for PanAndScan {
    /// transformers' defaults for Gemma 3: crops of at least 256 pixels, at most 4 of them,
    /// for images at least 1.2 times as long as they are wide.
    fn default() -> Self {
        PanAndScan {
            min_crop_size: 256,
            max_num_crops: 4,
            min_ratio_to_activate: 1.2,
        }
    }
}

/// A rectangle of an image, in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CropRect {
    /// Left edge.
    pub x: u32,
    /// Top edge.
    pub y: u32,
    /// Width.
    pub width: u32,
    /// Height.
    pub height: u32,
}

impl PanAndScan {
    /// The crops of a `width` x `height` image, left to right or top to bottom; none when the
    /// image is too square or its crops would be too small.
    pub fn crops(&self, width: u32, height: u32) -> Vec<CropRect> {
        if width == 0 || height == 0 {
            return Vec::new();
        }
        let (long, short) = (width.max(height), width.min(height));
        if f64::from(long) / f64::from(short) < self.min_ratio_to_activate {
            return Vec::new();
        }
        // The crop count closest to the aspect ratio (half rounded up), no more than crops of
        // the smallest size would allow, within [2, max_num_crops].
        let by_ratio = (f64::from(long) / f64::from(short) + 0.5).floor() as u32;
        let by_size = long / self.min_crop_size.max(1);
        let count = by_ratio.min(by_size).max(2).min(self.max_num_crops);
        if count == 0 {
            return Vec::new();
        }
        let side = long.div_ceil(count);
        if side.min(short) < self.min_crop_size {
            return Vec::new();
        }
        (0..count)
            .map(|i| i * side)
            .filter(|&start| start < long)
            .map(|start| {
                let len = side.min(long - start);
                if width >= height {
                    CropRect {
                        x: start,
                        y: 0,
                        width: len,
                        height,
                    }
                } else {
                    CropRect {
                        x: 0,
                        y: start,
                        width,
                        height: len,
                    }
                }
            })
            .collect()
    }
}

/// The pixels of `rect` in `image` (clipped to the image).
pub fn crop(image: &RgbImage, rect: CropRect) -> RgbImage {
    image::imageops::crop_imm(image, rect.x, rect.y, rect.width, rect.height).to_image()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pas(min_crop_size: u32) -> PanAndScan {
        PanAndScan {
            min_crop_size,
            ..PanAndScan::default()
        }
    }

    #[test]
    fn square_enough_or_small_images_are_not_cut() {
        assert!(PanAndScan::default().crops(1000, 900).is_empty());
        // Crops of 300 x 200: narrower than 256.
        assert!(PanAndScan::default().crops(600, 200).is_empty());
        assert!(PanAndScan::default().crops(0, 10).is_empty());
    }

    #[test]
    fn long_images_are_cut_along_their_long_side() {
        // 800 x 300: ratio 2.67 rounds to 3 crops of 267 (the last 266).
        let crops = PanAndScan::default().crops(800, 300);
        let spans: Vec<(u32, u32)> = crops.iter().map(|c| (c.x, c.width)).collect();
        assert_eq!(spans, [(0, 267), (267, 267), (534, 266)]);
        assert!(crops.iter().all(|c| c.y == 0 && c.height == 300));
        // Portrait, capped at 4 crops.
        let crops = pas(32).crops(100, 1000);
        assert_eq!(crops.len(), 4);
        assert_eq!((crops[3].y, crops[3].height), (750, 250));
        // At least two, even near the activation ratio.
        assert_eq!(pas(32).crops(130, 100).len(), 2);
    }
}
