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

fn main() -> std::process::ExitCode {
    runner::cli::main()
}
