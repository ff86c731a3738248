// Routes MLX's single-row f32 matmuls to BLAS matrix-vector products.
//
// MLX's CPU backend sends every f32 matmul to `cblas_sgemm`. For one row (a decode step),
// OpenBLAS's sgemm still packs the whole weight matrix into a scratch buffer before
// multiplying: for a 135M-parameter model that copy of every weight, every token, was about a
// third of decode time (perf, issue 11). `sgemv` streams the weights once, unpacked.
//
// Built only when the build links OpenBLAS (`MLXKIT_GEMV_FORWARD`). This file defines `cblas_sgemm` itself; the build exports it from the final executable
// (`--export-dynamic-symbol`), so the dynamic linker binds libmlx's calls here first. Anything
// that is not a row-major single-row product goes on, unchanged, to the next `cblas_sgemm` in
// the lookup order (OpenBLAS, linked by the build).

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

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

struct Blas {
  SgemmFn sgemm;
  SgemvFn sgemv;
};

const Blas& next_blas() {
  // Resolved once; a thread-safe static (MLX calls BLAS from its stream threads).
  static const Blas blas = {
      reinterpret_cast<SgemmFn>(dlsym(RTLD_NEXT, "cblas_sgemm")),
      reinterpret_cast<SgemvFn>(dlsym(RTLD_NEXT, "cblas_sgemv")),
  };
  return blas;
}

}  // namespace

extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, blasint m, blasint n,
                            blasint k, float alpha, const float* a, blasint lda,
                            const float* b, blasint ldb, float beta, float* c, blasint ldc) {
  const Blas& blas = next_blas();
  bool plain = (trans_a == kNoTrans || trans_a == kTrans) &&
               (trans_b == kNoTrans || trans_b == kTrans);
  if (blas.sgemv != nullptr && order == kRowMajor && m == 1 && n > 0 && k > 0 && plain) {
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
  blas.sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

namespace mlxkit {

bool blas_gemv_forwarding() {
  const Blas& blas = next_blas();
  return blas.sgemm != nullptr && blas.sgemv != nullptr;
}

}  // namespace mlxkit

#else

namespace mlxkit {

bool blas_gemv_forwarding() { return false; }

}  // namespace mlxkit

#endif
