// Routes MLX's single-row f32 matmuls to BLAS matrix-vector products.
//
// MLX's CPU backend sends every f32 matmul to `cblas_sgemm`. For one row (a decode step),
// OpenBLAS's sgemm still packs the whole weight matrix into a scratch buffer before
// multiplying: for a 135M-parameter model that copy of every weight, every token, was about a
// third of decode time (perf, issue 11). `sgemv` streams the weights once, unpacked.
//
// Built only when the build links OpenBLAS (`MLXKIT_GEMV_FORWARD`). This file defines
// `cblas_sgemm` itself; the build exports it from the final executable
// (`--export-dynamic-symbol`), so the dynamic linker binds libmlx's calls here first. Anything
// that is not a row-major single-row product goes on, unchanged, to the OpenBLAS linked by the
// build: a system one's `cblas_sgemm`, next in the lookup order, or PyPI's scipy-openblas32,
// whose symbols carry the `MLXKIT_BLAS_PREFIX` ("scipy_") so that it never clashes with a BLAS
// something else loads. Single-row products also run OpenBLAS on
// one thread (see `use_one_thread`); the next prefill-sized product gives the threads back.

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "blas_threads.h"
#include "rust/cxx.h"

namespace mlxkit {

bool blas_is_reference() {
#ifdef MLXKIT_BLAS_REFERENCE
  return true;
#else
  return false;
#endif
}

}  // namespace mlxkit

#ifdef MLXKIT_GEMV_FORWARD

namespace {

// The CBLAS enum values and 32-bit integer interface (Debian's OpenBLAS, MLX's wheel).
using blasint = int;
constexpr int kRowMajor = 101;
constexpr int kNoTrans = 111;
constexpr int kTrans = 112;

using SgemmFn = void (*)(int, int, int, blasint, blasint, blasint, float, const float*,
                         blasint, const float*, blasint, float, float*, blasint);
using SgemvFn = void (*)(int, int, blasint, blasint, float, const float*, blasint,
                         const float*, blasint, float, float*, blasint);
using SetThreadsFn = void (*)(int);
using GetThreadsFn = int (*)();

struct Blas {
  SgemmFn sgemm;
  SgemvFn sgemv;
  // OpenBLAS's thread controls; null with another BLAS.
  SetThreadsFn set_threads;
  GetThreadsFn get_threads;
};

using ConfigFn = const char* (*)();
using ThreadsCallbackFn = void (*)(int, mlxkit::BlasJob, int, std::size_t, void*, int);
using SetThreadsCallbackFn = void (*)(ThreadsCallbackFn);

// The linked OpenBLAS's symbol `name`. RTLD_NEXT: the unprefixed `cblas_sgemm` after this one.
void* openblas_symbol(const char* name) {
  return dlsym(RTLD_NEXT, (std::string(MLXKIT_BLAS_PREFIX) + name).c_str());
}

// Hands OpenBLAS's parallel jobs to threads of ours that sleep when idle (blas_threads.cc),
// unless `MLXKIT_BLAS_THREADS=openblas` asks for OpenBLAS's own; an OpenBLAS older than the
// callback (0.3.27) keeps its own.
void adopt_blas_threads() {
  const char* choice = std::getenv("MLXKIT_BLAS_THREADS");
  if (choice != nullptr && std::strcmp(choice, "openblas") == 0) {
    return;
  }
  auto set_callback = reinterpret_cast<SetThreadsCallbackFn>(
      openblas_symbol("openblas_set_threads_callback_function"));
  if (set_callback != nullptr) {
    set_callback(&mlxkit::run_blas_jobs);
  }
}

const Blas& next_blas() {
  // Resolved once, before the first product; a thread-safe static (MLX calls BLAS from its
  // stream threads).
  static const Blas blas = [] {
    adopt_blas_threads();
    return Blas{
        reinterpret_cast<SgemmFn>(openblas_symbol("cblas_sgemm")),
        reinterpret_cast<SgemvFn>(openblas_symbol("cblas_sgemv")),
        reinterpret_cast<SetThreadsFn>(openblas_symbol("openblas_set_num_threads")),
        reinterpret_cast<GetThreadsFn>(openblas_symbol("openblas_get_num_threads")),
    };
  }();
  return blas;
}

// Products with at least this many rows are prefill-sized: OpenBLAS gets its threads back.
constexpr blasint kThreadedRows = 16;

// OpenBLAS's thread count before single-row products lowered it to one; 0 while not lowered.
std::atomic<int> lowered_from{0};

// A matrix-vector product streams the weights once and is bound by memory bandwidth, which one
// core nearly saturates on the machines we measure; a second OpenBLAS thread only adds a
// hand-off per call and spins (sched_yield) between calls, taking the core MLX needs to build
// the next step's graph. Decode with one thread measured ~1.25x faster (smollm2:135m, issue 11).
// The count is switched at phase changes (decode <-> prefill), not per call.
void use_one_thread(const Blas& blas) {
  if (blas.set_threads == nullptr || blas.get_threads == nullptr ||
      lowered_from.load(std::memory_order_relaxed) != 0) {
    return;
  }
  int threads = blas.get_threads();
  if (threads > 1) {
    lowered_from.store(threads, std::memory_order_relaxed);
    blas.set_threads(1);
  }
}

void restore_threads(const Blas& blas) {
  int threads = lowered_from.exchange(0, std::memory_order_relaxed);
  if (threads > 1 && blas.set_threads != nullptr) {
    blas.set_threads(threads);
  }
}

}  // namespace

extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, blasint m, blasint n,
                            blasint k, float alpha, const float* a, blasint lda,
                            const float* b, blasint ldb, float beta, float* c, blasint ldc) {
  const Blas& blas = next_blas();
  bool plain = (trans_a == kNoTrans || trans_a == kTrans) &&
               (trans_b == kNoTrans || trans_b == kTrans);
  if (blas.sgemv != nullptr && order == kRowMajor && m == 1 && n > 0 && k > 0 && plain) {
    use_one_thread(blas);
    // Row i of op(A) is A itself (stride 1) or column 0 of a K x 1 matrix (stride lda).
    blasint inc_a = trans_a == kNoTrans ? 1 : lda;
    if (beta == 0.0f) {
      // C is fresh, uninitialized memory, and not every sgemv skips reading y when beta is 0
      // (0 * NaN is NaN): start from zeros.
      std::memset(c, 0, sizeof(float) * static_cast<size_t>(n));
    }
    if (trans_b == kTrans) {
      // B is stored N x K: c = B a.
      blas.sgemv(kRowMajor, kNoTrans, n, k, alpha, b, ldb, a, inc_a, beta, c, 1);
    } else {
      // B is stored K x N: c = Bᵀ a.
      blas.sgemv(kRowMajor, kTrans, k, n, alpha, b, ldb, a, inc_a, beta, c, 1);
    }
    return;
  }
  if (blas.sgemm == nullptr) {
    // No BLAS behind this one: returning would hand MLX an unwritten result.
    std::fputs("mlxkit: no cblas_sgemm to forward to\n", stderr);
    std::abort();
  }
  if (m >= kThreadedRows) {
    restore_threads(blas);
  }
  blas.sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

namespace mlxkit {

bool blas_gemv_forwarding() {
  const Blas& blas = next_blas();
  return blas.sgemm != nullptr && blas.sgemv != nullptr;
}

rust::String blas_name() {
  auto config = reinterpret_cast<ConfigFn>(openblas_symbol("openblas_get_config"));
  std::string name = MLXKIT_BLAS_NAME;
  if (config != nullptr) {
    name += " (";
    name += config();
    name += ")";
  }
  return rust::String(name);
}

}  // namespace mlxkit

#else

namespace mlxkit {

bool blas_gemv_forwarding() { return false; }

rust::String blas_name() { return rust::String(MLXKIT_BLAS_NAME); }

}  // namespace mlxkit

#endif
