//! Band-limited resampling of a mono clip to a model's rate, through `rubato`.
//!
//! Rate pairs with a small common period (44.1 kHz, 48 kHz, 22.05 kHz, 8 kHz to 16 kHz, ...)
//! go through rubato's FFT resampler, whose anti-aliasing filter is fast and steep. A pair whose
//! period is long (say 44 101 Hz, a prime-ish rate) would need a huge FFT there, so it goes
//! through the windowed-sinc resampler instead, which handles any ratio at a fixed cost per
//! sample.

use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{
    Async, Fft, FixedAsync, FixedSync, Resampler, SincInterpolationParameters,
    SincInterpolationType, WindowFunction,
};

use crate::audio::AudioClip;
use crate::audio::wav::MAX_SAMPLE_MAGNITUDE;
use crate::error::{Error, Result};

/// Largest per-block period (rate / gcd) handed to the FFT resampler.
const MAX_FFT_PERIOD: usize = 4096;
/// Frames per processing chunk.
const CHUNK: usize = 1024;

/// Resamples `clip` to `target_rate`, keeping content below the lower Nyquist frequency and
/// suppressing what lies above it. Output length is `ceil(len * target / source)`.
///
/// Fails with [`Error::EmptyAudio`] on an empty clip and [`Error::Resample`] on a zero rate, a
/// sample that is not finite or beyond 1024 in magnitude, or a resampler failure.
pub fn resample(clip: &AudioClip, target_rate: u32) -> Result<AudioClip> {
    let from = clip.sample_rate;
    let to = target_rate;
    let fail = |message: String| Error::Resample { from, to, message };
    if from == 0 || to == 0 {
        return Err(fail("sample rates must be positive".into()));
    }
    if clip.samples.is_empty() {
        return Err(Error::EmptyAudio);
    }
    // Non-finite or enormous samples would turn into NaN inside the FFT, which rubato answers
    // with a panic; a clip from `decode_wav` never holds them, a hand-built one might.
    if let Some(bad) = clip
        .samples
        .iter()
        .find(|s| !s.is_finite() || f64::from(s.abs()) > MAX_SAMPLE_MAGNITUDE)
    {
        return Err(fail(format!(
            "sample {bad} is not finite or beyond {MAX_SAMPLE_MAGNITUDE}"
        )));
    }
    if from == to {
        return Ok(clip.clone());
    }
    let len = clip.samples.len();
    let input =
        InterleavedSlice::new(&clip.samples[..], 1, len).map_err(|e| fail(e.to_string()))?;
    let gcd = gcd(from as usize, to as usize);
    let mut resampler: Box<dyn Resampler<f32>> =
        if from as usize / gcd <= MAX_FFT_PERIOD && to as usize / gcd <= MAX_FFT_PERIOD {
            Box::new(
                Fft::<f32>::new(from as usize, to as usize, CHUNK, 1, FixedSync::Input)
                    .map_err(|e| fail(e.to_string()))?,
            )
        } else {
            let params = SincInterpolationParameters::new(256, WindowFunction::BlackmanHarris2)
                .oversampling_factor(256)
                .interpolation(SincInterpolationType::Cubic);
            let ratio = f64::from(to) / f64::from(from);
            Box::new(
                Async::<f32>::new_sinc(ratio, 1.0, &params, CHUNK, 1, FixedAsync::Input)
                    .map_err(|e| fail(e.to_string()))?,
            )
        };
    let output = resampler
        .process_all(&input, len, None)
        .map_err(|e| fail(e.to_string()))?;
    Ok(AudioClip {
        samples: output.take_data(),
        sample_rate: to,
    })
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_follow_the_ratio() {
        for (from, to) in [
            (48_000, 16_000),
            (44_100, 16_000),
            (8_000, 16_000),
            (44_101, 16_000),
        ] {
            let clip = AudioClip {
                samples: vec![0.0; from as usize / 2],
                sample_rate: from,
            };
            let out = resample(&clip, to).unwrap();
            let want =
                (clip.samples.len() as u64 * u64::from(to)).div_ceil(u64::from(from)) as usize;
            assert_eq!(out.samples.len(), want, "{from} -> {to}");
            assert_eq!(out.sample_rate, to);
        }
    }

    #[test]
    fn short_and_degenerate_inputs() {
        let one = AudioClip {
            samples: vec![0.5],
            sample_rate: 48_000,
        };
        assert_eq!(resample(&one, 16_000).unwrap().samples.len(), 1);
        let empty = AudioClip {
            samples: vec![],
            sample_rate: 48_000,
        };
        assert!(matches!(resample(&empty, 16_000), Err(Error::EmptyAudio)));
        assert!(matches!(resample(&one, 0), Err(Error::Resample { .. })));
        assert_eq!(resample(&one, 48_000).unwrap(), one);
        for bad in [f32::NAN, f32::INFINITY, 3e38] {
            let clip = AudioClip {
                samples: vec![0.0, bad, 0.0],
                sample_rate: 48_000,
            };
            assert!(
                matches!(resample(&clip, 16_000), Err(Error::Resample { .. })),
                "{bad}"
            );
        }
    }
}
