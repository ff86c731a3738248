//! Crafted bad files: truncated, lying headers, zero channels, huge dimensions, absurd rates.
//! Each must be an error, and refusing it must not allocate more than a little.
//!
//! The cases are built here by code and also committed as tiny files under `tests/corpus/`
//! (the fuzz targets' seed corpus); a test keeps the two identical. After changing a case,
//! regenerate with `MEDIA_WRITE_CORPUS=1 cargo test -p mlxkit-media --test corpus`.

mod support;

use std::path::PathBuf;

use media::{AudioLimits, Error, ImageLimits, decode_image, decode_wav, prepare_audio};
use support::alloc::measure;
use support::{WavSpec, encode, fmt_body, riff, wav};

/// Refusing a bad file may allocate at most this much (decoder state, error strings).
const REFUSAL_BUDGET: usize = 1 << 20;

type Check = fn(&Error) -> bool;

struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    expect: Check,
}

fn case(name: &'static str, bytes: Vec<u8>, expect: Check) -> Case {
    Case {
        name,
        bytes,
        expect,
    }
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A PNG signature and IHDR claiming `width` x `height` RGB8, with a correct CRC, then `rest`.
fn png_header(width: u32, height: u32, rest: &[u8]) -> Vec<u8> {
    let mut ihdr = b"IHDR".to_vec();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    out.extend_from_slice(&13u32.to_be_bytes());
    out.extend_from_slice(&ihdr);
    out.extend_from_slice(&crc32(&ihdr).to_be_bytes());
    out.extend_from_slice(rest);
    out
}

/// [`png_header`] followed by an IDAT chunk holding only a zlib header, so the decoder reads
/// the whole header section and reaches the point where it would allocate pixels.
fn png_claiming(width: u32, height: u32) -> Vec<u8> {
    let idat = b"IDAT\x78\x9c";
    let mut chunk = 2u32.to_be_bytes().to_vec();
    chunk.extend_from_slice(idat);
    chunk.extend_from_slice(&crc32(idat).to_be_bytes());
    png_header(width, height, &chunk)
}

/// A real JPEG with its SOF0 dimensions overwritten.
fn jpeg_claiming(width: u16, height: u16) -> Vec<u8> {
    let mut bytes = support::jpeg(&support::pattern(16, 16), 80);
    let sof = bytes
        .windows(2)
        .position(|w| w == [0xFF, 0xC0])
        .expect("encoder writes SOF0");
    bytes[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
    bytes[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
    bytes
}

/// A real GIF with its logical screen overwritten.
fn gif_claiming(width: u16, height: u16) -> Vec<u8> {
    let mut bytes = support::gif(4, 4, &[[255, 0, 0]]);
    bytes[6..8].copy_from_slice(&width.to_le_bytes());
    bytes[8..10].copy_from_slice(&height.to_le_bytes());
    bytes
}

/// A real lossless WebP with its VP8L dimensions set to 16383 x 16383. (The format's 14-bit
/// fields allow 16384, but the decoder wraps that to 0.)
fn webp_lossless_claiming_16383() -> Vec<u8> {
    let mut bytes = support::webp_lossless(&support::pattern(4, 4));
    assert_eq!(&bytes[12..16], b"VP8L");
    assert_eq!(bytes[20], 0x2f);
    let packed = u32::from_le_bytes([bytes[21], bytes[22], bytes[23], bytes[24]]);
    let packed = (packed & 0xF000_0000) | 16382 | (16382 << 14);
    bytes[21..25].copy_from_slice(&packed.to_le_bytes());
    bytes
}

/// A real lossless WebP behind a VP8X header whose canvas is the 24-bit maximum, 16777216
/// pixels a side.
fn webp_extended_canvas_max() -> Vec<u8> {
    let simple = support::webp_lossless(&support::pattern(4, 4));
    let mut vp8x = b"VP8X".to_vec();
    vp8x.extend_from_slice(&10u32.to_le_bytes());
    vp8x.extend_from_slice(&[0, 0, 0, 0]); // no flags
    vp8x.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]); // width-1, height-1
    let mut body = b"WEBP".to_vec();
    body.extend_from_slice(&vp8x);
    body.extend_from_slice(&simple[12..]);
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn truncated(mut bytes: Vec<u8>, keep: f64) -> Vec<u8> {
    bytes.truncate((bytes.len() as f64 * keep) as usize);
    bytes
}

fn image_cases() -> Vec<Case> {
    let too_large: Check = |e| matches!(e, Error::ImageTooLarge { .. });
    let any_decode: Check =
        |e| matches!(e, Error::ImageDecode { .. } | Error::ImageTooLarge { .. });
    let good_png = support::png(&support::pattern(32, 32));
    vec![
        case(
            "png_100000x100000.png",
            png_claiming(100_000, 100_000),
            too_large,
        ),
        case(
            "png_8192x8192_over_pixel_limit.png",
            png_claiming(8192, 8192),
            too_large,
        ),
        case(
            "png_1x4000000000.png",
            png_claiming(1, 4_000_000_000),
            any_decode,
        ),
        case("png_zero_width.png", png_claiming(0, 16), any_decode),
        case(
            "png_no_idat.png",
            png_header(4, 4, b"\0\0\0\0IEND\xaeB`\x82"),
            any_decode,
        ),
        case(
            "png_truncated_idat.png",
            truncated(good_png.clone(), 0.6),
            any_decode,
        ),
        case("png_signature_only.png", good_png[..8].to_vec(), any_decode),
        case(
            "jpeg_60000x60000.jpg",
            jpeg_claiming(60_000, 60_000),
            too_large,
        ),
        case("jpeg_0x0.jpg", jpeg_claiming(0, 0), any_decode),
        case(
            "jpeg_truncated.jpg",
            truncated(support::jpeg(&support::pattern(32, 32), 90), 0.5),
            any_decode,
        ),
        case("jpeg_soi_only.jpg", vec![0xFF, 0xD8, 0xFF], any_decode),
        case(
            "gif_65535x65535.gif",
            gif_claiming(65_535, 65_535),
            too_large,
        ),
        case(
            "gif_truncated.gif",
            truncated(support::gif(8, 8, &[[0, 0, 255]]), 0.5),
            any_decode,
        ),
        case("gif_header_only.gif", b"GIF89a".to_vec(), any_decode),
        case(
            "webp_16383x16383.webp",
            webp_lossless_claiming_16383(),
            too_large,
        ),
        case(
            "webp_vp8x_canvas_16777216.webp",
            webp_extended_canvas_max(),
            any_decode,
        ),
        case(
            "webp_truncated.webp",
            truncated(support::webp_lossless(&support::pattern(16, 16)), 0.5),
            any_decode,
        ),
        case(
            "webp_riff_only.webp",
            b"RIFF\x04\0\0\0WEBP".to_vec(),
            any_decode,
        ),
    ]
}

fn wav_cases() -> Vec<Case> {
    let malformed: Check = |e| matches!(e, Error::MalformedWav(_));
    let truncated_wav: Check = |e| matches!(e, Error::TruncatedWav { .. });
    let unsupported: Check = |e| matches!(e, Error::UnsupportedWav(_));
    let rate: Check = |e| matches!(e, Error::SampleRateOutOfRange { .. });
    let channels: Check = |e| matches!(e, Error::ChannelCount { .. });
    let pcm16 = WavSpec::pcm(1, 16_000, 16);
    let some_data = encode(&pcm16, &[0.1, 0.2, 0.3, 0.4]);

    let mut lying_data = wav(&pcm16, &some_data);
    let at = lying_data.len() - some_data.len() - 4;
    lying_data[at..at + 4].copy_from_slice(&1_000_000_000u32.to_le_bytes());

    let mut lying_fmt = riff(&[(b"fmt ", &fmt_body(&pcm16))]);
    lying_fmt[16..20].copy_from_slice(&1_000u32.to_le_bytes());

    let mut long_chunk = riff(&[
        (b"LIST", b"xx"),
        (b"fmt ", &fmt_body(&pcm16)),
        (b"data", &some_data),
    ]);
    long_chunk[16..20].copy_from_slice(&u32::MAX.to_le_bytes());

    let mut bad_guid = fmt_body(&WavSpec {
        extensible: true,
        ..pcm16
    });
    bad_guid[30] ^= 0xFF;
    let mut short_ext = fmt_body(&WavSpec {
        extensible: true,
        ..pcm16
    });
    short_ext.truncate(30);
    let mut valid_bits_over = fmt_body(&WavSpec {
        extensible: true,
        ..pcm16
    });
    valid_bits_over[18..20].copy_from_slice(&20u16.to_le_bytes());

    vec![
        case(
            "wav_riff_header_only.wav",
            b"RIFF\x04\0\0\0WAVE".to_vec(),
            malformed,
        ),
        case(
            "wav_truncated_chunk_header.wav",
            b"RIFF\x08\0\0\0WAVEfmt".to_vec(),
            malformed,
        ),
        case("wav_fmt_claims_1000_bytes.wav", lying_fmt, truncated_wav),
        case("wav_data_claims_1gb.wav", lying_data, truncated_wav),
        case("wav_chunk_size_u32_max.wav", long_chunk, truncated_wav),
        case(
            "wav_zero_channels.wav",
            wav(
                &WavSpec {
                    channels: 0,
                    ..pcm16
                },
                &some_data,
            ),
            channels,
        ),
        case(
            "wav_65535_channels.wav",
            wav(
                &WavSpec {
                    channels: 65_535,
                    block_align: Some(0),
                    ..pcm16
                },
                &some_data,
            ),
            channels,
        ),
        case(
            "wav_rate_0.wav",
            wav(&WavSpec { rate: 0, ..pcm16 }, &some_data),
            rate,
        ),
        case(
            "wav_rate_1.wav",
            wav(&WavSpec { rate: 1, ..pcm16 }, &some_data),
            rate,
        ),
        case(
            "wav_rate_u32_max.wav",
            wav(
                &WavSpec {
                    rate: u32::MAX,
                    ..pcm16
                },
                &some_data,
            ),
            rate,
        ),
        case(
            "wav_block_align_lies.wav",
            wav(
                &WavSpec {
                    block_align: Some(7),
                    ..pcm16
                },
                &some_data,
            ),
            malformed,
        ),
        case(
            "wav_block_align_zero.wav",
            wav(
                &WavSpec {
                    block_align: Some(0),
                    ..pcm16
                },
                &some_data,
            ),
            malformed,
        ),
        case(
            "wav_12_bit.wav",
            wav(&WavSpec { bits: 12, ..pcm16 }, &some_data),
            unsupported,
        ),
        case(
            "wav_float_16_bit.wav",
            wav(&WavSpec::float(1, 16_000, 16), &some_data),
            unsupported,
        ),
        case(
            "wav_mp3_tag.wav",
            wav(&WavSpec { tag: 0x55, ..pcm16 }, &some_data),
            unsupported,
        ),
        case(
            "wav_extensible_bad_guid.wav",
            riff(&[(b"fmt ", &bad_guid), (b"data", &some_data)]),
            unsupported,
        ),
        case(
            "wav_extensible_short.wav",
            riff(&[(b"fmt ", &short_ext), (b"data", &some_data)]),
            malformed,
        ),
        case(
            "wav_valid_bits_over_container.wav",
            riff(&[(b"fmt ", &valid_bits_over), (b"data", &some_data)]),
            malformed,
        ),
        case(
            "wav_fmt_14_bytes.wav",
            riff(&[(b"fmt ", &fmt_body(&pcm16)[..14]), (b"data", &some_data)]),
            malformed,
        ),
        case(
            "wav_data_before_fmt.wav",
            riff(&[(b"data", &some_data), (b"fmt ", &fmt_body(&pcm16))]),
            malformed,
        ),
        case(
            "wav_no_data.wav",
            riff(&[(b"fmt ", &fmt_body(&pcm16))]),
            malformed,
        ),
        case(
            "wav_two_fmt.wav",
            riff(&[
                (b"fmt ", &fmt_body(&pcm16)),
                (b"fmt ", &fmt_body(&pcm16)),
                (b"data", &some_data),
            ]),
            malformed,
        ),
        case("wav_empty_data.wav", wav(&pcm16, b""), |e| {
            matches!(e, Error::EmptyAudio)
        }),
        case(
            "wav_less_than_one_frame.wav",
            wav(&WavSpec::pcm(2, 16_000, 24), &[1, 2, 3]),
            |e| matches!(e, Error::EmptyAudio),
        ),
    ]
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

fn refuse(bytes: &[u8]) -> (Option<Error>, usize) {
    let (result, peak) = measure(|| {
        if bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WAVE") {
            prepare_audio(bytes, &AudioLimits::default(), 16_000).err()
        } else {
            decode_image(bytes, &ImageLimits::default()).err()
        }
    });
    (result, peak)
}

#[test]
fn every_crafted_file_is_refused_cheaply() {
    let mut worst = (0, "");
    for case in image_cases().into_iter().chain(wav_cases()) {
        let (err, peak) = refuse(&case.bytes);
        let err = err.unwrap_or_else(|| panic!("{} was accepted", case.name));
        assert!(
            (case.expect)(&err),
            "{}: unexpected error {err:?}",
            case.name
        );
        assert!(
            peak <= REFUSAL_BUDGET,
            "{}: refusing it allocated {peak} bytes",
            case.name
        );
        assert!(!err.to_string().is_empty());
        worst = worst.max((peak, case.name));
    }
    eprintln!(
        "largest allocation while refusing: {} bytes ({})",
        worst.0, worst.1
    );
}

/// Every refusal's message, reviewed once: each names the problem a client must fix.
#[test]
fn refusal_messages() {
    let lines: Vec<String> = image_cases()
        .into_iter()
        .chain(wav_cases())
        .map(|case| match refuse(&case.bytes).0 {
            Some(err) => format!("{}: {err}", case.name),
            None => format!("{}: ACCEPTED", case.name),
        })
        .collect();
    insta::assert_snapshot!(lines.join("\n"));
}

#[test]
fn committed_corpus_matches_the_cases() {
    let dir = corpus_dir();
    let cases: Vec<Case> = image_cases().into_iter().chain(wav_cases()).collect();
    if std::env::var_os("MEDIA_WRITE_CORPUS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for case in &cases {
            std::fs::write(dir.join(case.name), &case.bytes).unwrap();
        }
    }
    for case in &cases {
        let path = dir.join(case.name);
        let on_disk = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            on_disk, case.bytes,
            "{} differs from its generator",
            case.name
        );
        assert!(on_disk.len() <= 4096, "{} is not tiny", case.name);
    }
    let files = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(
        files,
        cases.len(),
        "tests/corpus holds files no case generates"
    );
}

/// A tiny file claiming a rate of 1 Hz must not turn into gigabytes, even when the rate limit
/// is relaxed: the ten-minute cap is computed from the header before decoding or resampling.
#[test]
fn absurdly_low_rate_is_capped_by_duration_before_allocation() {
    let permissive = AudioLimits {
        min_sample_rate: 1,
        ..AudioLimits::default()
    };
    let spec = WavSpec::pcm(1, 1, 8);
    let bytes = wav(&spec, &vec![128u8; 601]); // 601 samples at 1 Hz: just over ten minutes
    let (result, peak) = measure(|| prepare_audio(&bytes, &permissive, 16_000));
    assert!(
        matches!(result, Err(Error::AudioTooLong { .. })),
        "{result:?}"
    );
    assert!(peak <= REFUSAL_BUDGET, "allocated {peak} bytes");
    // With the default limits the rate itself is refused.
    assert!(matches!(
        decode_wav(&bytes, &AudioLimits::default()),
        Err(Error::SampleRateOutOfRange { .. })
    ));
}
