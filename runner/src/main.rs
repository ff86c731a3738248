//! `mlxkit`: a local model server speaking Ollama's and OpenAI's APIs, and its CLI.

/// On Linux jemalloc serves every allocation of the process: built unprefixed, it also replaces
/// `malloc` for MLX's C++, which allocates and frees a buffer for each of the ~800 graph nodes
/// of a decode step. Under glibc's allocator that churn (fast-bin consolidation, arena locks)
/// was ~6% of a batched step's samples, and `nn/examples/decode_step` steps ran 1.2-1.3x faster
/// with jemalloc preloaded, long prefills unchanged (bench/RESULTS.md). mimalloc was as fast
/// on decode steps but slowed a 1,024-token prefill by 10-20%.
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main` (its `malloc_conf`, a C string). `thp:always` asks
/// the kernel for 2 MiB pages under every mapping jemalloc makes (`madvise(MADV_HUGEPAGE)`);
/// a kernel set to `madvise`, as many are, gives them only to mappings that ask. A decode step
/// walks every weight and the whole KV history each token. In alternating pairs of `mlxkit
/// bench`, one stream decoded 5-18% faster on SmolLM2 and 10-16% on Gemma 3 270M, eight
/// streams 0-8% and 3-5%; a 1,024-token prefill took as long, and the peak RSS grew from 0.74
/// to 0.81 GB (bench/RESULTS.md). Where the time goes was not pinned down: huge pages under
/// the weights alone gave one stream only 3-9%, and the packed matvec's from-memory bench ran
/// no faster on them. A kernel without transparent huge pages ignores the option.
///
/// `narenas:1` and `background_thread:true` are for a server that unloads models (issue 52).
/// By default jemalloc makes four arenas per CPU and hands threads out among them; each arena
/// keeps its own metadata and part-filled pages, so every thread that ever allocated (tokio's,
/// the worker pool's, MLX's) left memory behind after an unload. Nearly every allocation of a
/// step comes from the one MLX worker thread, so one arena costs no contention: alternating
/// `mlxkit bench` runs on SmolLM2 decoded as fast (1 and 8 streams, within the machine's
/// noise). jemalloc also purges freed pages only when some thread allocates; its background
/// thread purges them while the server sits idle after an unload.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // jemalloc looks the options up by this exact, unmangled name
#[unsafe(no_mangle)]
pub static malloc_conf: &u8 = &b"thp:always,narenas:1,background_thread:true\0"[0];

fn main() -> std::process::ExitCode {
    runner::cli::main()
}
