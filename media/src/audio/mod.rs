//! Audio: the mono clip type and its limits (here), WAV decoding ([`wav`]), band-limited
//! resampling ([`resample`]), splitting at pauses ([`split`]), and Whisper's log-mel features
//! ([`features`]).

pub(crate) mod features;
pub(crate) mod resample;
pub(crate) mod split;
pub(crate) mod wav;

/// A mono clip of `f32` samples, nominally in `[-1, 1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioClip {
    /// The samples, in time order.
    pub samples: Vec<f32>,
    /// Samples per second.
    pub sample_rate: u32,
}

impl AudioClip {
    /// Length in seconds.
    pub fn duration_seconds(&self) -> f64 {
        self.samples.len() as f64 / f64::from(self.sample_rate.max(1))
    }
}

/// Bounds on what an untrusted audio file may make us allocate or compute.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AudioLimits {
    /// Longest accepted clip, checked from the header before any sample is decoded.
    pub max_seconds: f64,
    /// Lowest accepted sample rate; below it a tiny file could claim hours.
    pub min_sample_rate: u32,
    /// Highest accepted sample rate.
    pub max_sample_rate: u32,
    /// Most channels accepted before downmixing.
    pub max_channels: u16,
}

impl Default for AudioLimits {
    /// Ten minutes, 1 kHz to 768 kHz, up to 64 channels.
    fn default() -> Self {
        AudioLimits {
            max_seconds: 600.0,
            min_sample_rate: 1_000,
            max_sample_rate: 768_000,
            max_channels: 64,
        }
    }
}
