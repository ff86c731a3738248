// Rotary position embedding on the CPU as one graph node (see rope.cc).
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mlxkit {

// `mx::fast::rope`'s result for f32 `x` on the CPU, computed by one primitive; nothing when it
// does not apply (a GPU default device, another dtype), for the caller to use MLX's op.
// `offset` is an int32 scalar or one position per row of axis 0; `freqs`, when given, holds the
// `dims / 2` periods (MLX's convention: their reciprocals are the inverse frequencies).
std::optional<mlx::core::array> rope(const mlx::core::array& x, int dims, bool traditional,
                                     std::optional<float> base, float scale,
                                     const mlx::core::array& offset,
                                     const std::optional<mlx::core::array>& freqs);

}  // namespace mlxkit
