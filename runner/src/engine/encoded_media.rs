//! `EncodedMedia`: the vision and audio encoders' outputs kept by content, so an image or clip
//! a conversation sends again is not encoded again when its prefix is not cached (a new place
//! in the prompt, a prefix evicted, a different conversation). Audio segments' `MediaId`s are
//! of another modality, so they never collide with images'.
//!
//! Least recently used entries go first once the byte budget is exceeded; the newest entry
//! always stays, whatever its size, so a request never encodes its own image twice.
//!
//! Which ids are kept is mirrored in [`EncodedIds`], which request handlers read (through
//! [`ModelInfo`](crate::engine::ModelInfo)) to leave an image undecoded when its features are
//! already here.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use media::MediaId;
use mlx::Array;

/// The default budget: 64 MiB, about 24 of Gemma 3 27B's images (256 tokens of 5,376 f32
/// features is 5.5 MB each) and thousands of a small model's.
pub const DEFAULT_BUDGET: usize = 64 << 20;

/// Encoded images and audio segments by content identity, under a byte budget.
pub struct EncodedMedia {
    /// Oldest use first.
    entries: VecDeque<(MediaId, Array)>,
    bytes: usize,
    budget: usize,
    /// The ids of `entries`, for other threads.
    ids: Arc<EncodedIds>,
}

/// The ids an [`EncodedMedia`] keeps, readable from any thread. A hit is a hint: the entry may
/// be dropped before the request that saw it reaches the engine.
#[derive(Debug, Default)]
pub struct EncodedIds(Mutex<HashSet<MediaId>>);

impl EncodedIds {
    /// Whether `id`'s features were kept when asked.
    pub fn contains(&self, id: &MediaId) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(id)
    }

    fn set(&self, id: MediaId, kept: bool) {
        let mut ids = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if kept {
            ids.insert(id);
        } else {
            ids.remove(&id);
        }
    }
}

impl EncodedMedia {
    /// An empty cache holding at most `budget` bytes of features (and always the latest).
    pub fn new(budget: usize) -> EncodedMedia {
        EncodedMedia {
            entries: VecDeque::new(),
            bytes: 0,
            budget,
            ids: Arc::default(),
        }
    }

    /// The ids kept, as other threads see them.
    pub fn ids(&self) -> Arc<EncodedIds> {
        self.ids.clone()
    }

    /// The features of `id`, when kept; a hit makes it the most recently used.
    pub fn get(&mut self, id: &MediaId) -> Option<Array> {
        let at = self.entries.iter().position(|(kept, _)| kept == id)?;
        let entry = self.entries.remove(at)?;
        let features = entry.1.clone();
        self.entries.push_back(entry);
        Some(features)
    }

    /// Keeps `features` (evaluated) as `id`'s, dropping the least recently used entries that no
    /// longer fit.
    pub fn insert(&mut self, id: MediaId, features: Array) {
        if let Some(at) = self.entries.iter().position(|(kept, _)| *kept == id)
            && let Some((_, old)) = self.entries.remove(at)
        {
            self.bytes = self.bytes.saturating_sub(old.nbytes());
        }
        self.bytes = self.bytes.saturating_add(features.nbytes());
        self.entries.push_back((id, features));
        self.ids.set(id, true);
        while self.bytes > self.budget && self.entries.len() > 1 {
            if let Some((dropped, old)) = self.entries.pop_front() {
                self.bytes = self.bytes.saturating_sub(old.nbytes());
                self.ids.set(dropped, false);
            }
        }
    }

    /// Entries kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use media::Modality;

    fn id(n: u8) -> MediaId {
        MediaId::new(Modality::Image, &[n], &[])
    }

    fn features() -> Array {
        // 4 f32 values: 16 bytes.
        Array::from_slice(&[0f32; 4], &[1, 4]).unwrap()
    }

    #[test]
    fn least_recently_used_go_first_and_the_newest_stays() {
        let mut cache = EncodedMedia::new(32);
        cache.insert(id(1), features());
        cache.insert(id(2), features());
        assert!(cache.get(&id(1)).is_some()); // 2 is now the oldest.
        cache.insert(id(3), features());
        assert_eq!(cache.len(), 2);
        assert!(cache.get(&id(2)).is_none());
        assert!(cache.get(&id(1)).is_some() && cache.get(&id(3)).is_some());
        assert_eq!(cache.bytes(), 32);
        // Other threads see the same ids.
        let ids = cache.ids();
        assert!(ids.contains(&id(1)) && ids.contains(&id(3)) && !ids.contains(&id(2)));
        // Over budget alone: kept anyway, everything else goes.
        let mut small = EncodedMedia::new(8);
        small.insert(id(1), features());
        small.insert(id(2), features());
        assert_eq!(small.len(), 1);
        assert!(small.get(&id(2)).is_some());
        // The same id again replaces, not duplicates.
        small.insert(id(2), features());
        assert_eq!((small.len(), small.bytes()), (1, 16));
    }
}
