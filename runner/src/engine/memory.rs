//! Memory the engine plans with: the device's size, what a sequence's KV costs, the budgets
//! admission and the prefix cache hold to, and when MLX's buffer pool is released.

/// MLX's buffer pool is released whenever a sequence's generated count crosses a multiple of
/// this many tokens (a multi-token round may step over it).
pub const CLEAR_CACHE_EVERY: usize = 256;

/// A prefill chunk at least this long releases the pool after it.
pub const LONG_PREFILL: usize = 256;

/// Releases MLX's buffer pool, and has the allocator return the pages it keeps after frees.
///
/// MLX frees its pooled buffers to `malloc`, which on Linux is jemalloc (see `main.rs`), and
/// jemalloc keeps freed pages for ten seconds before returning them, to reuse them. At the
/// points the pool is released (after a load, after a long prefill, every
/// [`CLEAR_CACHE_EVERY`] generated tokens) those pages are what the transients of that work
/// left behind, and nothing will reuse most of them soon. Elsewhere the system allocator's own
/// trimming applies.
pub fn release_pool() -> mlx::Result<()> {
    mlx::memory::clear_cache()?;
    return_freed_pages();
    Ok(())
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // jemalloc's controls are a C function taking raw pointers
fn return_freed_pages() {
    // `arena.<MALLCTL_ARENAS_ALL>.purge`: every arena's unused dirty pages go back at once.
    let name = c"arena.4096.purge";
    // SAFETY: the name is NUL-terminated, and this control takes no old or new value (null
    // pointers and a zero length, as jemalloc's manual gives for void controls). Its result
    // says only whether the control exists, which a return to the system does not depend on.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn return_freed_pages() {}

/// Whether going from `before` to `after` generated tokens crosses a multiple of
/// [`CLEAR_CACHE_EVERY`].
pub fn crosses_clear_point(before: usize, after: usize) -> bool {
    after / CLEAR_CACHE_EVERY > before / CLEAR_CACHE_EVERY
}

/// Bytes of memory the device has: physical memory on a CPU (and on unified-memory GPUs).
pub fn device_memory() -> usize {
    const FALLBACK: usize = 8 << 30;
    let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") else {
        return FALLBACK;
    };
    meminfo
        .lines()
        .find_map(|line| {
            let kib = line.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?;
            kib.trim().parse::<usize>().ok()?.checked_mul(1024)
        })
        .unwrap_or(FALLBACK)
}

/// The engine's memory settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    /// Bytes the prefix trie may keep between requests; `None`: sized by the model
    /// ([`default_cache_bytes`]).
    pub cache_bytes: Option<usize>,
    /// Bytes of KV the running sequences of every resident model may reserve together; a
    /// sequence that would exceed it waits (one sequence per model is always admitted).
    pub kv_bytes: usize,
}

impl MemoryBudget {
    /// Defaults from the device's memory: each model's prefix cache sized by the model, half
    /// the device for running sequences' KV. `MLXKIT_CACHE_BYTES` and `MLXKIT_KV_BYTES`
    /// override them.
    pub fn from_env() -> MemoryBudget {
        let device = device_memory();
        let read = |name: &str| -> Option<usize> { parse_bytes(&std::env::var(name).ok()?) };
        MemoryBudget {
            cache_bytes: read("MLXKIT_CACHE_BYTES"),
            kv_bytes: read("MLXKIT_KV_BYTES").unwrap_or(device / 2),
        }
    }
}

/// Tokens of its own keys and values a model's prefix cache keeps by default: two coding
/// agents' conversations (their first requests are 12k to 14k tokens), or many short chats.
pub const DEFAULT_CACHE_TOKENS: usize = 32_768;

/// A model's default prefix-cache budget: [`DEFAULT_CACHE_TOKENS`] of its KV, which
/// `state_bytes` gives for a token count, and at most a quarter of the device's memory and
/// 8 GiB. The cache is worth what it saves re-evaluating, which is counted in tokens, so its
/// budget is too: a fixed share of memory gave a 98 MB model a 6 GB cache, beside which
/// several resident models could not fit.
pub fn default_cache_bytes(state_bytes: impl Fn(usize) -> usize) -> usize {
    state_bytes(DEFAULT_CACHE_TOKENS).min((device_memory() / 4).min(8 << 30))
}

/// Parses a byte count: a plain number, or one with a `K`, `M`, `G` (powers of 1024) suffix,
/// optionally followed by `B` or `iB`.
pub fn parse_bytes(text: &str) -> Option<usize> {
    let text = text.trim();
    let upper = text.to_ascii_uppercase();
    let body = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (number, shift) = match body.chars().last()? {
        'K' => (&body[..body.len() - 1], 10),
        'M' => (&body[..body.len() - 1], 20),
        'G' => (&body[..body.len() - 1], 30),
        'T' => (&body[..body.len() - 1], 40),
        _ => (body, 0),
    };
    let value: f64 = number.trim().parse().ok()?;
    if !value.is_finite() || value < 0.0 {
        return None;
    }
    let bytes = value * (1u64 << shift) as f64;
    (bytes < usize::MAX as f64).then_some(bytes as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_parse() {
        assert_eq!(parse_bytes("1024"), Some(1024));
        assert_eq!(parse_bytes("4M"), Some(4 << 20));
        assert_eq!(parse_bytes("2GiB"), Some(2 << 30));
        assert_eq!(parse_bytes("1.5kb"), Some(1536));
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(parse_bytes("-1G"), None);
        assert_eq!(parse_bytes(""), None);
    }

    #[test]
    fn a_models_cache_holds_its_own_tokens_up_to_the_cap() {
        // 46 KB a token: SmolLM2 135M's f32 keys and values.
        let per_token = 30 * 2 * 3 * 64 * 4;
        assert_eq!(
            default_cache_bytes(|tokens| tokens * per_token),
            DEFAULT_CACHE_TOKENS * per_token,
            "1.5 GB, not a quarter of memory"
        );
        let cap = (device_memory() / 4).min(8 << 30);
        assert_eq!(default_cache_bytes(|tokens| tokens << 20), cap);
    }

    #[test]
    fn clear_points() {
        assert!(!crosses_clear_point(0, 255));
        assert!(crosses_clear_point(255, 256));
        assert!(
            crosses_clear_point(250, 260),
            "a multi-token round steps over it"
        );
        assert!(!crosses_clear_point(256, 300));
    }
}
