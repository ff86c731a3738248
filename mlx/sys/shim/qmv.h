// The CPU matrix-vector product over packed affine weights (see qmv.cc).
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mlxkit {

// Whether the packed kernel handles weights of this group size and bit width.
bool packed_matvec_supports(int group, int bits);

// The most rows of `x` the packed kernel takes.
int packed_matvec_max_rows();

// `x wᵀ` through the packed kernel, or nothing when it does not apply: a GPU default device,
// more than a few rows in `x`, dtypes other than f32 activations/scales/biases, or a layout
// the kernel does not read. The caller then uses MLX's own quantized matmul.
std::optional<mlx::core::array> packed_matvec(const mlx::core::array& x,
                                              const mlx::core::array& w,
                                              const mlx::core::array& scales,
                                              const std::optional<mlx::core::array>& biases,
                                              int group, int bits);

}  // namespace mlxkit
