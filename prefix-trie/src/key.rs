//! Trie keys: token ids, media content hashes, and token pairs for look-ahead drafters.
//!
//! A key is 64 bits. An unpaired key is a token id (below 2^31) or a media key (a content
//! hash folded to 31 bits with bit 31 set), so a media item can never alias a token id. Each
//! position of a media item folds its own mix of the hash ([`Key::media_position`]): matching a
//! whole item then compares up to 64 bits of its hash, not 31. With
//! [`Lookahead::NextToken`] the key at offset `i` packs the unpaired keys of positions `i` and
//! `i + 1` into the high and low halves: matching `k` keys then verifies `k + 1` tokens, so
//! every match is a valid restore point for a drafter whose cache pairs slot `i` with the token
//! after it.

use std::fmt;

/// One trie key. Build with [`Key::token`], [`Key::media`] and [`Key::pair`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(u64);

/// The bit no token id has; set on every media key.
const MEDIA_BIT: u64 = 1 << 31;
const LOW_HALF: u64 = u32::MAX as u64;

impl Key {
    /// The key of a token id, or `None` when the id reaches into the media bit (>= 2^31).
    pub fn token(id: u32) -> Option<Key> {
        (u64::from(id) < MEDIA_BIT).then_some(Key(u64::from(id)))
    }

    /// The key of every position of a media item with this content hash.
    pub fn media(content_hash: u64) -> Key {
        // Fold all 64 bits into 31 so hashes differing only in high bits still differ.
        let folded = (content_hash ^ (content_hash >> 31) ^ (content_hash >> 62)) & (MEDIA_BIT - 1);
        Key(folded | MEDIA_BIT)
    }

    /// The key of position `within` (counted from the item's first token) of a media item
    /// with this content hash: the hash mixed with the position (SplitMix64's finalizer, a
    /// bijection of 64 bits), so an item's keys together carry the whole hash.
    pub fn media_position(content_hash: u64, within: usize) -> Key {
        let mut z = content_hash.wrapping_add((within as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Key::media(z ^ (z >> 31))
    }

    /// The look-ahead key packing this unpaired key with the next position's.
    pub fn pair(self, next: Key) -> Key {
        Key(((self.0 & LOW_HALF) << 32) | (next.0 & LOW_HALF))
    }

    /// The raw 64-bit value.
    pub fn raw(self) -> u64 {
        self.0
    }

    /// Rebuilds a key from [`Key::raw`].
    pub fn from_raw(raw: u64) -> Key {
        Key(raw)
    }

    /// Writes the key for humans; `paired` says whether it packs two positions.
    pub(crate) fn write(self, paired: bool, out: &mut impl fmt::Write) -> fmt::Result {
        if paired {
            write_unpaired(self.0 >> 32, out)?;
            out.write_char(':')?;
            write_unpaired(self.0 & LOW_HALF, out)
        } else {
            write_unpaired(self.0, out)
        }
    }
}

fn write_unpaired(raw: u64, out: &mut impl fmt::Write) -> fmt::Result {
    if raw & MEDIA_BIT != 0 {
        write!(out, "m{:08x}", raw & (MEDIA_BIT - 1))
    } else {
        write!(out, "{raw}")
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:#x})", self.0)
    }
}

/// Whether keys pair each position with the next one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Lookahead {
    /// Key `i` is position `i` alone.
    #[default]
    None,
    /// Key `i` packs positions `i` and `i + 1` (a drafter with its own KV cache).
    NextToken,
}

impl Lookahead {
    /// How many positions past its own each key names.
    pub fn tokens(self) -> usize {
        match self {
            Lookahead::None => 0,
            Lookahead::NextToken => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_stay_below_the_media_bit() {
        assert_eq!(Key::token(0).map(Key::raw), Some(0));
        assert_eq!(Key::token((1 << 31) - 1).map(Key::raw), Some((1 << 31) - 1));
        assert_eq!(Key::token(1 << 31), None);
    }

    #[test]
    fn media_keys_never_alias_tokens() {
        for hash in [0, 1, u64::MAX, 0x8000_0000, 0x7fff_ffff, 1 << 63] {
            let key = Key::media(hash);
            assert!(key.raw() & MEDIA_BIT != 0);
            assert!(key.raw() <= LOW_HALF);
        }
        assert_ne!(Key::media(1), Key::media(1 << 40));
    }

    #[test]
    fn media_positions_differ_and_stay_media() {
        let keys: Vec<Key> = (0..8).map(|i| Key::media_position(7, i)).collect();
        for (i, a) in keys.iter().enumerate() {
            assert!(a.raw() & MEDIA_BIT != 0 && a.raw() <= LOW_HALF);
            assert!(keys[i + 1..].iter().all(|b| b != a), "{keys:?}");
        }
        assert_ne!(Key::media_position(7, 0), Key::media_position(8, 0));
    }

    #[test]
    fn pairs_keep_both_halves() {
        let a = Key::token(7).unwrap();
        let b = Key::media(99);
        let pair = a.pair(b);
        assert_eq!(pair.raw() >> 32, 7);
        assert_eq!(pair.raw() & LOW_HALF, b.raw());
        assert_ne!(a.pair(b), b.pair(a));
        let mut text = String::new();
        pair.write(true, &mut text).unwrap();
        assert!(text.starts_with("7:m"), "{text}");
    }
}
