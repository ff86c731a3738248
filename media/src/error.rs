//! The crate's one error type: every way untrusted media can be refused, each naming the problem.

use std::ops::Range;

/// What a request can carry besides text, for messages and capability checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Modality {
    /// A still image (PNG, JPEG, WebP, first frame of a GIF).
    Image,
    /// An audio clip (WAV).
    Audio,
}

impl std::fmt::Display for Modality {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Modality::Image => "image",
            Modality::Audio => "audio",
        })
    }
}

/// Everything that can go wrong turning untrusted bytes into model input.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The payload is empty.
    #[error("media payload is empty")]
    Empty,
    /// The payload is larger than the intake accepts.
    #[error("media payload is {len} bytes, more than the limit of {limit}")]
    PayloadTooLarge {
        /// Bytes received (or, for base64, the decoded size it implies).
        len: u64,
        /// The configured limit.
        limit: u64,
    },
    /// The first bytes match no supported image or audio format.
    #[error("unrecognized media format (first bytes: {magic})")]
    UnrecognizedFormat {
        /// Hex of up to the first 12 bytes.
        magic: String,
    },
    /// Content was detected as one modality where another was required.
    #[error("expected {expected} data, found {found}")]
    WrongModality {
        /// The modality the caller asked for.
        expected: Modality,
        /// The modality the content turned out to be.
        found: Modality,
    },
    /// Image dimensions are zero or beyond the configured limits, read from the header.
    #[error("image of {width}x{height} exceeds limits ({reason})")]
    ImageTooLarge {
        /// Width from the header.
        width: u32,
        /// Height from the header.
        height: u32,
        /// Which limit was broken.
        reason: &'static str,
    },
    /// The image decoder refused the data (truncated, corrupt, unsupported variant).
    #[error("cannot decode {format} image: {message}")]
    ImageDecode {
        /// Detected container format.
        format: &'static str,
        /// The decoder's description.
        message: String,
    },
    /// A preprocessing parameter is unusable (zero size, non-positive std, ...).
    #[error("invalid preprocessing config: {0}")]
    InvalidConfig(String),
    /// The RIFF/WAVE structure is malformed.
    #[error("malformed WAV: {0}")]
    MalformedWav(String),
    /// A chunk or the sample data claims more bytes than the file holds.
    #[error("truncated WAV: {what} needs {needed} bytes, {available} available")]
    TruncatedWav {
        /// Which part was cut short.
        what: &'static str,
        /// Bytes the header claims.
        needed: u64,
        /// Bytes actually present.
        available: u64,
    },
    /// A WAV sample encoding this crate does not decode.
    #[error("unsupported WAV encoding: {0}")]
    UnsupportedWav(String),
    /// The header's sample rate is outside the accepted range.
    #[error("sample rate {rate} Hz is outside {min}..={max} Hz")]
    SampleRateOutOfRange {
        /// The claimed rate.
        rate: u32,
        /// Lowest accepted rate.
        min: u32,
        /// Highest accepted rate.
        max: u32,
    },
    /// The channel count is zero or above the limit.
    #[error("channel count {channels} is outside 1..={max}")]
    ChannelCount {
        /// The claimed channel count.
        channels: u16,
        /// Highest accepted count.
        max: u16,
    },
    /// The clip is longer than the limit; checked from the header before decoding.
    #[error("audio of {seconds:.1} s exceeds the limit of {limit:.1} s")]
    AudioTooLong {
        /// Duration the header implies.
        seconds: f64,
        /// Configured maximum.
        limit: f64,
    },
    /// A clip is not at the rate a feature extractor takes; resample it first.
    #[error("audio at {rate} Hz where {expected} Hz is needed")]
    SampleRateMismatch {
        /// The clip's rate.
        rate: u32,
        /// The rate required.
        expected: u32,
    },
    /// A sample that is not finite, or beyond any decoded clip's range.
    #[error("audio sample {index} is {sample}, not a finite value within 1024")]
    InvalidSample {
        /// Its index in the clip.
        index: usize,
        /// Its value.
        sample: f32,
    },
    /// The clip holds no samples.
    #[error("audio has no samples")]
    EmptyAudio,
    /// The resampler could not be built or failed.
    #[error("resampling {from} Hz to {to} Hz failed: {message}")]
    Resample {
        /// Source rate.
        from: u32,
        /// Target rate.
        to: u32,
        /// The resampler's description.
        message: String,
    },
    /// A split length that is zero, negative or not finite.
    #[error("invalid split length {0} s")]
    InvalidSplit(f64),
    /// A prompt names a media item that does not exist.
    #[error("prompt references [img-{index}] but only {count} media items were sent")]
    BadMediaIndex {
        /// The index in the tag.
        index: usize,
        /// Items available.
        count: usize,
    },
    /// A model's expansion ranges do not fit the prompt.
    #[error("invalid media expansion {range:?}: {reason}")]
    InvalidExpansion {
        /// The offending range (or `0..0` when the count is wrong).
        range: Range<usize>,
        /// What is wrong with it.
        reason: String,
    },
    /// A base64 payload or data URL is malformed.
    #[error("invalid base64 media payload: {0}")]
    Base64(String),
    /// An `image_url` that is not a base64 `data:` URL.
    #[error("unsupported image_url: {0}")]
    UnsupportedUrl(String),
    /// An `input_audio.format` other than WAV.
    #[error("unsupported input_audio format {0:?}; only \"wav\" is accepted")]
    UnsupportedAudioFormat(String),
    /// The model cannot take this kind of input.
    #[error("model {model:?} does not support {modality} input")]
    MissingCapability {
        /// The model's name, as the request named it.
        model: String,
        /// The modality the request carried.
        modality: Modality,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
