//! Image decoding under limits: the header's dimensions are checked before any pixel buffer is
//! allocated, and the decoder itself runs with `image::Limits` as a second fence.

use std::io::Cursor;

use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageReader, RgbImage};

use super::jpeg;
use crate::detect::{ImageFormat, MediaFormat, detect};
use crate::error::{Error, Modality, Result};

/// Bounds on what an untrusted image may make us allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Largest accepted width in pixels.
    pub max_width: u32,
    /// Largest accepted height in pixels.
    pub max_height: u32,
    /// Largest accepted `width * height`.
    pub max_pixels: u64,
    /// Largest total the decoder may allocate: its native buffer plus the RGB8 copy.
    pub max_decoded_bytes: u64,
}

impl Default for ImageLimits {
    /// 8192 pixels a side, 40 megapixels, 512 MiB decoded: beyond any vision encoder's input,
    /// below what would threaten a server.
    fn default() -> Self {
        ImageLimits {
            max_width: 8192,
            max_height: 8192,
            max_pixels: 40_000_000,
            max_decoded_bytes: 512 << 20,
        }
    }
}

/// Decodes an image (PNG, JPEG, WebP, first GIF frame) to 8-bit RGB. JPEG pixels come from
/// libjpeg-turbo, as in Pillow ([`jpeg`](super::jpeg)).
///
/// Transparent pixels are composited onto white, so a logo with an alpha channel looks as it
/// does in a browser rather than exposing whatever colour sits under alpha 0.
/// An EXIF orientation is applied, as the reference preprocessors' image loading does, so a
/// phone photo reaches the encoder upright.
///
/// Fails when the bytes are not an image ([`Error::WrongModality`], [`Error::UnrecognizedFormat`]),
/// when the header's dimensions break `limits` ([`Error::ImageTooLarge`], before decoding), or when
/// the decoder rejects the data ([`Error::ImageDecode`]).
pub fn decode_image(bytes: &[u8], limits: &ImageLimits) -> Result<RgbImage> {
    let format = image_format(bytes)?;
    let decode_err = |e: image::ImageError| Error::ImageDecode {
        format: format.name(),
        message: e.to_string().trim_end().to_string(),
    };

    let mut decoder = header_decoder(bytes, format, limits)?;
    // The image crate's own limits are the second fence, for allocations we cannot predict.
    decoder
        .set_limits(image_crate_limits(limits))
        .map_err(decode_err)?;
    // Unreadable metadata only costs the rotation; the pixels are still usable.
    let orientation = decoder.orientation().unwrap_or(Orientation::NoTransforms);
    let (width, height) = decoder.dimensions();
    let libjpeg = match format {
        ImageFormat::Jpeg => jpeg::decode_rgb(bytes, width, height)?,
        _ => None,
    };
    let decoded = match libjpeg {
        Some(rgb) => DynamicImage::ImageRgb8(rgb),
        None => DynamicImage::from_decoder(decoder).map_err(decode_err)?,
    };
    let mut rgb = DynamicImage::ImageRgb8(into_rgb_on_white(decoded));
    rgb.apply_orientation(orientation);
    Ok(rgb.into_rgb8())
}

/// Reads only the header and returns `(width, height)`, checked against `limits`.
pub fn image_dimensions(bytes: &[u8], limits: &ImageLimits) -> Result<(u32, u32)> {
    let format = image_format(bytes)?;
    Ok(header_decoder(bytes, format, limits)?.dimensions())
}

/// The size [`decode_image`] gives, `(width, height)`, from the header and its EXIF
/// orientation alone (a quarter turn swaps the sides), checked against `limits`: what a
/// dynamic-resolution model's prompt needs to lay out an image's tokens before its pixels
/// are decoded.
pub fn upright_dimensions(bytes: &[u8], limits: &ImageLimits) -> Result<(u32, u32)> {
    let format = image_format(bytes)?;
    let mut decoder = header_decoder(bytes, format, limits)?;
    let (width, height) = decoder.dimensions();
    // As decode_image: unreadable metadata leaves the image as stored.
    let orientation = decoder.orientation().unwrap_or(Orientation::NoTransforms);
    Ok(match orientation {
        Orientation::Rotate90
        | Orientation::Rotate270
        | Orientation::Rotate90FlipH
        | Orientation::Rotate270FlipH => (height, width),
        _ => (width, height),
    })
}

fn image_format(bytes: &[u8]) -> Result<ImageFormat> {
    match detect(bytes)? {
        MediaFormat::Image(format) => Ok(format),
        other => Err(Error::WrongModality {
            expected: Modality::Image,
            found: other.modality(),
        }),
    }
}

/// A decoder that has read the header only, whose dimensions passed `limits`.
fn header_decoder<'a>(
    bytes: &'a [u8],
    format: ImageFormat,
    limits: &ImageLimits,
) -> Result<impl ImageDecoder + 'a> {
    let mut reader = ImageReader::with_format(Cursor::new(bytes), to_image_crate(format));
    // Only the allocation cap here, so that oversized dimensions reach our own check and its
    // specific error rather than the image crate's generic one.
    let mut alloc_only = image::Limits::no_limits();
    alloc_only.max_alloc = Some(limits.max_decoded_bytes);
    reader.limits(alloc_only);
    let decoder = reader.into_decoder().map_err(|e| Error::ImageDecode {
        format: format.name(),
        message: e.to_string().trim_end().to_string(),
    })?;
    let (width, height) = decoder.dimensions();
    check_dimensions(width, height, decoder.total_bytes(), limits)?;
    Ok(decoder)
}

fn check_dimensions(
    width: u32,
    height: u32,
    native_bytes: u64,
    limits: &ImageLimits,
) -> Result<()> {
    let too_large = |reason| {
        Err(Error::ImageTooLarge {
            width,
            height,
            reason,
        })
    };
    if width == 0 || height == 0 {
        return too_large("zero dimension");
    }
    if width > limits.max_width {
        return too_large("width above max_width");
    }
    if height > limits.max_height {
        return too_large("height above max_height");
    }
    let pixels = u64::from(width) * u64::from(height);
    if pixels > limits.max_pixels {
        return too_large("pixel count above max_pixels");
    }
    // The native buffer and the RGB8 copy we make from it coexist for a moment, and so do that
    // copy and its rotated twin when EXIF asks for a quarter turn.
    let decoded = native_bytes.max(pixels * 3).saturating_add(pixels * 3);
    if decoded > limits.max_decoded_bytes {
        return too_large("decoded size above max_decoded_bytes");
    }
    Ok(())
}

fn image_crate_limits(limits: &ImageLimits) -> image::Limits {
    let mut out = image::Limits::default();
    out.max_image_width = Some(limits.max_width);
    out.max_image_height = Some(limits.max_height);
    out.max_alloc = Some(limits.max_decoded_bytes);
    out
}

fn to_image_crate(format: ImageFormat) -> image::ImageFormat {
    match format {
        ImageFormat::Png => image::ImageFormat::Png,
        ImageFormat::Jpeg => image::ImageFormat::Jpeg,
        ImageFormat::WebP => image::ImageFormat::WebP,
        ImageFormat::Gif => image::ImageFormat::Gif,
    }
}

fn into_rgb_on_white(image: DynamicImage) -> RgbImage {
    if !image.color().has_alpha() {
        return image.into_rgb8();
    }
    let rgba = image.into_rgba8();
    let (width, height) = rgba.dimensions();
    let mut rgb = RgbImage::new(width, height);
    for (dst, src) in rgb.pixels_mut().zip(rgba.pixels()) {
        let alpha = u32::from(src[3]);
        for c in 0..3 {
            // Rounded integer blend with white: (v*a + 255*(255-a)) / 255.
            let blended = (u32::from(src[c]) * alpha + 255 * (255 - alpha) + 127) / 255;
            dst[c] = blended as u8;
        }
    }
    rgb
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{ImageEncoder, Rgba, RgbaImage};

    fn png_rgba(image: &RgbaImage) -> Vec<u8> {
        let mut out = Vec::new();
        image::codecs::png::PngEncoder::new(&mut out)
            .write_image(
                image.as_raw(),
                image.width(),
                image.height(),
                image::ExtendedColorType::Rgba8,
            )
            .unwrap();
        out
    }

    #[test]
    fn transparent_pixels_become_white_and_opaque_ones_keep_colour() {
        let mut src = RgbaImage::new(2, 1);
        src.put_pixel(0, 0, Rgba([10, 20, 30, 0]));
        src.put_pixel(1, 0, Rgba([10, 20, 30, 255]));
        let rgb = decode_image(&png_rgba(&src), &ImageLimits::default()).unwrap();
        assert_eq!(rgb.get_pixel(0, 0).0, [255, 255, 255]);
        assert_eq!(rgb.get_pixel(1, 0).0, [10, 20, 30]);
    }

    #[test]
    fn limits_are_checked_from_the_header() {
        let src = RgbaImage::new(64, 32);
        let bytes = png_rgba(&src);
        assert_eq!(
            image_dimensions(&bytes, &ImageLimits::default()).unwrap(),
            (64, 32)
        );
        let narrow = ImageLimits {
            max_width: 63,
            ..ImageLimits::default()
        };
        assert!(matches!(
            decode_image(&bytes, &narrow),
            Err(Error::ImageTooLarge { .. })
        ));
        let few = ImageLimits {
            max_pixels: 64 * 32 - 1,
            ..ImageLimits::default()
        };
        assert!(matches!(
            decode_image(&bytes, &few),
            Err(Error::ImageTooLarge { .. })
        ));
        let small = ImageLimits {
            max_decoded_bytes: 64 * 32 * 4,
            ..ImageLimits::default()
        };
        assert!(matches!(
            decode_image(&bytes, &small),
            Err(Error::ImageTooLarge { .. })
        ));
    }

    /// A minimal little-endian TIFF/EXIF block holding only an orientation tag.
    fn exif_orientation(value: u16) -> Vec<u8> {
        let mut exif = b"II*\0".to_vec();
        exif.extend_from_slice(&8u32.to_le_bytes());
        exif.extend_from_slice(&1u16.to_le_bytes());
        exif.extend_from_slice(&0x0112u16.to_le_bytes());
        exif.extend_from_slice(&3u16.to_le_bytes());
        exif.extend_from_slice(&1u32.to_le_bytes());
        exif.extend_from_slice(&value.to_le_bytes());
        exif.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        exif
    }

    #[test]
    fn exif_orientation_is_applied() {
        // Left half red, right half blue; orientation 6 means "rotate 90 degrees clockwise to
        // display", which puts the left half on top.
        let src = image::RgbImage::from_fn(32, 16, |x, _| {
            if x < 16 {
                image::Rgb([255, 0, 0])
            } else {
                image::Rgb([0, 0, 255])
            }
        });
        let mut bytes = Vec::new();
        let mut encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 95);
        encoder.set_exif_metadata(exif_orientation(6)).unwrap();
        encoder
            .write_image(src.as_raw(), 32, 16, image::ExtendedColorType::Rgb8)
            .unwrap();
        let rgb = decode_image(&bytes, &ImageLimits::default()).unwrap();
        assert_eq!(rgb.dimensions(), (16, 32));
        let limits = ImageLimits::default();
        assert_eq!(image_dimensions(&bytes, &limits).unwrap(), (32, 16));
        assert_eq!(upright_dimensions(&bytes, &limits).unwrap(), (16, 32));
        let top = rgb.get_pixel(8, 4).0;
        let bottom = rgb.get_pixel(8, 27).0;
        assert!(top[0] > 200 && top[2] < 50, "top {top:?}");
        assert!(bottom[2] > 200 && bottom[0] < 50, "bottom {bottom:?}");
    }

    #[test]
    fn audio_is_not_an_image() {
        let wav = b"RIFF\x04\0\0\0WAVE";
        assert!(matches!(
            decode_image(wav, &ImageLimits::default()),
            Err(Error::WrongModality {
                expected: Modality::Image,
                found: Modality::Audio
            })
        ));
    }
}
