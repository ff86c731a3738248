// GGUF k-quant matrices kept in their own blocks on a CPU, and their products (see kblocks.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "mlx/mlx.h"

namespace mlxkit {

// The k-quant types this form takes, by their GGML type ids.
enum class KBlockType : int { Q4K = 12, Q6K = 14 };

// Whether a `[out, in]` matrix of GGML type `type` can take the k-block form here: a type
// above, `out` a multiple of 8 and `in` of 256, and the packed CPU kernels running (not on
// the GPU path, nor on a CPU without the x86 kernels; there MLX's own layout stays).
bool k_blocks_supported(int type, int64_t out, int64_t in);

// The k-block form of a matrix in MLX's affine layout (f32 scales and biases), when its values
// are a k-quant's: 4-bit groups of 32 whose scales and biases factor per 256 columns as Q4_K's
// (`d · sc`, `−dmin · m`), or 8-bit groups of 16 as the loader widens Q6_K to (`d · sc`, bias
// `−32 · scale`). Every scale and bias must factor exactly, so the form holds the same values;
// otherwise, or for another layout, nothing. Sets `type` to the form's GGML type. Evaluates
// the inputs.
std::optional<mlx::core::array> k_blocks_repack(const mlx::core::array& w,
                                                     const mlx::core::array& scales,
                                                     const mlx::core::array& biases, int group,
                                                     int bits, int& type);

// `x wᵀ` for `w` in k-block form: `x` f32 `[..., in]`, the result f32 `[..., out]`. With
// `int8_activations`, each row of `x` is first rounded to signed bytes per 256 columns
// (kblocks_int8.cc): faster, and no longer the f32 product.
mlx::core::array k_blocks_product(const mlx::core::array& x, const mlx::core::array& w, int type,
                                 int64_t out, int64_t in, bool int8_activations);

// Rows `ids` (integers, any shape) of `w` dequantized: f32 `[ids..., in]`. For a token table.
mlx::core::array k_blocks_lookup(const mlx::core::array& w, const mlx::core::array& ids, int type,
                               int64_t out, int64_t in);

}  // namespace mlxkit
