//! Whisper's log-mel features: what `WhisperFeatureExtractor` (transformers 5.24) hands
//! Whisper-style audio encoders (Whisper, Qwen2-Audio, Voxtral), computed here in f64.
//!
//! The clip is cut or zero-padded to `chunk_length` seconds; a short-time Fourier transform
//! takes `n_fft`-sample frames every `hop_length` samples under a periodic Hann window, the
//! signal reflected at both ends so frame `t` is centred on sample `t · hop_length` (torch's
//! `stft(center=True)`), and the last frame is dropped, leaving `n_samples / hop_length`
//! frames (3000 for 30 s). The power spectrum goes through a Slaney-style mel filterbank
//! (`feature_size` triangles from 0 to 8 kHz on the Slaney mel scale, each scaled to unit area
//! in Hz), then `log10` with a floor of 1e-10, clamped to 8 below the clip's largest value,
//! and mapped by `(x + 4) / 4`.
//!
//! transformers takes that path in f32 through torch when torch is installed and in f64
//! through numpy otherwise; the two differ by up to ~4e-5 on quiet bins. Working in f64 and
//! rounding once puts these features within ~1e-6 of the numpy path (see
//! `tests/whisper_features.rs` for the measured bounds).

use std::sync::Arc;

use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};

use crate::audio::wav::MAX_SAMPLE_MAGNITUDE;
use crate::audio::{AudioClip, AudioLimits};
use crate::error::{Error, Result};

/// Most mel bins a config may ask for (Whisper uses 80, large-v3 and Qwen2-Audio 128).
const MAX_FEATURE_SIZE: usize = 512;
/// Largest FFT a config may ask for (Whisper uses 400).
const MAX_N_FFT: usize = 1 << 14;
/// Most samples in one chunk (Whisper's is 480 000: 30 s at 16 kHz); about 17 minutes there.
const MAX_CHUNK_SAMPLES: usize = 1 << 24;
/// Most values in one output (Whisper's is 80 × 3000): 256 MiB of f32.
const MAX_OUTPUT_VALUES: usize = 1 << 26;
/// Highest frequency the filterbank covers, fixed by `WhisperFeatureExtractor`.
const MEL_MAX_HZ: f64 = 8000.0;
/// `log10` floor: silence maps to -10 before the clamp.
const LOG_FLOOR: f64 = 1e-10;
/// The dynamic range kept below the loudest value, in `log10` units (80 dB).
const DYNAMIC_RANGE: f64 = 8.0;

/// The parameters of a Whisper feature extractor, as its `preprocessor_config.json` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogMelConfig {
    /// `feature_size`: mel bins.
    pub feature_size: usize,
    /// `sampling_rate`: the rate clips must already have.
    pub sampling_rate: u32,
    /// `hop_length`: samples between frames.
    pub hop_length: usize,
    /// `n_fft`: samples per frame, and the window's length.
    pub n_fft: usize,
    /// `chunk_length`: seconds every clip is cut or padded to.
    pub chunk_length: usize,
}

impl LogMelConfig {
    /// Whisper's extractor with `feature_size` mel bins: 16 kHz, 400-sample frames every 160
    /// samples, 30 s chunks.
    pub fn whisper(feature_size: usize) -> LogMelConfig {
        LogMelConfig {
            feature_size,
            sampling_rate: 16_000,
            hop_length: 160,
            n_fft: 400,
            chunk_length: 30,
        }
    }

    /// Samples in a chunk: `chunk_length · sampling_rate`.
    pub fn n_samples(&self) -> usize {
        self.chunk_length
            .saturating_mul(self.sampling_rate as usize)
    }

    /// The frames of the output that hold a clip of `samples` samples rather than padding
    /// ([`LogMel::valid_frames`]): known before any features are computed, so a caller can
    /// size a prompt first.
    pub fn valid_frames(&self, samples: usize) -> usize {
        samples
            .min(self.n_samples())
            .div_ceil(self.hop_length.max(1))
            .min(self.frames())
    }

    /// Frames in the output: `n_samples / hop_length` (3000 for Whisper).
    pub fn frames(&self) -> usize {
        // Frames of a centred STFT, less the last one the extractor drops.
        self.n_samples()
            .saturating_add(2 * (self.n_fft / 2))
            .saturating_sub(self.n_fft)
            / self.hop_length.max(1)
    }

    /// Refuses parameters that are zero, or that would make one clip's output larger than
    /// the caps above, naming the field.
    pub fn check(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidConfig(format!("log-mel features: {what}")));
        if self.feature_size == 0 || self.feature_size > MAX_FEATURE_SIZE {
            return bad(format!(
                "`feature_size` = {} is outside 1..={MAX_FEATURE_SIZE}",
                self.feature_size
            ));
        }
        if self.n_fft < 2 || self.n_fft > MAX_N_FFT {
            return bad(format!(
                "`n_fft` = {} is outside 2..={MAX_N_FFT}",
                self.n_fft
            ));
        }
        if self.hop_length == 0 || self.hop_length > self.n_fft {
            return bad(format!(
                "`hop_length` = {} is outside 1..=n_fft",
                self.hop_length
            ));
        }
        if self.sampling_rate == 0 || self.chunk_length == 0 {
            return bad("`sampling_rate` and `chunk_length` must be positive".into());
        }
        let samples = self.n_samples();
        if samples > MAX_CHUNK_SAMPLES {
            return bad(format!(
                "a chunk of {} s at {} Hz is more than {MAX_CHUNK_SAMPLES} samples",
                self.chunk_length, self.sampling_rate
            ));
        }
        // Reflection at the ends needs more samples than half a frame.
        if samples <= self.n_fft / 2 {
            return bad(format!(
                "a chunk of {samples} samples is shorter than half of `n_fft` = {}",
                self.n_fft
            ));
        }
        if self.frames().saturating_mul(self.feature_size) > MAX_OUTPUT_VALUES {
            return bad(format!(
                "{} frames of {} bins are more than {MAX_OUTPUT_VALUES} values",
                self.frames(),
                self.feature_size
            ));
        }
        Ok(())
    }
}

/// Log-mel features of one clip.
#[derive(Debug, Clone, PartialEq)]
pub struct LogMel {
    /// `[feature_size, frames]`, row by row: the layout of the extractor's
    /// `input_features[0]`.
    pub features: Vec<f32>,
    /// Mel bins (rows).
    pub feature_size: usize,
    /// Frames (columns), whatever the clip's length.
    pub frames: usize,
    /// Frames that start inside the clip, `ceil(samples / hop_length)` at most `frames`: what
    /// the extractor's attention mask sums to, from which Qwen2-Audio counts its audio tokens.
    pub valid_frames: usize,
}

/// A Slaney-style mel filterbank: for each mel bin, the first FFT bin it weighs and the
/// weights from there on (every other weight is zero).
struct MelFilters {
    bands: Vec<(usize, Vec<f64>)>,
}

impl MelFilters {
    /// `mel_filter_bank(1 + n_fft / 2, feature_size, 0, 8000, sampling_rate, norm="slaney",
    /// mel_scale="slaney")`, in f64 as transformers builds it.
    fn new(config: &LogMelConfig) -> MelFilters {
        let bins = config.n_fft / 2 + 1;
        let mels = config.feature_size;
        let (lo, hi) = (hertz_to_mel(0.0), hertz_to_mel(MEL_MAX_HZ));
        // numpy's linspace: start + i · step, the last point exactly `hi`.
        let step = (hi - lo) / (mels + 1) as f64;
        let edges: Vec<f64> = (0..mels + 2)
            .map(|i| {
                let m = if i == mels + 1 {
                    hi
                } else {
                    lo + i as f64 * step
                };
                mel_to_hertz(m)
            })
            .collect();
        let nyquist = f64::from(config.sampling_rate / 2);
        let bin_step = nyquist / (bins - 1) as f64;
        let fft_freq = |k: usize| {
            if k == bins - 1 {
                nyquist
            } else {
                k as f64 * bin_step
            }
        };
        let bands = (0..mels)
            .map(|j| {
                let (left, centre, right) = (edges[j], edges[j + 1], edges[j + 2]);
                let enorm = 2.0 / (right - left);
                let weights: Vec<f64> = (0..bins)
                    .map(|k| {
                        let f = fft_freq(k);
                        let down = (f - left) / (centre - left);
                        let up = (right - f) / (right - centre);
                        down.min(up).max(0.0) * enorm
                    })
                    .collect();
                let start = weights.iter().position(|&w| w > 0.0).unwrap_or(bins);
                let end = weights
                    .iter()
                    .rposition(|&w| w > 0.0)
                    .map_or(start, |e| e + 1);
                (start, weights[start..end].to_vec())
            })
            .collect();
        MelFilters { bands }
    }
}

/// Slaney's mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above.
fn hertz_to_mel(hz: f64) -> f64 {
    if hz >= 1000.0 {
        15.0 + (hz / 1000.0).ln() * (27.0 / 6.4f64.ln())
    } else {
        3.0 * hz / 200.0
    }
}

/// The inverse of [`hertz_to_mel`].
fn mel_to_hertz(mel: f64) -> f64 {
    if mel >= 15.0 {
        1000.0 * ((6.4f64.ln() / 27.0) * (mel - 15.0)).exp()
    } else {
        200.0 * mel / 3.0
    }
}

/// The log-mel features of `clip` as `WhisperFeatureExtractor` computes them for one clip
/// (`padding="max_length"`, truncation on): cut or zero-padded to `chunk_length` seconds.
///
/// Fails with [`Error::InvalidConfig`] for parameters [`LogMelConfig::check`] refuses,
/// [`Error::AudioTooLong`] for a clip over `limits.max_seconds`,
/// [`Error::SampleRateMismatch`] when the clip is not at `config.sampling_rate` (resample it
/// first), [`Error::EmptyAudio`] for no samples and [`Error::InvalidSample`] for a sample that
/// is not finite or is beyond 1024 in magnitude.
pub fn log_mel(clip: &AudioClip, config: &LogMelConfig, limits: &AudioLimits) -> Result<LogMel> {
    config.check()?;
    let seconds = clip.duration_seconds();
    if seconds > limits.max_seconds {
        return Err(Error::AudioTooLong {
            seconds,
            limit: limits.max_seconds,
        });
    }
    if clip.sample_rate != config.sampling_rate {
        return Err(Error::SampleRateMismatch {
            rate: clip.sample_rate,
            expected: config.sampling_rate,
        });
    }
    if clip.samples.is_empty() {
        return Err(Error::EmptyAudio);
    }
    if let Some((index, &sample)) = clip
        .samples
        .iter()
        .enumerate()
        .find(|(_, s)| !s.is_finite() || f64::from(s.abs()) > MAX_SAMPLE_MAGNITUDE)
    {
        return Err(Error::InvalidSample { index, sample });
    }

    let (n_fft, hop) = (config.n_fft, config.hop_length);
    let n_samples = config.n_samples();
    let kept = clip.samples.len().min(n_samples);
    // The chunk reflected by half a frame at both ends: sized by the config, never the clip.
    let pad = n_fft / 2;
    let chunk = |i: usize| {
        clip.samples
            .get(i)
            .filter(|_| i < kept)
            .map_or(0.0, |&s| f64::from(s))
    };
    let padded: Vec<f64> = (0..n_samples + 2 * pad)
        .map(|i| {
            let j = if i < pad {
                pad - i
            } else if i - pad >= n_samples {
                2 * (n_samples - 1) - (i - pad)
            } else {
                i - pad
            };
            chunk(j)
        })
        .collect();

    let window: Vec<f64> = (0..n_fft)
        .map(|n| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / n_fft as f64).cos())
        .collect();
    let filters = MelFilters::new(config);
    let fft: Arc<dyn RealToComplex<f64>> = RealFftPlanner::<f64>::new().plan_fft_forward(n_fft);
    let mut frame = fft.make_input_vec();
    let mut spectrum: Vec<Complex<f64>> = fft.make_output_vec();
    let mut scratch = fft.make_scratch_vec();
    let mut power = vec![0.0f64; spectrum.len()];

    let frames = config.frames();
    let mels = config.feature_size;
    let mut log_spec = vec![0.0f64; mels * frames];
    for t in 0..frames {
        let samples = &padded[t * hop..t * hop + n_fft];
        if samples.iter().all(|&s| s == 0.0) {
            // Silence (most of a short clip's padding): a zero spectrum, floored below.
            power.fill(0.0);
        } else {
            for ((f, &s), &w) in frame.iter_mut().zip(samples).zip(&window) {
                *f = s * w;
            }
            fft.process_with_scratch(&mut frame, &mut spectrum, &mut scratch)
                .map_err(|e| Error::InvalidConfig(format!("log-mel features: FFT: {e}")))?;
            for (p, c) in power.iter_mut().zip(&spectrum) {
                *p = c.norm_sqr();
            }
        }
        for (j, (start, weights)) in filters.bands.iter().enumerate() {
            let energy: f64 = weights
                .iter()
                .zip(&power[*start..])
                .map(|(w, p)| w * p)
                .sum();
            log_spec[j * frames + t] = energy.max(LOG_FLOOR).log10();
        }
    }
    let max = log_spec.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let features = log_spec
        .iter()
        .map(|&v| ((v.max(max - DYNAMIC_RANGE) + 4.0) / 4.0) as f32)
        .collect();
    Ok(LogMel {
        features,
        feature_size: mels,
        frames,
        valid_frames: config.valid_frames(clip.samples.len()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clip(samples: Vec<f32>) -> AudioClip {
        AudioClip {
            samples,
            sample_rate: 16_000,
        }
    }

    #[test]
    fn whisper_shapes_and_valid_frames() {
        let config = LogMelConfig::whisper(80);
        assert_eq!(config.frames(), 3000);
        let limits = AudioLimits::default();
        for (len, valid) in [(1, 1), (160, 1), (161, 2), (480_000, 3000), (600_000, 3000)] {
            let out = log_mel(&clip(vec![0.1; len]), &config, &limits).unwrap();
            assert_eq!(
                (out.feature_size, out.frames, out.valid_frames),
                (80, 3000, valid)
            );
            assert_eq!(out.features.len(), 80 * 3000);
        }
    }

    #[test]
    fn silence_is_the_floor_everywhere() {
        // All zeros: log10 of the floor, -10, is also the maximum, so every value is -1.5.
        let out = log_mel(
            &clip(vec![0.0; 1000]),
            &LogMelConfig::whisper(80),
            &AudioLimits::default(),
        )
        .unwrap();
        assert!(out.features.iter().all(|&v| v == -1.5));
    }

    #[test]
    fn filterbank_matches_slaney_scale_points() {
        assert_eq!(hertz_to_mel(1000.0), 15.0);
        assert!((mel_to_hertz(hertz_to_mel(5123.0)) - 5123.0).abs() < 1e-9);
        assert!((mel_to_hertz(hertz_to_mel(321.0)) - 321.0).abs() < 1e-12);
        let filters = MelFilters::new(&LogMelConfig::whisper(80));
        assert_eq!(filters.bands.len(), 80);
        // Every triangle covers at least one FFT bin at 80 bins over 201.
        assert!(filters.bands.iter().all(|(_, w)| !w.is_empty()));
    }

    #[test]
    fn refusals() {
        let config = LogMelConfig::whisper(80);
        let limits = AudioLimits {
            max_seconds: 1.0,
            ..AudioLimits::default()
        };
        assert!(matches!(
            log_mel(&clip(vec![0.0; 16_001]), &config, &limits),
            Err(Error::AudioTooLong { .. })
        ));
        let at_48k = AudioClip {
            samples: vec![0.0; 100],
            sample_rate: 48_000,
        };
        assert!(matches!(
            log_mel(&at_48k, &config, &limits),
            Err(Error::SampleRateMismatch {
                rate: 48_000,
                expected: 16_000
            })
        ));
        assert!(matches!(
            log_mel(&clip(vec![]), &config, &limits),
            Err(Error::EmptyAudio)
        ));
        for bad in [f32::NAN, f32::INFINITY, 2000.0] {
            assert!(matches!(
                log_mel(&clip(vec![0.0, bad]), &config, &limits),
                Err(Error::InvalidSample { index: 1, .. })
            ));
        }
        for bad in [
            LogMelConfig {
                feature_size: 0,
                ..config
            },
            LogMelConfig {
                feature_size: 100_000,
                ..config
            },
            LogMelConfig { n_fft: 1, ..config },
            LogMelConfig {
                hop_length: 0,
                ..config
            },
            LogMelConfig {
                hop_length: 401,
                ..config
            },
            LogMelConfig {
                chunk_length: 0,
                ..config
            },
            LogMelConfig {
                chunk_length: usize::MAX,
                ..config
            },
            LogMelConfig {
                chunk_length: 1,
                sampling_rate: 100,
                ..config
            },
        ] {
            assert!(
                matches!(
                    log_mel(&clip(vec![0.0; 10]), &bad, &limits),
                    Err(Error::InvalidConfig(_))
                ),
                "{bad:?}"
            );
        }
    }
}
