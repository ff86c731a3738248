//! A KV cache through one speculative round: prefill, write three draft tokens, keep only the
//! one the target accepted (rewind), and carry on; a lazy snapshot taken before the round
//! survives it and later restores a fresh cache, as the prefix cache does for the next request.
//!
//! ```sh
//! cargo run --example speculative_rollback   # from kvcache
//! ```
//!
//! Every key and value written here holds its own position number, so what the cache returns
//! can be read back as the list of positions it holds.

use kvcache::{KvCache, LogicalMask};
use mlx::{Array, Dtype};

const HEADS: usize = 2;
const HEAD_DIM: usize = 4;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut cache = KvCache::new();

    // Prefill: six prompt positions in one write.
    let (k, v) = kv_for(0..6)?;
    let history = cache.update(&k, &v)?;
    // A single-row prefill attends causally; the cache lets MLX keep its fused causal path.
    let mask = history.mask.attention_mask(6, LogicalMask::Causal)?;
    println!(
        "prefill: offset {}, holds {:?}, mask {mask:?}",
        cache.offset(),
        positions(&history.keys)?
    );

    // What the prefix cache would keep: a lazy view of the live buffer, owning nothing yet.
    let prompt = cache.snapshot(0..6)?;
    println!(
        "snapshot 0..6: lazy {}, {} bytes",
        prompt.is_lazy(),
        prompt.bytes()
    );

    // A speculative round writes three drafted positions in one forward...
    let (k, v) = kv_for(6..9)?;
    cache.update(&k, &v)?;
    println!("after drafting 3 tokens: offset {}", cache.offset());
    // ...the target accepted one, so the cache goes back to just after it. Nothing is copied:
    // the slots above stay in the buffer and the next write overwrites them.
    cache.rewind(7)?;
    let (k, v) = kv_for(7..8)?;
    let history = cache.update(&k, &v)?;
    println!(
        "accepted 1, rewound to 7, wrote the target's own token: offset {}, holds {:?}",
        cache.offset(),
        positions(&history.keys)?
    );
    // The round never wrote below position 6, so the snapshot is still a free view.
    println!("snapshot 0..6 after the round: lazy {}", prompt.is_lazy());

    // Rewinding into the snapshot's range and writing there copies it out first, so it keeps
    // what it had.
    cache.rewind(4)?;
    let (k, v) = kv_for(40..41)?;
    cache.update(&k, &v)?;
    println!(
        "rewound to 4 and overwrote slot 4: snapshot lazy {}, owns {} bytes",
        prompt.is_lazy(),
        prompt.bytes()
    );

    // The next request with the same prompt starts from a fresh cache restored from it.
    let mut fresh = KvCache::new();
    fresh.restore(&prompt)?;
    let history = fresh.view()?.ok_or("the restored cache is empty")?;
    println!(
        "fresh cache restored from the snapshot: offset {}, holds {:?}",
        fresh.offset(),
        positions(&history.keys)?
    );
    Ok(())
}

/// Keys and values `[1, HEADS, n, HEAD_DIM]` whose every element is its token's position.
fn kv_for(positions: std::ops::Range<usize>) -> Result<(Array, Array), mlx::Error> {
    let n = positions.len();
    let mut data = Vec::with_capacity(HEADS * n * HEAD_DIM);
    for _ in 0..HEADS {
        for p in positions.clone() {
            data.extend([p as f32; HEAD_DIM]);
        }
    }
    let shape = [1, HEADS as i32, n as i32, HEAD_DIM as i32];
    let keys = Array::from_slice(&data, &shape)?;
    let values = keys.astype(Dtype::F32)?;
    Ok((keys, values))
}

/// The positions a history's keys hold (head 0, element 0 of each token).
fn positions(keys: &Array) -> Result<Vec<u32>, mlx::Error> {
    let tokens = keys.dim(2)? as usize;
    let data = keys.to_vec::<f32>()?;
    Ok((0..tokens).map(|t| data[t * HEAD_DIM] as u32).collect())
}
