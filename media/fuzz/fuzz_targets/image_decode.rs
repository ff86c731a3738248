//! Any bytes through image detection, header checks, decoding and preprocessing: errors are
//! fine, panics and allocations beyond the limits are not (libFuzzer's `-rss_limit_mb` and
//! `-malloc_limit_mb` catch the latter).
#![no_main]

use libfuzzer_sys::fuzz_target;
use media::{ImageLimits, ImageProcessorConfig, decode_image, preprocess};

const LIMITS: ImageLimits = ImageLimits {
    max_width: 2048,
    max_height: 2048,
    max_pixels: 4 << 20,
    max_decoded_bytes: 64 << 20,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(rgb) = decode_image(data, &LIMITS) {
        let _ = preprocess(&rgb, &ImageProcessorConfig::clip(32));
    }
});
