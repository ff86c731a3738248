// RMS normalization on the CPU as one graph node (see norm.cc).
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mlxkit {

// `mx::fast::rms_norm`'s result for f32 `x` (and f32 `weight`) on the CPU, computed by one
// primitive; nothing when it does not apply (a GPU default device, another dtype), for the
// caller to use MLX's op.
std::optional<mlx::core::array> rms_norm(const mlx::core::array& x,
                                         const std::optional<mlx::core::array>& weight,
                                         float eps);

}  // namespace mlxkit
