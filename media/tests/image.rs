//! Image decoding across formats, and the decode-plus-preprocess path end to end.

mod support;

use image::{ImageEncoder, Rgb, RgbImage};
use media::{
    Error, Fit, ImageLimits, ImageProcessorConfig, Modality, decode_image, image_dimensions,
    prepare_image,
};

fn mean_abs_diff(a: &RgbImage, b: &RgbImage) -> f64 {
    assert_eq!(a.dimensions(), b.dimensions());
    let total: u64 = a
        .as_raw()
        .iter()
        .zip(b.as_raw())
        .map(|(x, y)| u64::from(x.abs_diff(*y)))
        .sum();
    total as f64 / a.as_raw().len() as f64
}

#[test]
fn lossless_formats_round_trip_exactly() {
    let src = support::pattern(37, 23);
    let limits = ImageLimits::default();
    assert_eq!(decode_image(&support::png(&src), &limits).unwrap(), src);
    assert_eq!(
        decode_image(&support::webp_lossless(&src), &limits).unwrap(),
        src
    );
}

#[test]
fn jpeg_decodes_close_to_the_source() {
    let src = support::pattern(64, 48);
    let decoded = decode_image(&support::jpeg(&src, 95), &ImageLimits::default()).unwrap();
    assert!(mean_abs_diff(&decoded, &src) < 2.0);
}

#[test]
fn a_jpeg_cut_inside_its_scan_is_refused_as_truncated() {
    // Headers whole, entropy-coded data cut short: libjpeg would fill the rest with grey.
    let bytes = support::jpeg(&support::pattern(64, 64), 95);
    let cut = &bytes[..bytes.len() * 4 / 5];
    let err = decode_image(cut, &ImageLimits::default()).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn a_jpeg_of_too_many_scans_is_refused_before_decoding() {
    // A comment segment holding 501 start-of-scan pairs right after the start of image.
    let good = support::jpeg(&support::pattern(16, 16), 90);
    let payload: Vec<u8> = std::iter::repeat_n([0xFF, 0xDA], 501).flatten().collect();
    let mut bytes = good[..2].to_vec();
    bytes.extend_from_slice(&[0xFF, 0xFE]);
    bytes.extend_from_slice(&((payload.len() + 2) as u16).to_be_bytes());
    bytes.extend_from_slice(&payload);
    bytes.extend_from_slice(&good[2..]);
    let err = decode_image(&bytes, &ImageLimits::default()).unwrap_err();
    assert!(err.to_string().contains("scans"), "{err}");
}

#[test]
fn grey_and_cmyk_jpegs_become_rgb8() {
    let mut grey = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut grey, 100)
        .write_image(&[200; 64], 8, 8, image::ExtendedColorType::L8)
        .unwrap();
    let decoded = decode_image(&grey, &ImageLimits::default()).unwrap();
    assert!(
        decoded.pixels().all(|p| p.0 == [200, 200, 200]),
        "{:?}",
        decoded.get_pixel(0, 0)
    );

    // libjpeg does not convert CMYK to RGB: the `image` crate decodes those.
    let mut cmyk = mozjpeg::Compress::new(mozjpeg::ColorSpace::JCS_CMYK);
    cmyk.set_size(8, 8);
    cmyk.set_quality(100.0);
    let mut started = cmyk.start_compress(Vec::new()).unwrap();
    started.write_scanlines(&[0u8; 8 * 8 * 4]).unwrap();
    let bytes = started.finish().unwrap();
    let decoded = decode_image(&bytes, &ImageLimits::default()).unwrap();
    assert_eq!(decoded.dimensions(), (8, 8));
}

#[test]
fn gif_uses_the_first_frame() {
    let bytes = support::gif(8, 8, &[[255, 0, 0], [0, 0, 255]]);
    let decoded = decode_image(&bytes, &ImageLimits::default()).unwrap();
    assert_eq!(decoded.dimensions(), (8, 8));
    assert!(
        decoded.pixels().all(|p| p.0 == [255, 0, 0]),
        "{:?}",
        decoded.get_pixel(0, 0)
    );
}

#[test]
fn grey_and_sixteen_bit_pngs_become_rgb8() {
    let mut grey = Vec::new();
    image::codecs::png::PngEncoder::new(&mut grey)
        .write_image(&[0, 128, 255, 64], 2, 2, image::ExtendedColorType::L8)
        .unwrap();
    let decoded = decode_image(&grey, &ImageLimits::default()).unwrap();
    assert_eq!(decoded.get_pixel(1, 0).0, [128, 128, 128]);

    let mut wide = Vec::new();
    let raw: Vec<u8> = [0xFFFFu16, 0x0000, 0x8080]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect();
    image::codecs::png::PngEncoder::new(&mut wide)
        .write_image(&raw, 1, 1, image::ExtendedColorType::Rgb16)
        .unwrap();
    let decoded = decode_image(&wide, &ImageLimits::default()).unwrap();
    assert_eq!(decoded.get_pixel(0, 0).0, [255, 0, 128]);
}

#[test]
fn dimensions_come_from_the_header() {
    let bytes = support::jpeg(&support::pattern(300, 200), 80);
    assert_eq!(
        image_dimensions(&bytes, &ImageLimits::default()).unwrap(),
        (300, 200)
    );
    let small = ImageLimits {
        max_height: 199,
        ..ImageLimits::default()
    };
    assert!(matches!(
        image_dimensions(&bytes, &small),
        Err(Error::ImageTooLarge { .. })
    ));
}

#[test]
fn prepare_image_gives_pixels_and_a_stable_identity() {
    let bytes = support::png(&RgbImage::from_pixel(40, 20, Rgb([255, 0, 0])));
    let config = ImageProcessorConfig {
        fit: Fit::Pad { fill: [0, 0, 0] },
        ..ImageProcessorConfig::siglip(16)
    };
    let prepared = prepare_image(&bytes, &ImageLimits::default(), &config).unwrap();
    assert_eq!(prepared.original_size, (40, 20));
    assert_eq!((prepared.pixels.width, prepared.pixels.height), (16, 16));
    // Centre is red: R = +1, G = B = -1; the top padding row is black: all -1.
    assert_eq!(prepared.pixels.get(0, 8, 8), Some(1.0));
    assert_eq!(prepared.pixels.get(1, 8, 8), Some(-1.0));
    assert_eq!(prepared.pixels.get(0, 0, 8), Some(-1.0));

    let again = prepare_image(&bytes, &ImageLimits::default(), &config).unwrap();
    assert_eq!(prepared.id, again.id);
    let other = prepare_image(
        &bytes,
        &ImageLimits::default(),
        &ImageProcessorConfig::siglip(32),
    )
    .unwrap();
    assert_ne!(
        prepared.id, other.id,
        "a different preprocessing shape is a different cache entry"
    );
}

#[test]
fn wav_bytes_are_not_an_image() {
    let wav = support::wav(&support::WavSpec::pcm(1, 16_000, 16), &[0, 0]);
    assert!(matches!(
        decode_image(&wav, &ImageLimits::default()),
        Err(Error::WrongModality {
            expected: Modality::Image,
            found: Modality::Audio
        })
    ));
}

#[test]
fn patches_tile_the_grid_the_header_announces() {
    // 37x23 under Qwen2-VL's processor with 4-pixel patches merged 2x2 and a small budget:
    // the grid the prompt lays out (from the header alone) is the one the patches tile.
    let config = media::PatchProcessorConfig {
        patch_size: 4,
        min_pixels: 1024,
        max_pixels: 4096,
        ..media::PatchProcessorConfig::qwen2_vl()
    };
    let bytes = support::png(&support::pattern(37, 23));
    let limits = ImageLimits::default();
    let (width, height) = media::upright_dimensions(&bytes, &limits).unwrap();
    let grid = config.grid(width, height).unwrap();
    let prepared = media::prepare_image_patches(&bytes, &limits, &config).unwrap();
    assert_eq!(prepared.patches.grid, grid);
    // 851 pixels, under min_pixels: scaled up to 32x48 (ceil to multiples of 8).
    assert_eq!((grid.h, grid.w), (8, 12));
    assert_eq!(
        prepared.patches.data.len(),
        grid.patches() * prepared.patches.patch_len
    );
    assert_eq!(prepared.original_size, (37, 23));
    // Another budget is another identity: the grid, hence the prompt, may differ.
    let other = media::PatchProcessorConfig {
        max_pixels: 8192,
        ..config
    };
    let again = media::prepare_image_patches(&bytes, &limits, &other).unwrap();
    assert_ne!(again.id, prepared.id);
}
