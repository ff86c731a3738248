//! Any bytes through the RIFF walk, WAV decoding, resampling to 16 kHz and splitting: errors
//! are fine, panics and allocations beyond the limits are not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use media::{AudioLimits, decode_wav, resample, split};

const LIMITS: AudioLimits = AudioLimits {
    max_seconds: 60.0,
    min_sample_rate: 1_000,
    max_sample_rate: 768_000,
    max_channels: 64,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(clip) = decode_wav(data, &LIMITS) {
        if let Ok(at_16k) = resample(&clip, 16_000) {
            let _ = split(&at_16k, 1.0);
        }
    }
});
