//! Content identity for the prefix cache: the same bytes preprocessed the same way get the same
//! id, so a cached prefix containing the item can be reused; anything else gets another id.

use sha2::{Digest, Sha256};

use crate::error::Modality;

/// SHA-256 over a domain tag, the modality, the bytes and the preprocessing shape.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MediaId([u8; 32]);

impl MediaId {
    /// Identifies `bytes` as preprocessed into `shape` (for instance
    /// [`ImageProcessorConfig::shape_key`](crate::ImageProcessorConfig::shape_key), or
    /// `[sample_rate, chunk]` for audio).
    ///
    /// Lengths are hashed before contents so no two (bytes, shape) pairs share an encoding.
    pub fn new(modality: Modality, bytes: &[u8], shape: &[u64]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"mlxkit.media.v1\0");
        hasher.update([match modality {
            Modality::Image => 1u8,
            Modality::Audio => 2u8,
        }]);
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
        hasher.update((shape.len() as u64).to_le_bytes());
        for dim in shape {
            hasher.update(dim.to_le_bytes());
        }
        MediaId(hasher.finalize().into())
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex of the digest.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A 32-bit key with the top bit set, for caches keyed by token ids: vocabularies stay
    /// below 2^31, so a media key never equals a token.
    pub fn token_key(&self) -> u32 {
        u32::from_le_bytes([self.0[0], self.0[1], self.0[2], self.0[3]]) | 0x8000_0000
    }
}

impl std::fmt::Debug for MediaId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MediaId({})", &self.to_hex()[..16])
    }
}

impl std::fmt::Display for MediaId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}
