// Products of k-block matrices with their activations rounded to signed bytes (see
// kblocks_int8.cc).
#pragma once

#include <cstdint>

namespace mlxkit {

// `y = x wᵀ` for `w` in k-block form (kblocks_layout.h) of GGML type `type`, `[out, in]`, and
// `x` f32 `[rows, in]` rounded to signed bytes per 256 columns first; `y` f32 `[rows, out]`.
// `out` a multiple of 8 and `in` of 256, as every k-block matrix is.
void k_blocks_matmul_int8(int type, const float* x, int rows, int64_t in, const uint8_t* w,
                          int64_t out, float* y);

}  // namespace mlxkit
