//! How media comes in: a payload's format recognized from its bytes (never its name or
//! declared type), base64 and data URLs decoded within a size limit, a model's capabilities
//! checked, and the content identity a prefix cache keys media by.

use base64::Engine;
use media::{
    AudioFormat, Capabilities, Error, ImageFormat, MediaFormat, MediaId, Modality, decode_base64,
    decode_image_url, decode_input_audio, decode_ollama_image, detect,
};
use sha2::{Digest, Sha256};

#[test]
fn signatures_are_recognized() {
    let cases: [(&[u8], MediaFormat); 6] = [
        (
            b"\x89PNG\r\n\x1a\nrest",
            MediaFormat::Image(ImageFormat::Png),
        ),
        (
            &[0xFF, 0xD8, 0xFF, 0xE0],
            MediaFormat::Image(ImageFormat::Jpeg),
        ),
        (b"GIF89a....", MediaFormat::Image(ImageFormat::Gif)),
        (b"GIF87a....", MediaFormat::Image(ImageFormat::Gif)),
        (
            b"RIFF\0\0\0\0WEBPVP8 ",
            MediaFormat::Image(ImageFormat::WebP),
        ),
        (
            b"RIFF\0\0\0\0WAVEfmt ",
            MediaFormat::Audio(AudioFormat::Wav),
        ),
    ];
    for (bytes, want) in cases {
        assert_eq!(detect(bytes).unwrap(), want);
    }
}

#[test]
fn names_do_not_matter_and_unknown_is_an_error() {
    assert!(matches!(detect(b""), Err(Error::Empty)));
    assert!(matches!(
        detect(b"RIFF\0\0\0\0AVI "),
        Err(Error::UnrecognizedFormat { .. })
    ));
    assert!(matches!(
        detect(b"ID3\x04mp3"),
        Err(Error::UnrecognizedFormat { .. })
    ));
    // A PNG signature cut short is not a PNG.
    assert!(detect(b"\x89PNG").is_err());
    let err = detect(b"hello").unwrap_err().to_string();
    assert!(err.contains("68656c6c6f"), "{err}");
}

#[test]
fn id_depends_on_bytes_shape_and_modality() {
    let base = MediaId::new(Modality::Image, b"abc", &[224, 224]);
    assert_eq!(base, MediaId::new(Modality::Image, b"abc", &[224, 224]));
    assert_ne!(base, MediaId::new(Modality::Image, b"abd", &[224, 224]));
    assert_ne!(base, MediaId::new(Modality::Image, b"abc", &[336, 336]));
    assert_ne!(base, MediaId::new(Modality::Audio, b"abc", &[224, 224]));
    // Moving a boundary between bytes and shape changes the id.
    assert_ne!(
        MediaId::new(Modality::Image, b"", &[1]),
        MediaId::new(Modality::Image, &1u64.to_le_bytes(), &[])
    );
    assert!(base.token_key() >= 0x8000_0000);
    assert_eq!(base.to_hex().len(), 64);
}

#[test]
fn known_digest_is_stable() {
    // Pinned so a change to the hashed layout (which would orphan every cached prefix) is
    // a deliberate, visible edit.
    let id = MediaId::new(Modality::Image, b"", &[]);
    let mut hasher = Sha256::new();
    hasher.update(b"mlxkit.media.v1\0\x01");
    hasher.update(0u64.to_le_bytes());
    hasher.update(0u64.to_le_bytes());
    let want: [u8; 32] = hasher.finalize().into();
    assert_eq!(id.as_bytes(), &want);
}

const PNG_HEAD: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
const WAV_HEAD: &[u8] = b"RIFF\x24\0\0\0WAVEfmt ";

#[test]
fn base64_variants_decode() {
    let raw: Vec<u8> = (0u8..=255).collect();
    let std = base64::engine::general_purpose::STANDARD.encode(&raw);
    assert_eq!(decode_base64(&std, 1 << 10).unwrap(), raw);
    assert_eq!(
        decode_base64(std.trim_end_matches('='), 1 << 10).unwrap(),
        raw
    );
    let url = base64::engine::general_purpose::URL_SAFE.encode(&raw);
    assert_eq!(decode_base64(&url, 1 << 10).unwrap(), raw);
    let wrapped: String = std
        .as_bytes()
        .chunks(76)
        .map(|c| format!("{}\n", String::from_utf8_lossy(c)))
        .collect();
    assert_eq!(decode_base64(&wrapped, 1 << 10).unwrap(), raw);
}

#[test]
fn base64_errors() {
    assert!(matches!(decode_base64("", 10), Err(Error::Empty)));
    assert!(matches!(decode_base64("  ", 10), Err(Error::Empty)));
    assert!(matches!(decode_base64("!!!!", 10), Err(Error::Base64(_))));
    assert!(matches!(
        decode_base64(&"A".repeat(4000), 100),
        Err(Error::PayloadTooLarge { .. })
    ));
}

#[test]
fn image_urls() {
    let b64 = base64::engine::general_purpose::STANDARD.encode(PNG_HEAD);
    let url = format!("data:image/png;base64,{b64}");
    assert_eq!(decode_image_url(&url, 1 << 10).unwrap(), PNG_HEAD);
    // The declared type is ignored in favour of the content.
    let lying = format!("DATA:image/jpeg;BASE64,{b64}");
    assert_eq!(decode_image_url(&lying, 1 << 10).unwrap(), PNG_HEAD);
    assert!(matches!(
        decode_image_url("https://example.invalid/a.png", 10),
        Err(Error::UnsupportedUrl(_))
    ));
    assert!(matches!(
        decode_image_url("data:image/png,%89PNG", 10),
        Err(Error::UnsupportedUrl(_))
    ));
    assert!(matches!(
        decode_image_url("data:image/png;base64", 10),
        Err(Error::UnsupportedUrl(_))
    ));
    let wav = base64::engine::general_purpose::STANDARD.encode(WAV_HEAD);
    assert!(matches!(
        decode_image_url(&format!("data:image/png;base64,{wav}"), 1 << 10),
        Err(Error::WrongModality {
            expected: Modality::Image,
            found: Modality::Audio
        })
    ));
    assert!(matches!(
        decode_ollama_image(&wav, 1 << 10),
        Err(Error::WrongModality { .. })
    ));
}

#[test]
fn input_audio() {
    let wav = base64::engine::general_purpose::STANDARD.encode(WAV_HEAD);
    assert_eq!(decode_input_audio(&wav, "wav", 1 << 10).unwrap(), WAV_HEAD);
    assert!(matches!(
        decode_input_audio(&wav, "mp3", 1 << 10),
        Err(Error::UnsupportedAudioFormat(_))
    ));
    let png = base64::engine::general_purpose::STANDARD.encode(PNG_HEAD);
    assert!(matches!(
        decode_input_audio(&png, "wav", 1 << 10),
        Err(Error::WrongModality { .. })
    ));
}

#[test]
fn capabilities() {
    let text_only = Capabilities::default();
    let err = text_only.require("qwen3:8b", Modality::Image).unwrap_err();
    assert_eq!(
        err.to_string(),
        "model \"qwen3:8b\" does not support image input"
    );
    let vision = Capabilities {
        vision: true,
        audio: false,
    };
    assert!(vision.require("m", Modality::Image).is_ok());
    assert!(matches!(
        vision.require("m", Modality::Audio),
        Err(Error::MissingCapability { .. })
    ));
}
