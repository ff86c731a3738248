//! Tiling helpers for encoders that take large images as a grid of fixed-size tiles, and the
//! patch-aligned "smart resize" of encoders that take any size in multiples of a patch.

use crate::error::{Error, Result};
use crate::image::preprocess::PixelValues;

/// A grid of `cols` by `rows` tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileGrid {
    /// Tiles across.
    pub cols: u32,
    /// Tiles down.
    pub rows: u32,
}

impl TileGrid {
    /// Number of tiles.
    pub fn count(self) -> u32 {
        self.cols * self.rows
    }
}

/// Picks the grid of at most `max_tiles` square tiles of side `tile` that best holds a
/// `width` x `height` image.
///
/// Best means: the most image pixels kept (an image is never credited for being upscaled
/// past its own resolution), then the least canvas wasted, then the fewest tiles.
pub fn tile_grid(width: u32, height: u32, tile: u32, max_tiles: u32) -> Result<TileGrid> {
    if width == 0 || height == 0 || tile == 0 || max_tiles == 0 {
        return Err(Error::InvalidConfig(format!(
            "tile_grid needs positive sizes (image {width}x{height}, tile {tile}, max {max_tiles})"
        )));
    }
    let native = f64::from(width) * f64::from(height);
    let mut best: Option<(TileGrid, f64, f64)> = None;
    for rows in 1..=max_tiles {
        for cols in 1..=max_tiles / rows {
            let canvas_w = f64::from(cols) * f64::from(tile);
            let canvas_h = f64::from(rows) * f64::from(tile);
            let scale = f64::min(canvas_w / f64::from(width), canvas_h / f64::from(height));
            let kept = (native * scale * scale).min(native);
            let waste = canvas_w * canvas_h - native * scale * scale;
            let grid = TileGrid { cols, rows };
            let better = match best {
                None => true,
                Some((b, b_kept, b_waste)) => {
                    // Relative tolerance so float noise does not pick a bigger grid.
                    if kept > b_kept * (1.0 + 1e-9) {
                        true
                    } else if kept < b_kept * (1.0 - 1e-9) {
                        false
                    } else if waste < b_waste - 1e-6 {
                        true
                    } else {
                        waste <= b_waste + 1e-6 && grid.count() < b.count()
                    }
                }
            };
            if better {
                best = Some((grid, kept, waste));
            }
        }
    }
    best.map(|(grid, _, _)| grid)
        .ok_or_else(|| Error::InvalidConfig("no tile grid fits".into()))
}

/// Cuts channel-first pixels into `tile_w` x `tile_h` tiles, row-major.
///
/// Fails when the image is not an exact multiple of the tile size.
pub fn split_tiles(pixels: &PixelValues, tile_w: u32, tile_h: u32) -> Result<Vec<PixelValues>> {
    if tile_w == 0
        || tile_h == 0
        || !pixels.width.is_multiple_of(tile_w)
        || !pixels.height.is_multiple_of(tile_h)
    {
        return Err(Error::InvalidConfig(format!(
            "{}x{} image does not divide into {tile_w}x{tile_h} tiles",
            pixels.width, pixels.height
        )));
    }
    let expected = PixelValues::CHANNELS * pixels.width as usize * pixels.height as usize;
    if pixels.data.len() != expected {
        return Err(Error::InvalidConfig(format!(
            "pixel buffer holds {} values, shape needs {expected}",
            pixels.data.len()
        )));
    }
    let (w, h) = (pixels.width as usize, pixels.height as usize);
    let (tw, th) = (tile_w as usize, tile_h as usize);
    let mut tiles = Vec::with_capacity((w / tw) * (h / th));
    for ty in 0..h / th {
        for tx in 0..w / tw {
            let mut data = Vec::with_capacity(PixelValues::CHANNELS * tw * th);
            for c in 0..PixelValues::CHANNELS {
                for y in ty * th..(ty + 1) * th {
                    let row = c * w * h + y * w;
                    data.extend_from_slice(&pixels.data[row + tx * tw..row + (tx + 1) * tw]);
                }
            }
            tiles.push(PixelValues {
                data,
                height: tile_h,
                width: tile_w,
            });
        }
    }
    Ok(tiles)
}

/// Patch-aligned resize target: both sides multiples of `factor`, the area between
/// `min_pixels` and `max_pixels`, the aspect ratio kept as closely as rounding allows, computed
/// exactly as transformers' `smart_resize` (Qwen2-VL, Qwen2.5-VL) does: each side snapped to the
/// nearest multiple, ties to even as Python's `round` breaks them (70 by 28 gives 56, not 84);
/// then, when the area is over `max_pixels`, both sides scaled down by the same factor and
/// floored to a multiple (at least one), or, when under `min_pixels`, scaled up and ceiled.
///
/// Returns `(height, width)`. Fails on zero sizes, an empty pixel range, an aspect ratio above
/// 200 (as transformers does), or a result with a zero side or over `max_pixels` (transformers
/// would return those when `min_pixels` is 0 or near `max_pixels`; no encoder takes them).
pub fn smart_resize(
    height: u32,
    width: u32,
    factor: u32,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(u32, u32)> {
    if height == 0 || width == 0 || factor == 0 {
        return Err(Error::InvalidConfig(format!(
            "smart_resize of {width}x{height} by factor {factor}"
        )));
    }
    let unit = u64::from(factor) * u64::from(factor);
    if max_pixels < unit || min_pixels > max_pixels {
        return Err(Error::InvalidConfig(format!(
            "pixel range {min_pixels}..={max_pixels} cannot hold one {factor}x{factor} patch"
        )));
    }
    let (h, w, f) = (f64::from(height), f64::from(width), f64::from(factor));
    // Python's int / int is correctly rounded, as f64 division of these exact integers is.
    if h.max(w) / h.min(w) > 200.0 {
        return Err(Error::InvalidConfig(format!(
            "aspect ratio of {width}x{height} exceeds 200"
        )));
    }
    let snap = |v: f64| (v / f).round_ties_even() * f;
    let (mut h_bar, mut w_bar) = (snap(h), snap(w));
    // Both products are exact: every operand is an integer below 2^32.
    if h_bar * w_bar > max_pixels as f64 {
        let beta = (h * w / max_pixels as f64).sqrt();
        h_bar = (h / beta / f).floor().max(1.0) * f;
        w_bar = (w / beta / f).floor().max(1.0) * f;
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    if h_bar < 1.0 || w_bar < 1.0 || h_bar * w_bar > max_pixels as f64 {
        return Err(Error::InvalidConfig(format!(
            "smart_resize of {width}x{height} by factor {factor} within {min_pixels}..={max_pixels} \
             pixels gives {w_bar}x{h_bar}"
        )));
    }
    Ok((h_bar as u32, w_bar as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_follows_the_aspect_ratio() {
        assert_eq!(
            tile_grid(1000, 1000, 500, 4).unwrap(),
            TileGrid { cols: 2, rows: 2 }
        );
        assert_eq!(
            tile_grid(2000, 500, 500, 4).unwrap(),
            TileGrid { cols: 4, rows: 1 }
        );
        assert_eq!(
            tile_grid(500, 1000, 500, 4).unwrap(),
            TileGrid { cols: 1, rows: 2 }
        );
        // A small image needs one tile, not four upscaled ones.
        assert_eq!(
            tile_grid(300, 300, 500, 4).unwrap(),
            TileGrid { cols: 1, rows: 1 }
        );
        assert!(tile_grid(0, 10, 500, 4).is_err());
    }

    #[test]
    fn tiles_cover_the_image_in_row_major_order() {
        let (w, h) = (4u32, 2u32);
        let data: Vec<f32> = (0..3 * w * h).map(|i| i as f32).collect();
        let px = PixelValues {
            data,
            height: h,
            width: w,
        };
        let tiles = split_tiles(&px, 2, 2).unwrap();
        assert_eq!(tiles.len(), 2);
        for (i, tile) in tiles.iter().enumerate() {
            for c in 0..3 {
                for y in 0..2 {
                    for x in 0..2 {
                        assert_eq!(tile.get(c, y, x), px.get(c, y, x + 2 * i as u32));
                    }
                }
            }
        }
        assert!(split_tiles(&px, 3, 2).is_err());
    }

    #[test]
    fn smart_resize_snaps_to_patches_within_budget() {
        let (h, w) = smart_resize(1080, 1920, 28, 56 * 56, 28 * 28 * 1280).unwrap();
        assert_eq!((h % 28, w % 28), (0, 0));
        assert!(u64::from(h) * u64::from(w) <= 28 * 28 * 1280);
        let (h, w) = smart_resize(10, 10, 28, 56 * 56, 28 * 28 * 1280).unwrap();
        assert!(u64::from(h) * u64::from(w) >= 56 * 56);
        assert!(smart_resize(1, 1000, 28, 0, 1 << 20).is_err());
        // Python's round: 70 / 28 = 2.5 goes to 2, 98 / 28 = 3.5 to 4.
        assert_eq!(smart_resize(70, 98, 28, 0, 1 << 20).unwrap(), (56, 112));
        // A side that snaps to 0 is left for the minimum to lift, as transformers does.
        assert_eq!(
            smart_resize(10, 1900, 28, 56 * 56, 28 * 28 * 1280).unwrap(),
            (28, 784)
        );
        // With no minimum that side stays 0: refused rather than returned.
        assert!(smart_resize(10, 1900, 28, 0, 28 * 28 * 1280).is_err());
    }
}
