//! What attention and recurrent layers remember between forwards, and the snapshots the prefix
//! cache and speculative decoding roll back to.
//!
//! Every layer slot holds a [`LayerCache`]: a full-attention [`KvCache`], a sliding-window
//! [`RotatingKvCache`] or a [`RecurrentCache`]. All share one contract: an offset, snapshots,
//! restore, rewind where the kind allows it, and *scheduled captures*: offsets registered
//! before a forward and recorded as its write crosses them, so prefill and speculative
//! verification get restore points without cutting the forward into pieces (recurrent layers
//! excepted: see [`RecurrentCache`]). Attention caches return a [`KvHistory`] from `update`:
//! the keys and values to attend to and a [`MaskApplier`] that merges the cache's storage
//! restrictions into the model's [`LogicalMask`] and keeps MLX's causal and no-mask fast paths
//! whenever they are exact.
//!
//! An attention cache may store keys and values in a form of its own ([`KvStorage`], set by
//! `set_storage`: f16 halves a long context's memory and reads, 8-bit codes take 1.25 bytes an
//! element); writes and restored snapshots are converted to it, and attention reads the history
//! back as floats.
//!
//! KV snapshots are lazy views of the live buffer, copied out only when a write would clobber
//! them; the other kinds snapshot whole states. [`LayerSnapshot`] implements the prefix trie's
//! [`prefix_trie::Snapshot`] (merge, split, bytes owned).
//!
//! ```
//! use kvcache::{KvCache, LogicalMask};
//! use mlx::{Array, Dtype};
//!
//! let mut cache = KvCache::new();
//! let kv = Array::ones(&[1, 2, 5, 8], Dtype::F32)?; // [batch, kv_heads, tokens, head_dim]
//! let history = cache.update(&kv, &kv)?;
//! assert_eq!(history.keys.shape(), vec![1, 2, 5, 8]);
//! let snapshot = cache.snapshot(0..5)?; // lazy: owns nothing
//! assert_eq!(snapshot.bytes(), 0);
//! let mask = history.mask.attention_mask(5, LogicalMask::Causal)?;
//! assert!(matches!(mask, kvcache::AttentionMaskOwned::Causal));
//! cache.rewind(3)?;
//! cache.update(&Array::zeros(&[1, 2, 1, 8], Dtype::F32)?, &Array::zeros(&[1, 2, 1, 8], Dtype::F32)?)?;
//! assert!(!snapshot.is_lazy()); // the write over slot 3 copied it out first
//! cache.restore(&snapshot)?;
//! assert_eq!(cache.offset(), 5);
//! # Ok::<(), kvcache::Error>(())
//! ```
//!
//! Files:
//! - `kv.rs`: [`KvCache`], the preallocated buffer grown in steps of [`GROWTH_STEP`].
//! - `kv_snapshot.rs`: [`KvSnapshot`] and the shared buffer lazy views index into.
//! - `rotating.rs`: [`RotatingKvCache`], its [`RotatingConfig`] and [`RotatingSnapshot`].
//! - `recurrent.rs`: [`RecurrentCache`], its [`RecurrentConfig`] and [`RecurrentSnapshot`].
//! - `layer.rs`: [`LayerCache`] and [`LayerSnapshot`], the contract over the three kinds.
//! - `rows.rs`: [`update_rows`], one layer's append for every row of a batch.
//! - `mask.rs`: [`KvHistory`], [`MaskApplier`], [`LogicalMask`], [`AttentionMaskOwned`].
//! - `schedule.rs`: scheduled captures.
//! - `storage.rs`: [`KvStorage`], the float and 8-bit forms keys and values are stored in.
//! - `tensor.rs`: array helpers, among them [`compact`].
//! - `error.rs`: [`Error`] and [`CacheKind`].

#![deny(missing_docs)]

mod error;
mod kv;
mod kv_snapshot;
mod layer;
mod mask;
mod recurrent;
mod rotating;
mod rows;
mod schedule;
mod storage;
mod tensor;

pub use error::{CacheKind, Error, Result};
pub use kv::{GROWTH_STEP, KvCache};
pub use kv_snapshot::KvSnapshot;
pub use layer::{LayerCache, LayerSnapshot};
pub use mask::{AttentionMaskOwned, KvHistory, LogicalMask, MaskApplier};
pub use recurrent::{RecurrentCache, RecurrentConfig, RecurrentSnapshot};
pub use rotating::{RotatingConfig, RotatingKvCache, RotatingSnapshot};
pub use rows::update_rows;
pub use storage::{KvStorage, Q8_GROUP};
pub use tensor::compact;
