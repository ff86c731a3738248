//! An image from a request to model input: Ollama's base64 `images` entry is decoded and
//! checked, the image is resized and normalized for a vision encoder, and it gets a content id
//! for the prefix cache; payloads that are not images, or too large, are refused with a reason.
//!
//! ```sh
//! cargo run --example image_intake   # from media
//! ```
//!
//! The image is drawn and PNG-encoded in memory, standing in for a client's upload.

use std::io::Cursor;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use image::{DynamicImage, ImageFormat, Rgb, RgbImage};
use media::{
    DEFAULT_MAX_PAYLOAD_BYTES, ImageLimits, ImageProcessorConfig, decode_ollama_image, detect,
    prepare_image,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A 64x48 picture: red growing left to right, blue top to bottom.
    let picture = RgbImage::from_fn(64, 48, |x, y| Rgb([(x * 4) as u8, 0, (y * 5) as u8]));
    let mut png = Vec::new();
    DynamicImage::ImageRgb8(picture).write_to(&mut Cursor::new(&mut png), ImageFormat::Png)?;
    let payload = STANDARD.encode(&png);

    // The request's string becomes bytes only if it is base64 of an image within the limit.
    let bytes = decode_ollama_image(&payload, DEFAULT_MAX_PAYLOAD_BYTES)?;
    println!(
        "payload: {} base64 chars → {} bytes, {:?}",
        payload.len(),
        bytes.len(),
        detect(&bytes)?
    );

    // SigLIP-style preprocessing: stretch to 32x32, map [0, 255] to [-1, 1], channel first.
    let config = ImageProcessorConfig::siglip(32);
    let prepared = prepare_image(&bytes, &ImageLimits::default(), &config)?;
    let pixels = &prepared.pixels;
    println!(
        "prepared: {:?} → [3, {}, {}], {} values",
        prepared.original_size,
        pixels.height,
        pixels.width,
        pixels.data.len()
    );
    let corner = |c, y, x| pixels.get(c, y, x).unwrap_or(f32::NAN);
    println!(
        "red at left/right edge: {:.2} / {:.2}; blue at top/bottom edge: {:.2} / {:.2}",
        corner(0, 16, 0),
        corner(0, 16, 31),
        corner(2, 0, 16),
        corner(2, 31, 16)
    );

    // The id covers the bytes and the preprocessing: the same upload for a model with another
    // image processor must not hit the same cache entry.
    let clip = prepare_image(
        &bytes,
        &ImageLimits::default(),
        &ImageProcessorConfig::clip(32),
    )?;
    println!(
        "id {}…, token key {:#x}; same bytes under CLIP preprocessing: {}…",
        &prepared.id.to_hex()[..16],
        prepared.id.token_key(),
        &clip.id.to_hex()[..16]
    );

    // Untrusted input is refused with a reason, never a panic. The size check reads only the
    // header, before any pixel buffer exists.
    let small = ImageLimits {
        max_width: 32,
        ..ImageLimits::default()
    };
    let refusals = [
        (
            "text sent as an image",
            decode_ollama_image(&STANDARD.encode("hello, world"), DEFAULT_MAX_PAYLOAD_BYTES).err(),
        ),
        (
            "a payload over a 256-byte limit",
            decode_ollama_image(&payload, 256).err(),
        ),
        (
            "image wider than 32 px",
            prepare_image(&bytes, &small, &config).err(),
        ),
    ];
    for (what, error) in refusals {
        let error = error.ok_or(format!("{what} should have been refused"))?;
        println!("refused {what}: {error}");
    }
    Ok(())
}
