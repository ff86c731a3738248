//! WAV decoding: every supported encoding, downmixing, chunk walking, and agreement with `hound`.

mod support;

use std::io::Cursor;

use media::{AudioLimits, Error, SampleEncoding, decode_wav, read_wav_header};
use support::{WavSpec, encode, riff, wav};

const LIMITS: AudioLimits = AudioLimits {
    max_seconds: 600.0,
    min_sample_rate: 1_000,
    max_sample_rate: 768_000,
    max_channels: 64,
};

/// Stereo frames whose channel average is known.
fn stereo_pairs() -> (Vec<f64>, Vec<f64>) {
    let pairs = [
        (0.5, -0.5),
        (0.25, 0.75),
        (-1.0, -0.5),
        (0.0, 0.0),
        (0.9, 0.1),
    ];
    let interleaved = pairs.iter().flat_map(|&(l, r)| [l, r]).collect();
    let mono = pairs.iter().map(|&(l, r)| (l + r) / 2.0).collect();
    (interleaved, mono)
}

#[test]
fn every_encoding_decodes_and_downmixes() {
    let cases = [
        (
            WavSpec::pcm(2, 16_000, 8),
            SampleEncoding::PcmU8,
            1.0 / 128.0,
        ),
        (
            WavSpec::pcm(2, 16_000, 16),
            SampleEncoding::PcmI16,
            1.0 / 32768.0,
        ),
        (WavSpec::pcm(2, 16_000, 24), SampleEncoding::PcmI24, 1e-6),
        (WavSpec::pcm(2, 16_000, 32), SampleEncoding::PcmI32, 1e-6),
        (WavSpec::float(2, 16_000, 32), SampleEncoding::Float32, 1e-6),
        (WavSpec::float(2, 16_000, 64), SampleEncoding::Float64, 1e-6),
    ];
    let (interleaved, mono) = stereo_pairs();
    for (spec, encoding, tol) in cases {
        for extensible in [false, true] {
            let spec = WavSpec { extensible, ..spec };
            let bytes = wav(&spec, &encode(&spec, &interleaved));
            let header = read_wav_header(&bytes, &LIMITS).unwrap();
            assert_eq!(header.encoding, encoding);
            assert_eq!(
                (header.channels, header.sample_rate, header.frames),
                (2, 16_000, 5)
            );
            let clip = decode_wav(&bytes, &LIMITS).unwrap();
            assert_eq!(clip.sample_rate, 16_000);
            assert_eq!(clip.samples.len(), mono.len());
            for (got, want) in clip.samples.iter().zip(&mono) {
                assert!(
                    (f64::from(*got) - want).abs() <= tol,
                    "{spec:?}: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn many_channels_are_averaged() {
    let spec = WavSpec::pcm(6, 48_000, 16);
    let frame: Vec<f64> = vec![0.5, 0.5, 0.5, -0.25, 0.0, 0.25];
    let samples: Vec<f64> = frame.iter().copied().cycle().take(6 * 10).collect();
    let clip = decode_wav(&wav(&spec, &encode(&spec, &samples)), &LIMITS).unwrap();
    assert_eq!(clip.samples.len(), 10);
    assert!(clip.samples.iter().all(|s| (s - 0.25).abs() < 1e-4));
}

#[test]
fn unknown_chunks_and_padding_are_skipped() {
    let spec = WavSpec::pcm(1, 8_000, 16);
    let data = encode(&spec, &[0.5, -0.5]);
    // An odd-sized LIST chunk before fmt, a fact chunk between fmt and data.
    let bytes = riff(&[
        (b"LIST", b"abc"),
        (b"fmt ", &support::fmt_body(&spec)),
        (b"fact", &[0; 4]),
        (b"data", &data),
    ]);
    let clip = decode_wav(&bytes, &LIMITS).unwrap();
    assert_eq!(clip.samples, vec![0.5, -0.5]);
}

#[test]
fn streaming_placeholder_size_means_rest_of_file() {
    let spec = WavSpec::pcm(1, 8_000, 16);
    let mut bytes = wav(&spec, &encode(&spec, &[0.5, -0.5, 0.25]));
    let data_size_at = bytes.len() - 6 - 4;
    bytes[data_size_at..data_size_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(decode_wav(&bytes, &LIMITS).unwrap().samples.len(), 3);
}

#[test]
fn a_trailing_partial_frame_is_dropped() {
    let spec = WavSpec::pcm(2, 8_000, 16);
    let mut data = encode(&spec, &[0.5, 0.5, 0.25, 0.25]);
    data.extend_from_slice(&[1, 2]); // half a frame
    let clip = decode_wav(&wav(&spec, &data), &LIMITS).unwrap();
    assert_eq!(clip.samples, vec![0.5, 0.25]);
}

#[test]
fn duration_cap_applies_before_decoding() {
    let spec = WavSpec::pcm(1, 1_000, 8);
    let bytes = wav(&spec, &vec![128u8; 2_000]); // 2 s
    let tight = AudioLimits {
        max_seconds: 1.5,
        ..LIMITS
    };
    assert!(matches!(
        decode_wav(&bytes, &tight),
        Err(Error::AudioTooLong { .. })
    ));
    assert_eq!(decode_wav(&bytes, &LIMITS).unwrap().samples.len(), 2_000);
}

#[test]
fn non_finite_floats_are_refused() {
    let spec = WavSpec::float(1, 8_000, 32);
    let bytes = wav(&spec, &encode(&spec, &[0.0, f64::NAN]));
    assert!(matches!(
        decode_wav(&bytes, &LIMITS),
        Err(Error::MalformedWav(_))
    ));
}

/// `hound` writes what it writes (including WAVE_FORMAT_EXTENSIBLE for wide or many-channel
/// files); our reader must agree with its reader on every sample.
#[test]
fn agrees_with_hound() {
    let formats = [
        (1, 16, hound::SampleFormat::Int),
        (2, 16, hound::SampleFormat::Int),
        (2, 24, hound::SampleFormat::Int),
        (3, 32, hound::SampleFormat::Int),
        (2, 8, hound::SampleFormat::Int),
        (4, 32, hound::SampleFormat::Float),
    ];
    for (channels, bits, sample_format) in formats {
        let spec = hound::WavSpec {
            channels,
            sample_rate: 22_050,
            bits_per_sample: bits,
            sample_format,
        };
        let frames = 300usize;
        let mut cursor = Cursor::new(Vec::new());
        {
            let mut writer = hound::WavWriter::new(&mut cursor, spec).unwrap();
            for i in 0..frames * usize::from(channels) {
                let x = ((i as f64) * 0.37).sin() * 0.8;
                match sample_format {
                    hound::SampleFormat::Float => writer.write_sample(x as f32).unwrap(),
                    hound::SampleFormat::Int => {
                        let full = (1i64 << (bits - 1)) as f64;
                        writer.write_sample((x * full) as i32).unwrap()
                    }
                }
            }
            writer.finalize().unwrap();
        }
        let bytes = cursor.into_inner();
        let ours = decode_wav(&bytes, &LIMITS).unwrap();
        let mut reader = hound::WavReader::new(Cursor::new(&bytes)).unwrap();
        let theirs: Vec<f64> = match sample_format {
            hound::SampleFormat::Float => reader
                .samples::<f32>()
                .map(|s| f64::from(s.unwrap()))
                .collect(),
            hound::SampleFormat::Int => {
                let full = (1i64 << (bits - 1)) as f64;
                reader
                    .samples::<i32>()
                    .map(|s| f64::from(s.unwrap()) / full)
                    .collect()
            }
        };
        assert_eq!(ours.samples.len(), frames);
        for (i, frame) in theirs.chunks(usize::from(channels)).enumerate() {
            let want = frame.iter().sum::<f64>() / f64::from(channels);
            assert!(
                (f64::from(ours.samples[i]) - want).abs() < 1e-6,
                "{spec:?} frame {i}"
            );
        }
    }
}

#[test]
fn float_samples_beyond_sixty_db_over_full_scale_are_refused() {
    let spec = WavSpec::float(1, 8_000, 64);
    let bytes = wav(&spec, &encode(&spec, &[0.0, 1e300]));
    assert!(matches!(
        decode_wav(&bytes, &LIMITS),
        Err(Error::MalformedWav(_))
    ));
    let over = wav(&spec, &encode(&spec, &[0.0, 1.5]));
    assert_eq!(decode_wav(&over, &LIMITS).unwrap().samples, vec![0.0, 1.5]);
}
